"""One hybrid-parallel training iteration of a transformer language model as Megatron-LM runs it, as a schedule.

Pure. This module owns the configuration (:class:`LlmConfig`), what one
iteration computes and communicates per rank (:func:`stage_passes`,
:func:`one_f_one_b`, :func:`dp_work`), and the composed schedule
(:func:`iteration`, :func:`gen`). The models and accelerators are
:mod:`emulator.model.workloads.llm_models`'s; the rank order, process groups
and hosts :mod:`emulator.model.workloads.llm_placement`'s.

Parallelism: ``T``-way tensor (TP), ``P``-way pipeline (PP), ``D``-way data
(DP) parallel, ``T·P·D`` ranks, one per host; ``E``-way expert parallelism
(EP) splits each data-parallel group into groups of ``E`` (Megatron-Core's
expert rank generator), ``E`` dividing ``D`` and the experts. Each stage
holds ``L/P`` consecutive layers; ``m`` microbatches of ``b`` sequences of
``s`` tokens per iteration (the global batch is ``b·m·D`` sequences).

Communication per rank (bf16 activations and their gradients, 2 bytes; ``h`` the hidden size):

Tensor parallel (Shoeybi et al. 2019, Megatron-LM, section 3, the ``f`` and ``g`` operators)
    Per layer and microbatch, an allreduce of the ``b·s·h`` activations after
    attention and after the MLP in the forward pass (``g``), and of their
    gradients at both blocks' inputs in the backward pass (``f``): 4
    allreduces of ``2·b·s·h`` bytes. With sequence parallelism (Korthikanti
    et al. 2022, "Reducing Activation Recomputation in Large Transformer
    Models", section 4.2.2) each allreduce becomes an all-gather before the
    block and a reduce-scatter after it, on the same ``2·b·s·h``-byte buffer:
    8 collectives, half of each kind. (Megatron's implementation gathers a
    block's input once more in the backward pass for the weight gradient;
    that all-gather is not modelled.) The vocabulary-parallel embedding adds
    one more on the first stage (forward allreduce; with sequence
    parallelism a forward reduce-scatter and a backward all-gather), the
    output layer one on the last (backward allreduce; forward all-gather and
    backward reduce-scatter). The cross-entropy's three allreduces of ``b·s``
    numbers are left out.
Pipeline parallel (Narayanan et al. 2021, section 2.2.1; ``megatron/core/pipeline_parallel/schedules.py``, ``forward_backward_pipelining_without_interleaving``)
    1F1B (:func:`one_f_one_b`): stage ``i`` runs ``min(P-i-1, m)`` warm-up
    forward passes, then alternates one forward and one backward pass, then
    the remaining backward passes; every pass receives its input from the
    previous stage (activations) or the next (gradients) and sends its
    output on, paired as Megatron pairs them (``send_forward_recv_backward``
    and ``send_backward_recv_forward`` wait for both messages). A message is
    ``2·b·s·h`` bytes, ``2·b·s·h/T`` with sequence parallelism (the
    ``get_tensor_shapes`` rule): per iteration ``2m`` messages across each
    boundary between stages, for every tensor- and data-parallel index.
Data parallel (distributed optimizer, https://github.com/NVIDIA/Megatron-LM/blob/main/docs/user-guide/features/dist_optimizer.md)
    After the last backward pass, a reduce-scatter of the rank's gradients in
    fp32 (with bf16, Megatron accumulates and reduces gradients in fp32:
    ``megatron/training/arguments.py``), 4 bytes per parameter of the
    rank's shard of the model (its stage's parameters over ``T``, the norms
    and row-parallel biases whole), then after the optimizer step an
    all-gather of the updated bf16 parameters, 2 bytes per parameter. Expert
    parameters go the same way within their expert-data-parallel group of
    ``D/E`` ranks (nothing when ``E = D``). With embeddings tied to the
    output layer and ``P > 1`` the first and last stages then allreduce the
    word embedding's fp32 gradient (``finalize_model_grads``), ``4·V·h/T``
    bytes (segment ``pp emb ar``). Gradient reduction is not overlapped with
    the backward pass (Megatron's default without ``--overlap-grad-reduce``).
Expert parallel (``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``)
    Per mixture-of-experts layer and microbatch, an all-to-all that
    dispatches each token to its ``k`` experts and one that combines their
    outputs, in the forward pass and again (their gradients) in the backward
    pass: 4 all-to-alls of ``2·k·b·s·h/T`` bytes (the rank's ``b·s/T``
    tokens, each ``k`` times; routing is taken as balanced). With ``T > 1``
    the dispatcher also all-gathers the received tokens within the
    tensor-parallel group before the experts and reduce-scatters them after
    (``k`` times a dense layer's buffer), in place of the MLP's collectives;
    Megatron requires sequence parallelism then.

Compute (:mod:`~emulator.model.workloads.llm_models` for the FLOPs): per
microbatch and layer, the attention's and the MLP's forward FLOPs of ``b·s``
tokens over ``T``, at the accelerator's sustained rate
(:class:`~emulator.model.workloads.training.Accelerator`); a backward pass is
twice its forward; the last stage adds the logits. Each rank's compute runs
one operation at a time, as on one stream, and waits for the tensor-parallel
collectives it needs (Megatron without communication overlap). The
optimizer step and data loading are not modelled.

``layers_per_collective`` ``K`` (default 1) coarsens the schedule: every ``K``
consecutive layers of a stage act as one, with one compute operation per
block and one collective of ``K`` layers' bytes where there were ``K``. Bytes
and FLOPs stay; the collectives' count (and so their per-message latencies)
drops ``K`` times, and a layer's collectives no longer interleave with its
neighbours' compute.

``scale`` divides every byte count and compute time as
:mod:`emulator.model.workloads.training` does (and
:func:`~emulator.model.workloads.training.workload_scale` reads it back, so
check and replay divide the fabric's latencies by it too); ``meta`` keeps
the real sizes. Chunks: one size for the schedule, every collective padded
to a multiple of it as :func:`~emulator.model.workloads.training.pad_sizes`
does (the padding is in ``meta``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from emulator.base.errors import FieldError
from emulator.model.collectives import registry
from emulator.model.collectives.generators import generate
from emulator.model.prediction import timing
from emulator.model.schedule.compose import Composer, Node
from emulator.model.schedule.format import (
    DTYPE_BYTES,
    MAX_COMPUTE_S,
    RECV,
    SEND,
    Op,
    RankProgram,
    Schedule,
    is_power_of_two,
)
from emulator.model.schedule.semantics import ALLGATHER, ALLREDUCE, ALLTOALL, MEANINGS, P2P, REDUCE_SCATTER
from emulator.model.topology import Topology
from emulator.model.topology import build as build_topology
from emulator.model.workloads.llm_models import A100, ACCELERATORS, MODELS, TransformerModel, model
from emulator.model.workloads.llm_placement import Grid, Placement, place, read_placement_file
from emulator.model.workloads.training import Accelerator, check_scale, chunk_multiple, pad_sizes, scaled_bytes

WHERE = "schedule gen"
#: bf16 activations, activation gradients and parameters (Megatron's ``--bf16``).
ACT_BYTES = 2
#: fp32 gradients in the distributed optimizer's reduce-scatter (bf16 training accumulates and reduces in fp32).
GRAD_BYTES = 4
PARAM_BYTES = 2
DEFAULT_MICROBATCHES = 8
#: Microbatches per iteration (``--microbatches``, a run's ``llm.microbatches``): Megatron-LM's published runs use
#: up to a few hundred; the schedule's steps grow with them towards
#: :data:`~emulator.model.schedule.format.MAX_STEPS`, and generating one takes about 0.3 s per microbatch (llama2-7b
#: on 8 ranks), so 100 000 would wait for hours before failing.
MAX_MICROBATCHES = 256
#: Data-parallel algorithms: those that run inside a process group (reduce-scatter and all-gather over each group;
#: hdrm: hd, groups a power of two).
DP_ALGOS = registry.in_group_algorithms(REDUCE_SCATTER)
COMPUTE, TP, EP = "compute", "tp", "ep"


@dataclass(frozen=True)
class LlmConfig:
    """What one iteration trains and how it is split (see the module docstring)."""

    model: TransformerModel
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    microbatches: int = DEFAULT_MICROBATCHES
    micro_batch: int = 1
    sequence_parallel: bool = False
    accelerator: Accelerator = A100
    layers_per_collective: int = 1

    @property
    def grid(self) -> Grid:
        return Grid(self.tp, self.pp, self.dp, self.ep)

    @property
    def sp(self) -> bool:
        """Sequence parallelism in effect (Megatron turns it off without tensor parallelism)."""
        return self.sequence_parallel and self.tp > 1

    @property
    def stage_layers(self) -> int:
        return self.model.layers // self.pp

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch."""
        return self.micro_batch * self.model.seq_length

    @property
    def act_bytes(self) -> int:
        """One microbatch's activations (or their gradients) of one layer: ``2·b·s·h``."""
        return ACT_BYTES * self.tokens * self.model.hidden

    def check(self, hosts: int, where: str = WHERE) -> None:
        """Raise :class:`FieldError` naming the field for anything Megatron-LM would refuse or this model lacks."""
        for name in ("tp", "pp", "dp", "ep", "microbatches", "micro_batch", "layers_per_collective"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FieldError(where, name, "a positive integer", value)
        if self.microbatches > MAX_MICROBATCHES:
            raise FieldError(where, "microbatches", f"at most {MAX_MICROBATCHES} microbatches per iteration",
                             self.microbatches)
        if self.grid.world != hosts:
            raise FieldError(where, "dp", f"tp x pp x dp = the {hosts} hosts of the topology (tp {self.tp} x pp "
                             f"{self.pp} x dp {self.dp} = {self.grid.world})", self.dp)
        self._check_model(where)
        rate = self.accelerator.flops_per_s
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise FieldError(where, "accelerator.flops_per_s", "a positive number of FLOP/s", rate)

    def _check_model(self, where: str) -> None:
        m = self.model
        if m.layers % self.pp:
            raise FieldError(where, "pp", f"a divisor of the {m.layers} layers of {m.name}", self.pp)
        if m.heads % self.tp or m.query_groups % self.tp or m.ffn % self.tp:
            raise FieldError(where, "tp", f"a divisor of the {m.heads} attention heads, {m.query_groups} key-value "
                             f"heads and {m.ffn} feed-forward width of {m.name}", self.tp)
        if self.stage_layers % self.layers_per_collective:
            raise FieldError(where, "layers_per_collective", f"a divisor of the {self.stage_layers} layers per "
                             "pipeline stage", self.layers_per_collective)
        if self.ep > 1 and not m.experts:
            moe = ", ".join(n.name for n in _moe_models()) or "none"
            raise FieldError(where, "ep", f"1 for {m.name}, a dense model (models with experts: {moe})", self.ep)
        if m.experts and (m.experts % self.ep or self.dp % self.ep):
            raise FieldError(where, "ep", f"a divisor of the {m.experts} experts and of dp {self.dp}", self.ep)
        if m.experts and self.tp > 1 and not self.sequence_parallel:
            raise FieldError(where, "sequence_parallel", "true with tensor parallelism in a model with experts "
                             "(Megatron-LM requires it)", self.sequence_parallel)


def _moe_models() -> list[TransformerModel]:
    return [m for m in MODELS.values() if m.experts]


# ---------------------------------------------------------------------------
# What one stage does per microbatch
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Work:
    """One item of a stage's forward or backward pass for one microbatch: compute, or a TP or EP collective.

    ``bytes`` and ``seconds`` are the real system's (before ``scale``); the segment's name is :meth:`name`."""

    kind: str
    direction: str
    where: str
    what: str = ""
    collective: str = ""
    bytes: int = 0
    seconds: float = 0.0

    def name(self, mb: int) -> str:
        return f"{self.kind} {self.direction} {self.where} mb{mb} {self.what}".rstrip()


@dataclass
class _Pass:
    """Builds one stage's list of :class:`Work` for one direction."""

    cfg: LlmConfig
    direction: str
    items: list[Work] = field(default_factory=list)

    def compute(self, where: str, what: str, flops_per_token: float) -> None:
        cfg = self.cfg
        factor = 1.0 if self.direction == "fwd" else 2.0
        seconds = factor * flops_per_token * cfg.tokens / cfg.tp / cfg.accelerator.flops_per_s
        self.items.append(Work(COMPUTE, self.direction, where, what, seconds=seconds))

    def tp(self, where: str, what: str, collective: str, nbytes: int) -> None:
        if self.cfg.tp > 1:
            self.items.append(Work(TP, self.direction, where, f"{what} {MEANINGS[collective].short}", collective,
                                   nbytes))

    def ep(self, where: str, what: str, nbytes: int) -> None:
        if self.cfg.ep > 1:
            self.items.append(Work(EP, self.direction, where, f"{what} a2a", ALLTOALL, nbytes))

    def block(self, where: str, what: str, flops_per_token: float, nbytes: int) -> None:
        """A dense block (attention or MLP): Megatron's f and g (sequence parallel: all-gather and reduce-scatter)
        around its compute; the same pattern forward and backward."""
        if self.cfg.sp:
            self.tp(where, what, ALLGATHER, nbytes)
            self.compute(where, what, flops_per_token)
            self.tp(where, what, REDUCE_SCATTER, nbytes)
        else:
            self.compute(where, what, flops_per_token)
            self.tp(where, what, ALLREDUCE, nbytes)

    def moe(self, where: str, flops_per_token: float, a2a_bytes: int, tp_bytes: int) -> None:
        """A mixture of experts: all-to-all, (TP all-gather), experts, (TP reduce-scatter), all-to-all."""
        first, second = ("dispatch", "combine") if self.direction == "fwd" else ("combine", "dispatch")
        self.ep(where, first, a2a_bytes)
        self.tp(where, "moe", ALLGATHER, tp_bytes)
        self.compute(where, "moe", flops_per_token)
        self.tp(where, "moe", REDUCE_SCATTER, tp_bytes)
        self.ep(where, second, a2a_bytes)


def _layer_block(p: _Pass, layers: Sequence[int]) -> None:
    """``K`` consecutive layers as one: attention, then the feed-forward (dense, experts or both)."""
    cfg, m = p.cfg, p.cfg.model
    where = f"L{layers[0]}" if len(layers) == 1 else f"L{layers[0]}-{layers[-1]}"
    moe = [i for i in layers if m.is_moe(i)]
    dense = len(layers) - len(moe)
    attention = (where, "attn", m.attention_flops * len(layers), cfg.act_bytes * len(layers))
    mlp_flops = sum(m.mlp_flops(i) for i in layers)
    if p.direction == "fwd":
        p.block(*attention)
    if moe:
        a2a = cfg.act_bytes * m.top_k * len(moe) // cfg.tp
        p.moe(where, mlp_flops, a2a, cfg.act_bytes * (dense + m.top_k * len(moe)))
    else:
        p.block(where, "mlp", mlp_flops, cfg.act_bytes * dense)
    if p.direction == "bwd":
        p.block(*attention)


def stage_passes(cfg: LlmConfig, stage: int) -> tuple[list[Work], list[Work]]:
    """Stage ``stage``'s forward and backward pass of one microbatch (see the module docstring)."""
    m, k = cfg.model, cfg.layers_per_collective
    first, last = stage == 0, stage == cfg.pp - 1
    lo = stage * cfg.stage_layers
    blocks = [list(range(b, b + k)) for b in range(lo, lo + cfg.stage_layers, k)]
    vocab = m.padded_vocab(cfg.tp)
    fwd, bwd = _Pass(cfg, "fwd"), _Pass(cfg, "bwd")
    if first:
        fwd.tp("emb", "embedding", REDUCE_SCATTER if cfg.sp else ALLREDUCE, cfg.act_bytes)
    for layers in blocks:
        _layer_block(fwd, layers)
    if last:
        if cfg.sp:
            fwd.tp("head", "output", ALLGATHER, cfg.act_bytes)
        fwd.compute("head", "logits", m.logit_flops(vocab))
        bwd.compute("head", "logits", m.logit_flops(vocab))
        bwd.tp("head", "output", REDUCE_SCATTER if cfg.sp else ALLREDUCE, cfg.act_bytes)
    for layers in reversed(blocks):
        _layer_block(bwd, layers)
    if first and cfg.sp:
        bwd.tp("emb", "embedding", ALLGATHER, cfg.act_bytes)
    return fwd.items, bwd.items


def pp_bytes(cfg: LlmConfig) -> int:
    """One pipeline message: a microbatch's activations (or gradients) at a stage boundary."""
    return cfg.act_bytes // cfg.tp if cfg.sp else cfg.act_bytes


@dataclass(frozen=True)
class DpWork:
    """One collective after the pipeline: a reduce-scatter or all-gather over data-parallel groups (``expert``:
    the expert-data-parallel ones), or the tied embedding's allreduce (``embedding``)."""

    name: str
    collective: str
    stage: int
    bytes: int
    expert: bool = False
    embedding: bool = False


def stage_params(cfg: LlmConfig, stage: int) -> tuple[int, int]:
    """``(dense, expert)`` parameters one rank of ``stage`` holds (its shard of the model)."""
    m, t = cfg.model, cfg.tp
    vocab = m.padded_vocab(t)
    layers = range(stage * cfg.stage_layers, (stage + 1) * cfg.stage_layers)
    dense = sum(m.layer_dense_sharded(i) // t + m.layer_replicated(i) for i in layers)
    expert = sum(m.layer_expert(i) for i in layers) // (cfg.ep * t)
    if stage == 0:
        dense += vocab * m.hidden // t + (m.seq_length * m.hidden if m.learned_positions else 0)
    if stage == cfg.pp - 1:
        dense += (2 if m.layernorm else 1) * m.hidden
        if not m.tied_embeddings or cfg.pp > 1:  # the output layer, or the last stage's copy of the tied embedding
            dense += vocab * m.hidden // t
    return dense, expert


def dp_work(cfg: LlmConfig) -> list[DpWork]:
    """The collectives after the last backward pass, in Megatron's order: every stage's gradient reduce-scatter,
    the tied embedding's allreduce, every stage's parameter all-gather."""
    grid, m = cfg.grid, cfg.model
    rs: list[DpWork] = []
    ag: list[DpWork] = []
    for s in range(cfg.pp):
        dense, expert = stage_params(cfg, s)
        if grid.dp > 1:
            rs.append(DpWork(f"dp rs s{s}", REDUCE_SCATTER, s, GRAD_BYTES * dense))
            ag.append(DpWork(f"dp ag s{s}", ALLGATHER, s, PARAM_BYTES * dense))
        if grid.edp > 1 and expert:
            rs.append(DpWork(f"dp rs expert s{s}", REDUCE_SCATTER, s, GRAD_BYTES * expert, expert=True))
            ag.append(DpWork(f"dp ag expert s{s}", ALLGATHER, s, PARAM_BYTES * expert, expert=True))
    emb = []
    if m.tied_embeddings and cfg.pp > 1:
        emb = [DpWork("pp emb ar", ALLREDUCE, 0, GRAD_BYTES * m.padded_vocab(cfg.tp) * m.hidden // cfg.tp,
                      embedding=True)]
    return rs + emb + ag


# ---------------------------------------------------------------------------
# The pipeline schedule
# ---------------------------------------------------------------------------

#: A pipeline item: ``("F" | "B", microbatch)`` or a message ``("send_act" | "recv_act" | "send_grad" |
#: "recv_grad", microbatch)``.
Item = tuple[str, int]
_PARTNER = {"send_act": ("recv_act", 1), "recv_act": ("send_act", -1), "send_grad": ("recv_grad", -1),
            "recv_grad": ("send_grad", 1)}


def one_f_one_b(stages: int, stage: int, m: int) -> list[list[Item]]:
    """Stage ``stage``'s program under Megatron's 1F1B schedule: batches of items, each batch waited for as a
    whole (``send_forward_recv_backward`` and ``send_backward_recv_forward`` are one batch each)."""
    first, last = stage == 0, stage == stages - 1

    def msg(kind: str, j: int) -> list[Item]:
        skip = {"recv_act": first, "send_grad": first, "send_act": last, "recv_grad": last}[kind]
        return [] if skip else [(kind, j)]

    warmup = min(stages - stage - 1, m)
    steady = m - warmup
    out: list[list[Item]] = []
    for i in range(warmup):
        out += [msg("recv_act", i), [("F", i)], msg("send_act", i)]
    if steady:
        out.append(msg("recv_act", warmup))
    for i in range(steady):
        out += [[("F", warmup + i)], msg("send_act", warmup + i) + msg("recv_grad", i), [("B", i)]]
        out.append(msg("send_grad", i) + ([] if i == steady - 1 else msg("recv_act", warmup + i + 1)))
    for i in range(warmup):
        out += [msg("recv_grad", steady + i), [("B", steady + i)], msg("send_grad", steady + i)]
    return [batch for batch in out if batch]


# ---------------------------------------------------------------------------
# Composing the schedule
# ---------------------------------------------------------------------------

def _part_algo(algo: str, collective: str, p: int, field_name: str) -> str:
    """The generator algorithm for ``algo`` over groups of ``p``: what it runs as inside a group (hdrm: hd on a
    power-of-two group)."""
    allowed = registry.in_group_algorithms(collective)
    if algo not in allowed:
        raise FieldError(WHERE, field_name, f"one of {', '.join(allowed)} for the {collective}s", algo)
    whole = registry.REGISTRY[(collective, algo)]
    part = whole.in_groups
    assert part is not None  # in_group_algorithms holds only those that run inside a group
    # a variant on a placement of the whole job (hdrm) keeps its pairing of ranks that differ in one bit
    if (whole.variant_of or registry.REGISTRY[(collective, part)].power_of_two) and not is_power_of_two(p):
        raise FieldError(WHERE, field_name, f"an algorithm for groups of {p} ranks ({algo} pairs ranks differing "
                         "in one bit: it needs a power-of-two group)", algo)
    return part


def _p2p_part(size: int) -> Schedule:
    """Two ranks: rank 0 sends its whole buffer to rank 1."""
    send = Op(id=0, kind=SEND, chunk=0, nchunks=1, bytes=size, step=0, peer=1)
    recv = Op(id=0, kind=RECV, chunk=0, nchunks=1, bytes=size, step=0, peer=0)
    return Schedule(algorithm="p2p", size=size, chunks=1, collective=P2P,
                    ranks=(RankProgram(0, "h1", (send,)), RankProgram(1, "h2", (recv,))))


@dataclass(frozen=True)
class _Algos:
    tp: str
    dp: str


class _Builder:
    """Adds one iteration's parts to a :class:`Composer` in an order every rank's dependencies agree with."""

    def __init__(self, cfg: LlmConfig, placement: Placement, algos: _Algos, scale: float, chunk_bytes: int,
                 padded: Mapping[int, int]):
        self.cfg, self.grid, self.algos, self.scale = cfg, cfg.grid, algos, scale
        self.padded = padded
        self.comp = Composer(list(placement.hosts), chunk_bytes)
        self.last: list[list[Node]] = [[] for _ in range(self.grid.world)]
        self.parts: dict[tuple[str, str, int, int], Schedule] = {}
        self.passes = [stage_passes(cfg, s) for s in range(cfg.pp)]

    def part(self, collective: str, algo: str, p: int, raw: int) -> Schedule:
        size = self.padded[raw]
        key = (collective, algo, p, size)
        if key not in self.parts:
            self.parts[key] = (_p2p_part(size) if collective == P2P else
                               generate(algo, build_topology(f"star:hosts={p}"), size, collective=collective))
        return self.parts[key]

    def collective(self, collective: str, algo: str, groups: list[list[int]], raw: int, name: str) -> None:
        part = self.part(collective, algo, len(groups[0]), raw)
        nodes = self.comp.group_collective(part, name, groups, {r: self.last[r] for g in groups for r in g})
        for r, node in nodes.items():
            self.last[r] = [node]

    def run_pass(self, stage: int, direction: str, mb: int) -> None:
        fwd, bwd = self.passes[stage]
        ranks = self.grid.stage_ranks(stage)
        for w in fwd if direction == "F" else bwd:
            if w.kind == COMPUTE:
                for r in ranks:
                    self.last[r] = [self.comp.compute(r, w.seconds / self.scale, self.last[r])]
            elif w.kind == TP:
                algo = _part_algo(self.algos.tp, w.collective, self.grid.tp, "tp_algo")
                self.collective(w.collective, algo, self.grid.tp_groups(stage), w.bytes, w.name(mb))
            else:
                self.collective(ALLTOALL, "direct", self.grid.ep_groups(stage), w.bytes, w.name(mb))

    def pipeline(self) -> None:
        """Every stage's 1F1B program, stage by stage as far as each can go, messages once both ends reach them."""
        n = self.cfg.pp
        programs = [one_f_one_b(n, s, self.cfg.microbatches) for s in range(n)]
        pos = [0] * n
        pending: list[dict[int, list[Node]]] = [{} for _ in range(n)]
        matched: list[set[Item]] = [set() for _ in range(n)]
        while any(pos[s] < len(programs[s]) for s in range(n)):
            moved = False
            for s in range(n):
                while pos[s] < len(programs[s]):
                    batch = programs[s][pos[s]]
                    if batch[0][0] in ("F", "B"):
                        self.run_pass(s, batch[0][0], batch[0][1])
                    else:
                        self._match(s, batch, programs, pos, pending, matched)
                        if len(matched[s]) < len(batch):
                            break
                        for r, nodes in pending[s].items():
                            self.last[r] = nodes
                        pending[s], matched[s] = {}, set()
                    pos[s] += 1
                    moved = True
            if not moved:
                raise RuntimeError(f"the 1F1B programs deadlock at {pos}")  # cannot happen: Megatron's pairs match

    def _match(self, s: int, batch: list[Item], programs: list[list[list[Item]]], pos: list[int],
               pending: list[dict[int, list[Node]]], matched: list[set[Item]]) -> None:
        """Send every message of stage ``s``'s batch whose other end is in the other stage's current batch."""
        for item in batch:
            kind, j = item
            other, step = _PARTNER[kind]
            q = s + step
            partner = (other, j)
            if item in matched[s] or pos[q] >= len(programs[q]) or partner not in programs[q][pos[q]]:
                continue
            src, dst = (s, q) if kind.startswith("send") else (q, s)
            what = "act" if kind.endswith("act") else "grad"
            pairs = self.grid.pp_pairs(src, dst)
            part = self.part(P2P, "p2p", 2, pp_bytes(self.cfg))
            after = {r: self.last[r] for pair in pairs for r in pair}
            nodes = self.comp.group_collective(part, f"pp {what} s{src}->s{dst} mb{j}", pairs, after)
            for r, node in nodes.items():
                pending[self.grid.coords(r)[2]].setdefault(r, []).append(node)
            matched[s].add(item)
            matched[q].add(partner)

    def finish(self) -> None:
        """The distributed optimizer's collectives and the tied embedding's allreduce, after the pipeline."""
        g = self.grid
        for w in dp_work(self.cfg):
            if w.embedding:
                groups = [[g.rank(t, d, 0), g.rank(t, d, g.pp - 1)] for d in range(g.dp) for t in range(g.tp)]
                self.collective(ALLREDUCE, "ring", groups, w.bytes, w.name)
                continue
            groups = g.edp_groups(w.stage) if w.expert else g.dp_groups(w.stage)
            algo = _part_algo(self.algos.dp, w.collective, len(groups[0]), "dp_algo")
            self.collective(w.collective, algo, groups, w.bytes, w.name)


# ---------------------------------------------------------------------------
# Sizes, loads and the iteration
# ---------------------------------------------------------------------------

def raw_sizes(cfg: LlmConfig) -> list[int]:
    """The real size of every collective and message of the iteration, one entry per segment."""
    sizes: list[int] = []
    for s in range(cfg.pp):
        fwd, bwd = stage_passes(cfg, s)
        sizes += [w.bytes for w in fwd + bwd if w.kind != COMPUTE] * cfg.microbatches
    sizes += [pp_bytes(cfg)] * (2 * cfg.microbatches * (cfg.pp - 1))
    return sizes + [w.bytes for w in dp_work(cfg)]


def _group_sizes(cfg: LlmConfig) -> list[int]:
    g = cfg.grid
    return [n for n in (g.tp, g.dp, g.ep, g.edp, 2) if n > 1]


def padding(cfg: LlmConfig, scale: float, max_padding: float) -> tuple[int, dict[int, int]]:
    """``(chunk_bytes, real size -> scaled and padded size)`` for every size of :func:`raw_sizes`."""
    elem = DTYPE_BYTES["float32"]
    raw = raw_sizes(cfg)
    multiple = math.lcm(*(chunk_multiple(p) for p in _group_sizes(cfg)))
    chunk_bytes, padded = pad_sizes([scaled_bytes(n, scale, elem) for n in raw], multiple, max_padding, elem)
    return chunk_bytes, dict(zip(raw, padded, strict=True))


@dataclass(frozen=True)
class KindLoad:
    """One rank's share of one kind of group in an iteration: collectives (and messages) it takes part in, and
    their real sizes (nccl-tests' size: the rank's buffer) added up."""

    collectives: int
    bytes: int


def stage_loads(cfg: LlmConfig, stage: int) -> dict[str, KindLoad]:
    """Per kind (``tp``, ``pp``, ``dp``, ``ep``), what one rank of ``stage`` takes part in per iteration."""
    m = cfg.microbatches
    fwd, bwd = stage_passes(cfg, stage)
    loads = {}
    for kind in (TP, EP):
        works = [w for w in fwd + bwd if w.kind == kind]
        loads[kind] = KindLoad(m * len(works), m * sum(w.bytes for w in works))
    messages = 2 * m * ((stage > 0) + (stage < cfg.pp - 1))
    emb = [w for w in dp_work(cfg) if w.embedding and stage in (0, cfg.pp - 1)]
    loads["pp"] = KindLoad(messages + len(emb), messages * pp_bytes(cfg) + sum(w.bytes for w in emb))
    dp = [w for w in dp_work(cfg) if not w.embedding and w.stage == stage]
    loads["dp"] = KindLoad(len(dp), sum(w.bytes for w in dp))
    return loads


def _stage_meta(cfg: LlmConfig, stage: int) -> dict[str, Any]:
    fwd, bwd = stage_passes(cfg, stage)
    lo = stage * cfg.stage_layers
    loads = stage_loads(cfg, stage)
    return {"stage": stage, "layers": f"{lo}-{lo + cfg.stage_layers - 1}",
            "forward_s": sum(w.seconds for w in fwd), "backward_s": sum(w.seconds for w in bwd),
            **{kind: {"collectives": load.collectives, "bytes": load.bytes} for kind, load in loads.items()}}


def _meta(cfg: LlmConfig, placement: Placement, algos: _Algos, scale: float) -> dict[str, Any]:
    m, g = cfg.model, cfg.grid
    stages = [_stage_meta(cfg, s) for s in range(cfg.pp)]
    return {
        "generator": "llm", "model": m.name, "model_source": m.source, "parameters": m.parameters,
        "cited_parameters": m.cited_parameters,
        "shape": {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.query_groups,
                  "ffn": m.ffn, "seq_length": m.seq_length, "vocab": m.vocab, "padded_vocab": m.padded_vocab(cfg.tp),
                  "experts": m.experts, "top_k": m.top_k, "moe_layers": list(m.moe_layers)},
        "parallel": {"tp": g.tp, "pp": g.pp, "dp": g.dp, "ep": g.ep, "expert_dp": g.edp,
                     "sequence_parallel": cfg.sp, "microbatches": cfg.microbatches, "micro_batch": cfg.micro_batch,
                     "global_batch": cfg.micro_batch * cfg.microbatches * g.dp, "schedule": "1F1B",
                     "layers_per_collective": cfg.layers_per_collective},
        "tp_algo": algos.tp, "dp_algo": algos.dp, "ep_algo": "direct",
        "accelerator": cfg.accelerator.name, "accelerator_flops_per_s": cfg.accelerator.flops_per_s,
        "accelerator_source": cfg.accelerator.source, "scale": scale,
        "bytes_per_rank": {k: max(st[k]["bytes"] for st in stages) for k in (TP, "pp", "dp", EP)},
        "stages": stages,
        "placement": placement.source,
        "ranks": [{"rank": p.rank, "host": p.host, "tp": p.tp, "pp": p.pp, "dp": p.dp, "ep": p.ep,
                   "server": p.server} for p in placement.ranks],
        "not_modelled": "optimizer step, data loading, cross-entropy and sequence-parallel norm allreduces, the "
                        "backward re-gather of sequence-parallel inputs, activation recomputation, overlap of "
                        "gradient reduction or tensor-parallel communication with compute",
    }


def _check_scale(scale: float) -> None:
    check_scale(scale, WHERE)


def _check_compute(cfg: LlmConfig, scale: float) -> None:
    """Refuse, naming ``micro_batch``, an iteration whose longest compute operation (one block of layers' backward
    pass over a microbatch) would exceed :data:`~emulator.model.schedule.format.MAX_COMPUTE_S`: its seconds grow
    with the sequences per microbatch, so the error says how many fit."""
    longest = max(w.seconds for s in range(cfg.pp) for ws in stage_passes(cfg, s) for w in ws
                  if w.kind == COMPUTE) / scale
    if longest > MAX_COMPUTE_S:
        most = math.floor(cfg.micro_batch * MAX_COMPUTE_S / longest)
        raise FieldError(WHERE, "micro_batch", f"at most {most} sequences per microbatch at scale {scale:g} (its "
                         f"longest compute operation would take {longest:.0f} s, at most {MAX_COMPUTE_S:g} s each)",
                         cfg.micro_batch)


def _check_algos(cfg: LlmConfig, algos: _Algos) -> None:
    """Refuse an algorithm the iteration's groups cannot run before anything is built."""
    g = cfg.grid
    if g.tp > 1:
        for collective in {w.collective for s in range(cfg.pp) for ws in stage_passes(cfg, s) for w in ws
                           if w.kind == TP}:
            _part_algo(algos.tp, collective, g.tp, "tp_algo")
    if algos.dp not in DP_ALGOS:
        raise FieldError(WHERE, "dp_algo", f"one of {', '.join(DP_ALGOS)}", algos.dp)
    for w in dp_work(cfg):
        if not w.embedding:
            _part_algo(algos.dp, w.collective, g.edp if w.expert else g.dp, "dp_algo")


def iteration(topo: Topology, config: LlmConfig, *, dp_algo: str = "ring", tp_algo: str = "ring",
              placement_hosts: Sequence[str] | None = None, scale: float = 1.0, max_padding: float = 0.01,
              placement_name: str | None = None) -> Schedule:
    """One training iteration of ``config`` over every host of ``topo`` (see the module docstring).

    ``placement_hosts``: the host of every rank (default Megatron's order on the topology's hosts,
    :mod:`~emulator.model.workloads.llm_placement`); ``placement_name`` what the schedule calls that placement.
    ``tp_algo`` builds the tensor-parallel collectives, ``dp_algo`` the data-parallel reduce-scatters and
    all-gathers (hdrm: hd, on power-of-two groups); all-to-alls are ``direct``, pipeline messages
    point-to-point. ``scale`` (>= 1) divides sizes and compute times. ``meta`` records the model and its
    source, the parallel configuration, per stage the compute per microbatch and each kind of group's
    collectives and bytes per rank, the placement, the accelerator, the padding and ``compute_only_s``.
    Raises :class:`FieldError` naming the field for a bad configuration, algorithm, placement or scale.
    """
    config.check(len(topo.hosts))
    _check_scale(scale)
    _check_compute(config, scale)
    if not 0 < max_padding < 1:
        raise FieldError(WHERE, "max_padding", "a fraction between 0 and 1", max_padding)
    algos = _Algos(tp_algo, dp_algo)
    _check_algos(config, algos)
    name = placement_name or ("megatron" if placement_hosts is None else "given")
    placement = place(topo, config.grid, placement_hosts, name)
    chunk_bytes, padded = padding(config, scale, max_padding)
    builder = _Builder(config, placement, algos, scale, chunk_bytes, padded)
    builder.pipeline()
    builder.finish()
    meta = _meta(config, placement, algos, scale)
    raw = raw_sizes(config)
    total = sum(padded[n] for n in raw)
    scaled = sum(raw) / scale
    meta.update(chunk_bytes=chunk_bytes, padding_bytes=round(total - scaled), padding_fraction=(total - scaled) / scaled)
    sched = builder.comp.build("megatron-1f1b", meta=meta, topology=topo.spec, placement=name)
    meta["compute_only_s"] = timing.compute_only_s(sched)
    meta["real_compute_only_s"] = meta["compute_only_s"] * scale
    return replace(sched, meta=meta)


def dp_phase(topo: Topology, config: LlmConfig, *, dp_algo: str = "ring", scale: float = 1.0,
             max_padding: float = 0.01) -> Schedule:
    """What :func:`iteration` does after its pipeline, alone: the distributed optimizer's reduce-scatters and
    all-gathers (and the tied embedding's allreduce), every rank starting at once, on the same placement, sizes
    and algorithms. What the projection to more accelerators changes (:mod:`emulator.model.workloads.llm_scale`): the
    pipeline's work per rank does not grow with the data-parallel degree, this phase's does."""
    config.check(len(topo.hosts))
    _check_scale(scale)
    algos = _Algos("ring", dp_algo)
    _check_algos(config, algos)
    placement = place(topo, config.grid, None, "megatron")
    chunk_bytes, padded = padding(config, scale, max_padding)
    builder = _Builder(config, placement, algos, scale, chunk_bytes, padded)
    builder.finish()
    return builder.comp.build("megatron-dp-phase", meta={"generator": "llm", "scale": scale, "phase": "dp"},
                              topology=topo.spec, placement="megatron")


def gen(model_name: str, topo: Topology, *, tp: int, pp: int, dp: int, ep: int = 1,
        microbatches: int = DEFAULT_MICROBATCHES, micro_batch: int = 1, sequence_parallel: bool = False,
        dp_algo: str = "ring", tp_algo: str = "ring", scale: float = 1.0, placement_file: str | None = None,
        layers_per_collective: int = 1, accelerator: str = "a100") -> Schedule:
    """``emu schedule gen --model NAME --tp T --pp P --dp D ...``: :func:`iteration` of a named model
    (:data:`~emulator.model.workloads.llm_models.MODELS`), its hosts from ``placement_file`` when given."""
    if accelerator not in ACCELERATORS:
        raise FieldError(WHERE, "accelerator", f"one of {', '.join(ACCELERATORS)}", accelerator)
    cfg = LlmConfig(model(model_name), tp, pp, dp, ep, microbatches, micro_batch, sequence_parallel,
                    ACCELERATORS[accelerator], layers_per_collective)
    cfg.check(len(topo.hosts))
    hosts = None if placement_file is None else read_placement_file(placement_file, topo, cfg.grid.world)
    return iteration(topo, cfg, dp_algo=dp_algo, tp_algo=tp_algo, placement_hosts=hosts, scale=scale,
                     placement_name=None if placement_file is None else f"file {placement_file}")


def placement_of(schedule: Schedule) -> Placement:
    """The placement an iteration was built with, from its ``meta`` and hosts."""
    par = schedule.meta["parallel"]
    servers = [r["server"] for r in schedule.meta["ranks"]]
    return Placement(Grid(par["tp"], par["pp"], par["dp"], par["ep"]), tuple(schedule.hosts),
                     str(schedule.meta["placement"]), None if None in servers else tuple(servers))


def describe(schedule: Schedule) -> list[str]:
    """What ``emu schedule gen`` prints for an iteration: its placement and its segments and operations by kind."""
    kinds: dict[str, int] = {}
    for seg in schedule.segments:
        kind = seg.name.split()[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    ops = sum(len(r.ops) for r in schedule.ranks)
    meta = schedule.meta
    counts = ", ".join(f"{k} {n}" for k, n in kinds.items())
    return [*placement_of(schedule).describe(),
            f"{meta['model']}: {len(schedule.segments)} segments ({counts}), {ops} ops ({schedule.compute_ops} "
            f"compute), compute-only {meta['compute_only_s']:.4g} s (real {meta['real_compute_only_s']:.4g} s)"]
