"""Transformer language models for the hybrid-parallel iteration: their published shapes, parameters and FLOPs.

Pure. This module owns the named models (:data:`MODELS`), how many parameters
a model has where (per layer, sharded across tensor parallelism or
replicated, embeddings), the FLOPs of one token through each part, and the
accelerators (:data:`ACCELERATORS`) the compute time comes from.
:mod:`emulator.model.workloads.llm` turns them into an iteration.

The models (each with its source and the parameter count the source gives)
    ``gpt3-13b``: GPT-3 13B, Brown et al. 2020, "Language Models are Few-Shot
    Learners", Table 2.1: 40 layers, 40 heads of 128, 13.0B parameters, a
    context of 2048 tokens (section 2.1), the GPT-2 tokenizer's 50257 tokens;
    feed-forward 4 x d_model, learned position embeddings, LayerNorm, biases,
    embeddings tied to the output layer (GPT-2's architecture, which GPT-3
    keeps). Table 2.1 prints d_model 5140, which is not 40 x 128 and does not
    split over 40 heads; Megatron-LM needs ``hidden % heads == 0``, and the
    public 13B training configurations (NeMo's ``gpt3/13b``) use 5120, so
    this table does: 12.85B parameters, 1.2% under the paper's 13.0B.
    ``llama2-7b``: Llama 2 7B, Touvron et al. 2023, "Llama 2: Open Foundation
    and Fine-Tuned Chat Models", Table 1 (7B, context 4k), with the shapes of
    its Hugging Face ``config.json`` (meta-llama/Llama-2-7b-hf): hidden 4096,
    intermediate 11008 (SwiGLU), 32 layers, 32 heads (no grouped-query
    attention at 7B), vocabulary 32000, RMSNorm, rotary positions, untied
    output layer, no biases: 6,738,415,616 parameters (the "7B").
    ``mixtral-8x7b``: Jiang et al. 2024, "Mixtral of Experts", Table 1: 32
    layers, dim 4096, 32 heads of 128, 8 key-value heads, hidden 14336
    (SwiGLU), 8 experts, top-2 routing, vocabulary 32000; every layer's
    feed-forward is a mixture of experts (Megatron's ``--moe-layer-freq 1``);
    46.7B parameters (46,702,792,704). Its sequence length is the 4096 of
    Megatron-LM's ``examples/mixtral/train_mixtral_8x7b_distributed.sh``
    (the model's 32k context is its position limit, not a training length).

Megatron-LM pads the vocabulary to a multiple of ``128 x tensor-parallel
size`` (``--make-vocab-size-divisible-by 128``,
``megatron/core/tokenizers/utils/build_tokenizer.py`` ``vocab_size_with_padding``):
:meth:`TransformerModel.padded_vocab`. Parameter counts use the real
vocabulary; the embedding shards, their gradients and the logits' FLOPs the
padded one.

FLOPs (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", section 5.1): a matrix multiply of an
``m x n`` by an ``n x k`` matrix is ``2mnk`` FLOPs, so a token through a
weight matrix of ``N`` elements is ``2N`` forward; attention adds ``QK^T``
and the attention-weighted values, ``2 x 2 x s x h_q`` per token (no
discount for the causal mask, as in that paper: for GPT-3 the formula gives
its ``24 b s h^2 + 4 b s^2 h`` per layer); the logits ``2 h V``; a backward
pass is twice its forward (the input gradient and the weight gradient). A
mixture-of-experts layer's feed-forward FLOPs are ``top_k`` experts' and the
router's. Norms, activations, softmax, dropout and the loss are left out (well
under 1%). No activation recomputation is modelled (Megatron's default).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.base.errors import FieldError
from emulator.model.workloads.training import Accelerator

WHERE = "schedule gen"
#: Megatron-LM's ``--make-vocab-size-divisible-by`` default.
VOCAB_DIVISOR = 128


@dataclass(frozen=True)
class TransformerModel:
    """A decoder-only transformer's shapes and where they come from.

    ``ffn`` is the feed-forward width (of every expert, in a mixture of
    experts); ``gated``: SwiGLU's three matrices instead of two; ``experts``
    0 for a dense model, else the experts of every ``moe_layer_freq``-th layer
    (Megatron's pattern: layer ``i`` is a mixture of experts iff ``i %
    moe_layer_freq == 0``), ``top_k`` of them per token.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    seq_length: int
    vocab: int
    source: str
    cited_parameters: float
    kv_heads: int = 0
    gated: bool = False
    biases: bool = False
    layernorm: bool = False
    learned_positions: bool = False
    tied_embeddings: bool = False
    experts: int = 0
    top_k: int = 0
    moe_layer_freq: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def query_groups(self) -> int:
        """Key-value heads (the heads themselves without grouped-query attention)."""
        return self.kv_heads or self.heads

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.query_groups * self.head_dim

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) has a mixture of experts for its feed-forward."""
        return self.experts > 0 and layer % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.layers) if self.is_moe(i))

    def padded_vocab(self, tp: int) -> int:
        """The vocabulary Megatron-LM allocates with ``tp``-way tensor parallelism."""
        multiple = VOCAB_DIVISOR * tp
        return -(-self.vocab // multiple) * multiple

    # ------------------------------------------------------------ parameters
    @property
    def attention_sharded(self) -> int:
        """Attention's weights split over tensor parallelism: Q, K, V (column-parallel, with their biases) and the
        output projection (row-parallel)."""
        qkv = self.hidden * (self.q_width + 2 * self.kv_width)
        bias = (self.q_width + 2 * self.kv_width) if self.biases else 0
        return qkv + bias + self.q_width * self.hidden

    @property
    def mlp_sharded(self) -> int:
        """One feed-forward's (one expert's) weights split over tensor parallelism, with the first one's bias."""
        up = (2 if self.gated else 1) * self.ffn
        return self.hidden * up + up * (1 if self.biases else 0) + self.ffn * self.hidden

    def layer_replicated(self, layer: int) -> int:
        """A layer's parameters every tensor-parallel rank holds whole: two norms, the row-parallel layers' biases
        and a mixture of experts' router."""
        norms = 2 * (2 if self.layernorm else 1) * self.hidden
        biases = 2 * self.hidden if self.biases else 0
        router = self.hidden * self.experts if self.is_moe(layer) else 0
        return norms + biases + router

    def layer_expert(self, layer: int) -> int:
        """A layer's expert parameters (all experts; 0 for a dense layer)."""
        return self.experts * self.mlp_sharded if self.is_moe(layer) else 0

    def layer_dense_sharded(self, layer: int) -> int:
        """A layer's non-expert parameters split over tensor parallelism."""
        return self.attention_sharded + (0 if self.is_moe(layer) else self.mlp_sharded)

    def layer_params(self, layer: int) -> int:
        return self.layer_dense_sharded(layer) + self.layer_replicated(layer) + self.layer_expert(layer)

    def embedding_params(self, vocab: int) -> int:
        """Input embeddings, the final norm and the output layer (once when tied)."""
        positions = self.seq_length * self.hidden if self.learned_positions else 0
        final_norm = (2 if self.layernorm else 1) * self.hidden
        output = 0 if self.tied_embeddings else vocab * self.hidden
        return vocab * self.hidden + positions + final_norm + output

    @property
    def parameters(self) -> int:
        """Every parameter, with the real vocabulary (what the sources count)."""
        return sum(self.layer_params(i) for i in range(self.layers)) + self.embedding_params(self.vocab)

    # ------------------------------------------------------------ FLOPs per token, forward
    @property
    def attention_flops(self) -> float:
        """One token through one layer's attention, forward: its weights and ``QK^T`` and the values."""
        return 2.0 * self.attention_sharded + 4.0 * self.seq_length * self.q_width

    def mlp_flops(self, layer: int) -> float:
        """One token through one layer's feed-forward, forward: ``top_k`` experts and the router in a mixture."""
        if self.is_moe(layer):
            return 2.0 * (self.top_k * self.mlp_sharded + self.hidden * self.experts)
        return 2.0 * self.mlp_sharded

    def logit_flops(self, vocab: int) -> float:
        return 2.0 * self.hidden * vocab


def gpt3_13b() -> TransformerModel:
    return TransformerModel(
        "gpt3-13b", layers=40, hidden=5120, heads=40, ffn=4 * 5120, seq_length=2048, vocab=50257,
        source="Brown et al. 2020, Language Models are Few-Shot Learners (arXiv:2005.14165), Table 2.1: GPT-3 "
               "13B, 40 layers, 40 heads of 128, n_ctx 2048, 13.0B parameters (d_model printed as 5140; 5120 = 40 x "
               "128 as Megatron-LM needs and NeMo's 13B configuration uses); GPT-2 tokenizer (50257)",
        cited_parameters=13.0e9, biases=True, layernorm=True, learned_positions=True, tied_embeddings=True)


def llama2_7b() -> TransformerModel:
    return TransformerModel(
        "llama2-7b", layers=32, hidden=4096, heads=32, ffn=11008, seq_length=4096, vocab=32000,
        source="Touvron et al. 2023, Llama 2: Open Foundation and Fine-Tuned Chat Models (arXiv:2307.09288), "
               "Table 1 (7B, context 4k); shapes from meta-llama/Llama-2-7b-hf config.json (hidden 4096, "
               "intermediate 11008, 32 layers, 32 heads, 32 key-value heads, vocab 32000, untied lm_head)",
        cited_parameters=6_738_415_616, gated=True)


def mixtral_8x7b() -> TransformerModel:
    return TransformerModel(
        "mixtral-8x7b", layers=32, hidden=4096, heads=32, ffn=14336, seq_length=4096, vocab=32000,
        source="Jiang et al. 2024, Mixtral of Experts (arXiv:2401.04088), Table 1: 32 layers, dim 4096, 32 heads "
               "of 128, 8 kv heads, hidden 14336, 8 experts, top-2, vocab 32000, 46.7B parameters; sequence 4096 "
               "as Megatron-LM's examples/mixtral/train_mixtral_8x7b_distributed.sh",
        cited_parameters=46.7e9, kv_heads=8, gated=True, experts=8, top_k=2)


#: The named models (``emu schedule gen --model``).
MODELS: dict[str, TransformerModel] = {m.name: m for m in (gpt3_13b(), llama2_7b(), mixtral_8x7b())}


def model(name: str, where: str = WHERE) -> TransformerModel:
    """The model ``name``; :class:`FieldError` naming ``model`` for an unknown one."""
    if name not in MODELS:
        raise FieldError(where, "model", f"one of {', '.join(MODELS)}", name)
    return MODELS[name]


# ---------------------------------------------------------------------------
# Accelerators
# ---------------------------------------------------------------------------

#: Narayanan et al. 2021 (arXiv:2104.04473), abstract: a 1-trillion-parameter GPT trained "at 502 petaFLOP/s on
#: 3072 GPUs (per-GPU throughput of 52% of theoretical peak)", A100 80GB in bf16 (peak 312 TFLOP/s): 163 TFLOP/s
#: per GPU, counted with the paper's FLOPs formula (the one this module uses). Smaller models reach less (the
#: paper's Table 1 starts at 44% of peak).
A100 = Accelerator(
    "A100 bf16 (Megatron-LM, 52% of peak)", 502e15 / 3072,
    "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM "
    "(arXiv:2104.04473), abstract: 502 petaFLOP/s on 3072 A100 GPUs, 52% of the 312 TFLOP/s bf16 peak")
#: Megatron-LM's README (Performance Benchmarking): 41% model FLOP utilisation for the smallest model of its H100
#: weak-scaling runs (47% for the largest), of the H100 SXM's 989 TFLOP/s dense bf16 peak (NVIDIA H100 datasheet).
H100 = Accelerator(
    "H100 SXM bf16 (Megatron-LM, 41% MFU)", 0.41 * 989e12,
    "NVIDIA/Megatron-LM README, Performance Benchmarking: MFU 41% (smallest model) to 47% on H100; H100 SXM "
    "dense bf16 peak 989 TFLOP/s (NVIDIA H100 Tensor Core GPU datasheet)")
ACCELERATORS: dict[str, Accelerator] = {"a100": A100, "h100": H100}
