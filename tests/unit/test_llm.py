"""The hybrid-parallel language-model iteration: named models, Megatron's communication counted in closed form,
1F1B, placement of the groups, proofs by the executor, and the command line."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from emulator.base.errors import FieldError
from emulator.cli.main import main
from emulator.model import topology
from emulator.model.prediction import timing
from emulator.model.schedule import executor
from emulator.model.schedule.format import COMPUTE, Schedule
from emulator.model.workloads import llm, training
from emulator.model.workloads.llm_models import MODELS, TransformerModel
from emulator.model.workloads.llm_placement import Grid

#: Test-only shapes: the named models' architectures, a few small layers, so that proofs take a second.
TINY_GPT = replace(MODELS["gpt3-13b"], name="tiny-gpt", layers=4, hidden=64, heads=8, ffn=256, seq_length=32,
                   vocab=1000)
TINY_MOE = replace(MODELS["mixtral-8x7b"], name="tiny-moe", layers=4, hidden=64, heads=8, kv_heads=4, ffn=96,
                   seq_length=16, vocab=500, experts=4, top_k=2, moe_layer_freq=2)
STAR8 = "star:hosts=8"
#: 4 servers of 2 accelerators, one NIC each.
SERVERS8 = "star:hosts=4,servers=4,accels_per_server=2,nics_per_server=1"
SERVERS64 = ("bigraph:upper=8,lower=8,hosts_per_switch=4,servers=8,accels_per_server=8,nics_per_server=8,"
             "nic_placement=hdrm")


def build(spec: str, model: TransformerModel = TINY_GPT, **kw) -> Schedule:
    iteration_kw = {k: kw.pop(k) for k in ("dp_algo", "tp_algo", "placement_hosts", "scale") if k in kw}
    kw.setdefault("microbatches", 3)
    return llm.iteration(topology.build(spec), llm.LlmConfig(model, **kw), max_padding=0.2, **iteration_kw)


# ---------------------------------------------------------------------------
# Closed forms, computed here from the model's shapes (not from the generator)
# ---------------------------------------------------------------------------

def act(m: TransformerModel, b: int = 1) -> int:
    return 2 * b * m.seq_length * m.hidden


def padded_vocab(m: TransformerModel, t: int) -> int:
    return math.ceil(m.vocab / (128 * t)) * 128 * t


def gpt_shard(m: TransformerModel, t: int, p: int, stage: int) -> int:
    """One rank's parameters of a GPT (biases, LayerNorm, learned positions, tied embeddings)."""
    h = m.hidden
    per_layer = (4 * h * h + 3 * h) // t + (8 * h * h + 4 * h) // t + 2 * 2 * h + 2 * h
    out = m.layers // p * per_layer
    if stage == 0:
        out += padded_vocab(m, t) * h // t + m.seq_length * h
    if stage == p - 1:
        out += 2 * h + (padded_vocab(m, t) * h // t if p > 1 else 0)
    return out


def expected(m: TransformerModel, t: int, p: int, d: int, e: int, mb: int, sp: bool, stage: int) -> dict:
    """Per kind: (collectives or messages, real bytes) one rank of ``stage`` takes part in per iteration."""
    layers = range(stage * m.layers // p, (stage + 1) * m.layers // p)
    moe = [i for i in layers if m.experts and i % m.moe_layer_freq == 0]
    ends = (stage == 0) + (stage == p - 1)
    tp = (0, 0)
    if t > 1:
        per_layer = 8 if sp else 4
        count = mb * (per_layer * len(layers) + (2 if sp else 1) * ends)
        extra = mb * 4 * len(moe) * (m.top_k - 1) * act(m)  # a mixture's TP all-gather and reduce-scatter: k x
        tp = (count, count * act(m) + extra)
    neighbours = (stage > 0) + (stage < p - 1)
    pp = (2 * mb * neighbours, 2 * mb * neighbours * (act(m) // t if sp and t > 1 else act(m)))
    ep = (4 * mb * len(moe), 4 * mb * len(moe) * m.top_k * act(m) // t) if e > 1 else (0, 0)
    return {"tp": tp, "pp": pp, "ep": ep}


def segment_load(s: Schedule, rank: int) -> dict[str, list[int]]:
    """Per kind: [count, padded bytes] of the segments ``rank`` is in (pipeline messages and ``pp emb`` apart)."""
    out: dict[str, list[int]] = {}
    for seg in s.segments:
        if any(rank in g for g in seg.groups):
            words = seg.name.split()
            kind = "emb" if words[:2] == ["pp", "emb"] else words[0]
            load = out.setdefault(kind, [0, 0])
            load[0] += 1
            load[1] += seg.chunks * s.chunk_bytes
    return out


# ---------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------

def test_named_models_have_their_sources_parameter_counts():
    gpt, llama, mixtral = MODELS["gpt3-13b"], MODELS["llama2-7b"], MODELS["mixtral-8x7b"]
    assert (gpt.layers, gpt.hidden, gpt.heads, gpt.ffn, gpt.seq_length, gpt.vocab) == (40, 5120, 40, 20480, 2048,
                                                                                       50257)
    assert gpt.parameters == pytest.approx(13.0e9, rel=0.012)  # d_model 5120, not Table 2.1's 5140
    assert (llama.layers, llama.hidden, llama.heads, llama.ffn, llama.seq_length, llama.vocab) == (32, 4096, 32,
                                                                                                   11008, 4096, 32000)
    assert llama.parameters == 6_738_415_616  # Llama-2-7b-hf
    assert mixtral.parameters == 46_702_792_704 and mixtral.moe_layers == tuple(range(32))
    for m in MODELS.values():
        assert m.source and m.parameters == pytest.approx(m.cited_parameters, rel=0.012)


def test_flops_are_narayanans_per_layer_formula():
    gpt = MODELS["gpt3-13b"]
    h, s = gpt.hidden, gpt.seq_length
    per_layer = s * (gpt.attention_flops + gpt.mlp_flops(0))  # one sequence, forward
    assert per_layer == pytest.approx(24 * s * h * h + 4 * s * s * h, rel=1e-3)
    assert gpt.padded_vocab(8) == 51200 and gpt.padded_vocab(1) == 50304


def test_compute_is_forward_a_third_backward_two_thirds_at_the_accelerators_rate():
    s = build(STAR8, tp=2, pp=2, dp=2, microbatches=1)
    cfg = llm.LlmConfig(TINY_GPT, 2, 2, 2, microbatches=1)
    for stage in (0, 1):
        fwd, bwd = llm.stage_passes(cfg, stage)
        f = sum(w.seconds for w in fwd if w.kind == COMPUTE)
        b = sum(w.seconds for w in bwd if w.kind == COMPUTE)
        assert b == pytest.approx(2 * f)
        flops = sum(TINY_GPT.attention_flops + TINY_GPT.mlp_flops(i) for i in range(2 * stage, 2 * stage + 2))
        flops += TINY_GPT.logit_flops(padded_vocab(TINY_GPT, 2)) if stage == 1 else 0
        assert f == pytest.approx(flops * TINY_GPT.seq_length / 2 / llm.A100.flops_per_s)
        assert s.meta["stages"][stage]["forward_s"] == pytest.approx(f)


# ---------------------------------------------------------------------------
# 1F1B
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(("stages", "m"), [(4, 6), (4, 2), (2, 1), (1, 3)])
def test_one_f_one_b_warms_up_alternates_and_cools_down(stages, m):
    for s in range(stages):
        program = llm.one_f_one_b(stages, s, m)
        passes = "".join(kind for batch in program for kind, _ in batch if kind in "FB")
        warm = min(stages - s - 1, m)
        assert passes == "F" * warm + "FB" * (m - warm) + "B" * warm
        messages = [item for batch in program for item in batch if item[0] not in "FB"]
        assert len(messages) == 2 * m * ((s > 0) + (s < stages - 1))


def test_the_pipeline_bubble_of_compute_only():
    """Communication free: 1F1B takes between (m + P - 1) times the fastest and the slowest stage's pass pair."""
    m, p = 4, 4
    s = build(STAR8, tp=1, pp=p, dp=2, microbatches=m)
    pairs = [st["forward_s"] + st["backward_s"] for st in s.meta["stages"]]
    assert (m + p - 1) * min(pairs) * 0.999 <= s.meta["compute_only_s"] <= (m + p - 1) * max(pairs) * 1.001
    one = build(STAR8, tp=2, pp=1, dp=4, microbatches=m)
    st = one.meta["stages"][0]
    assert one.meta["compute_only_s"] == pytest.approx(m * (st["forward_s"] + st["backward_s"]))


# ---------------------------------------------------------------------------
# Proofs and closed-form counts
# ---------------------------------------------------------------------------

CASES = [  # spec, model, tp, pp, dp, ep, sequence parallel
    (STAR8, TINY_GPT, 2, 2, 2, 1, False),
    (STAR8, TINY_GPT, 4, 1, 2, 1, False),
    (STAR8, TINY_GPT, 1, 4, 2, 1, False),
    (STAR8, TINY_GPT, 2, 2, 2, 1, True),
    (STAR8, TINY_GPT, 2, 4, 1, 1, True),
    ("star:hosts=4", TINY_MOE, 2, 1, 2, 2, True),
    (STAR8, TINY_MOE, 2, 1, 4, 2, True),
    (STAR8, TINY_MOE, 1, 2, 4, 4, False),
    (SERVERS8, TINY_GPT, 2, 2, 2, 1, False),
]


@pytest.mark.parametrize(("spec", "model", "t", "p", "d", "e", "sp"), CASES)
def test_iterations_prove_and_match_the_closed_forms(spec, model, t, p, d, e, sp):
    mb = 3
    s = build(spec, model, tp=t, pp=p, dp=d, ep=e, sequence_parallel=sp, microbatches=mb)
    run = executor.execute(s)
    assert run.valid, run.errors[:3]
    grid = Grid(t, p, d, e)
    for rank in range(grid.world):
        stage = grid.coords(rank)[2]
        want = expected(model, t, p, d, e, mb, sp, stage)
        got = segment_load(s, rank)
        meta = s.meta["stages"][stage]
        for kind in ("tp", "ep"):
            assert tuple(got.get(kind, [0, 0]))[0] == want[kind][0], (kind, rank)
            assert meta[kind] == {"collectives": want[kind][0], "bytes": want[kind][1]}
            assert got.get(kind, [0, 0])[1] >= want[kind][1]
        assert got.get("pp", [0, 0])[0] == want["pp"][0]
        emb = got.get("emb", [0, 0])
        assert emb[0] == (1 if p > 1 and model.tied_embeddings and stage in (0, p - 1) else 0)
        assert meta["pp"]["collectives"] == want["pp"][0] + emb[0]
        assert meta["pp"]["bytes"] - want["pp"][1] == emb[0] * 4 * padded_vocab(model, t) * model.hidden // t
        assert got.get("dp", [0, 0])[0] == meta["dp"]["collectives"]
        assert got.get("dp", [0, 0])[0] == (2 if d > 1 else 0) + (2 if d // e > 1 and e > 1 else 0)


@pytest.mark.parametrize(("t", "p", "d"), [(2, 2, 2), (1, 4, 2), (4, 1, 2)])
def test_the_data_parallel_shard_is_the_stages_parameters_over_tp(t, p, d):
    s = build(STAR8, tp=t, pp=p, dp=d)
    for stage in range(p):
        shard = gpt_shard(TINY_GPT, t, p, stage)
        assert s.meta["stages"][stage]["dp"] == {"collectives": 2, "bytes": 4 * shard + 2 * shard}
        names = [seg.name for seg in s.segments if seg.name.startswith("dp") and seg.name.endswith(f"s{stage}")]
        assert names == [f"dp rs s{stage}", f"dp ag s{stage}"]
    total = sum(gpt_shard(TINY_GPT, t, p, st) for st in range(p)) * t
    tied_copy = padded_vocab(TINY_GPT, t) * TINY_GPT.hidden if p > 1 else 0
    padding = (padded_vocab(TINY_GPT, t) - TINY_GPT.vocab) * TINY_GPT.hidden
    # every parameter once over the ranks of one data-parallel replica, but norms and row-parallel biases on every
    # TP rank, the tied embedding's copy on the last stage and the vocabulary padding
    replicated = (t - 1) * (TINY_GPT.layers * 6 * TINY_GPT.hidden + TINY_GPT.seq_length * TINY_GPT.hidden
                            + 2 * TINY_GPT.hidden)
    assert total == TINY_GPT.parameters + tied_copy + padding + replicated


def moe_shard(m: TransformerModel, t: int, p: int, e: int, stage: int) -> tuple[int, int]:
    """One rank's ``(dense, expert)`` parameters of a Mixtral-shaped model (SwiGLU, RMSNorm, no biases, rotary
    positions, untied output layer). Megatron-Core gives each rank ``experts / e`` local experts
    (``num_moe_experts // expert_model_parallel_size``), each split over the expert tensor-parallel size, which
    defaults to ``t``; the router and the norms are whole on every tensor-parallel rank."""
    h, f, hd = m.hidden, m.ffn, m.hidden // m.heads
    attention = h * (m.heads * hd + 2 * m.kv_heads * hd) + m.heads * hd * h  # Q, K, V, then the output projection
    swiglu = 3 * h * f  # gate, up and down
    dense = expert = 0
    for layer in range(stage * m.layers // p, (stage + 1) * m.layers // p):
        moe = layer % m.moe_layer_freq == 0
        dense += attention // t + 2 * h + (h * m.experts if moe else swiglu // t)
        expert += m.experts // e * swiglu // t if moe else 0
    if stage == 0:
        dense += padded_vocab(m, t) * h // t
    if stage == p - 1:
        dense += h + padded_vocab(m, t) * h // t  # the final norm and the output layer
    return dense, expert


@pytest.mark.parametrize(("t", "p", "d", "e"), [(2, 1, 4, 2), (1, 2, 4, 2), (1, 1, 8, 2), (1, 1, 8, 4), (2, 1, 2, 2)])
def test_the_expert_data_parallel_shard_is_the_local_experts_over_tp(t, p, d, e):
    """The distributed optimizer's collectives of a mixture of experts: dense parameters over the data-parallel
    group of ``d``, the rank's local experts over the expert-data-parallel group of ``d / e`` (the ranks of one
    expert-parallel index: ``dp mod e``), fp32 gradients reduce-scattered and bf16 parameters all-gathered."""
    spec = "star:hosts=4" if t * p * d == 4 else STAR8
    s = build(spec, TINY_MOE, tp=t, pp=p, dp=d, ep=e, sequence_parallel=t > 1)

    def rank(ti: int, di: int, si: int) -> int:
        return ti + t * (di + d * si)

    segments = {seg.name: seg for seg in s.segments}
    for stage in range(p):
        dense, expert = moe_shard(TINY_MOE, t, p, e, stage)
        has_experts = d // e > 1
        assert s.meta["stages"][stage]["dp"] == {"collectives": 2 + 2 * has_experts,
                                                 "bytes": 6 * dense + 6 * expert * has_experts}
        want = {f"dp rs s{stage}": 4 * dense, f"dp ag s{stage}": 2 * dense}
        if has_experts:
            want |= {f"dp rs expert s{stage}": 4 * expert, f"dp ag expert s{stage}": 2 * expert}
        assert sorted(n for n in segments if n.startswith("dp") and n.endswith(f"s{stage}")) == sorted(want)
        dp_groups = {tuple(rank(ti, di, stage) for di in range(d)) for ti in range(t)}
        edp_groups = {tuple(rank(ti, k * e + j, stage) for k in range(d // e)) for ti in range(t) for j in range(e)}
        for name, nbytes in want.items():
            seg = segments[name]
            assert set(seg.groups) == (edp_groups if "expert" in name else dp_groups), name
            assert nbytes <= seg.chunks * s.chunk_bytes <= 1.2 * nbytes, name
    assert executor.execute(s).valid


def test_padding_adds_up_and_every_segment_is_named_by_its_kind():
    s = build(STAR8, tp=2, pp=2, dp=2)
    kinds = {seg.name.split()[0] for seg in s.segments}
    assert kinds == {"tp", "pp", "dp"}
    names = [seg.name for seg in s.segments]
    assert "tp fwd L0 mb0 attn ar" in names and "tp bwd L3 mb2 mlp ar" in names and "tp fwd emb mb1 embedding ar" \
        in names and "tp bwd head mb0 output ar" in names
    assert "pp act s0->s1 mb2" in names and "pp grad s1->s0 mb0" in names and "pp emb ar" in names
    raw = llm.raw_sizes(llm.LlmConfig(TINY_GPT, 2, 2, 2, microbatches=3))
    padded = sum(seg.chunks for seg in s.segments) * s.chunk_bytes
    assert padded - sum(raw) == s.meta["padding_bytes"] and 0 <= s.meta["padding_fraction"] <= 0.2


def test_layers_per_collective_fuses_collectives_but_keeps_bytes_and_compute():
    one = build(STAR8, tp=2, pp=2, dp=2)
    two = build(STAR8, tp=2, pp=2, dp=2, layers_per_collective=2)
    assert executor.execute(two).valid
    for a, b in zip(one.meta["stages"], two.meta["stages"], strict=True):
        assert a["tp"]["bytes"] == b["tp"]["bytes"] and b["tp"]["collectives"] == 3 * (4 + 1)
        assert a["forward_s"] == pytest.approx(b["forward_s"]) and a["backward_s"] == pytest.approx(b["backward_s"])
    assert one.meta["compute_only_s"] == pytest.approx(two.meta["compute_only_s"])
    assert "tp fwd L0-1 mb0 attn ar" in [seg.name for seg in two.segments]


def test_scale_divides_bytes_and_compute_and_is_recorded():
    one = build(STAR8, tp=2, pp=2, dp=2)
    ten = build(STAR8, tp=2, pp=2, dp=2, scale=10)
    assert training.workload_scale(ten) == 10 and training.workload_scale(one) == 1
    assert ten.meta["compute_only_s"] == pytest.approx(one.meta["compute_only_s"] / 10)
    assert ten.meta["real_compute_only_s"] == pytest.approx(one.meta["compute_only_s"])
    assert ten.meta["stages"] == one.meta["stages"]  # real sizes
    assert ten.size < one.size / 5


@pytest.mark.parametrize("algo", ["hd", "hdrm", "direct"])
def test_other_data_and_tensor_parallel_algorithms_prove(algo):
    s = build(STAR8, tp=2, pp=1, dp=4, dp_algo=algo, tp_algo="hd" if algo != "direct" else "rd")
    assert executor.execute(s).valid and s.meta["dp_algo"] == algo


# ---------------------------------------------------------------------------
# The named models at 64 ranks
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "t", "p", "d", "sp"), [("gpt3-13b", 8, 2, 4, False), ("llama2-7b", 8, 2, 4, True)])
def test_named_models_generate_and_prove_at_64_ranks_with_tp_inside_servers(name, t, p, d, sp):
    """Coarse (2 microbatches, a stage's layers as one block) to stay fast; the full-size case is measured in the
    docs. The placement keeps every TP group in one server."""
    topo = topology.build(SERVERS64)
    m = MODELS[name]
    s = llm.gen(name, topo, tp=t, pp=p, dp=d, microbatches=2, layers_per_collective=m.layers // p,
                sequence_parallel=sp, scale=1000)
    assert executor.execute(s).valid
    for r in s.meta["ranks"]:
        assert r["server"] == r["rank"] // 8 and r["tp"] == r["rank"] % 8
    assert "every TP group inside one server" in llm.describe(s)[0]
    stage0 = s.meta["stages"][0]
    assert stage0["tp"]["collectives"] == 2 * ((8 if sp else 4) + (2 if sp else 1))
    assert s.meta["bytes_per_rank"]["dp"] == max(st["dp"]["bytes"] for st in s.meta["stages"])
    assert timing.compute_only_s(s) == pytest.approx(s.meta["compute_only_s"])


# ---------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------

def test_megatron_order_puts_tp_groups_in_a_server_and_dp_pp_across():
    s = build(SERVERS8, tp=2, pp=2, dp=2)
    ranks = s.meta["ranks"]
    assert [(r["tp"], r["dp"], r["pp"]) for r in ranks[:4]] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
    assert all(r["server"] == r["rank"] // 2 for r in ranks)
    lines = llm.describe(s)
    assert "every TP group inside one server" in lines[0]
    assert lines[1] == "  server 0 (h1-h2): ranks 0-1: pp 0, dp 0, tp 0-1"


def test_a_placement_file_overrides_the_order(tmp_path):
    topo = topology.build(SERVERS8)
    hosts = [f"h{i}" for i in (1, 3, 2, 4, 5, 7, 6, 8)]  # every TP pair split over two servers
    path = tmp_path / "place.yaml"
    path.write_text("\n".join(f"- {h}" for h in hosts) + "\n")
    s = llm.gen("llama2-7b", topo, tp=2, pp=2, dp=2, microbatches=1, layers_per_collective=16, scale=1000,
                placement_file=str(path))
    assert s.hosts == hosts and s.placement == f"file {path}"
    assert "4 of 4 TP groups span servers" in llm.describe(s)[0]


@pytest.mark.parametrize(("text", "field"), [
    ('["h1", "h2"]', "hosts"),
    ('["h1", "h2", "h3", "h4", "h5", "h6", "h7", "h99"]', "hosts[7]"),
    ('["h1", "h2", "h3", "h4", "h5", "h6", "h7", "h1"]', "hosts[7]"),
    ('{"hosts": []}', "hosts"),
])
def test_a_bad_placement_file_names_its_field(tmp_path, text, field):
    path = tmp_path / "place.json"
    path.write_text(text)
    with pytest.raises(FieldError) as err:
        llm.gen("llama2-7b", topology.build(STAR8), tp=2, pp=2, dp=2, placement_file=str(path))
    assert err.value.field == field and "\n" not in str(err.value)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "kw", "field"), [
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 4}, "dp"),
    ("gpt3-13b", {"tp": 8, "pp": 1, "dp": 2}, "dp"),
    ("llama2-7b", {"tp": 1, "pp": 3, "dp": 2, "topo": "star:hosts=6"}, "pp"),
    ("gpt3-13b", {"tp": 1, "pp": 3, "dp": 2, "topo": "star:hosts=6"}, "pp"),
    ("gpt3-13b", {"tp": 3, "pp": 1, "dp": 2, "topo": "star:hosts=6"}, "tp"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "ep": 2}, "ep"),
    ("mixtral-8x7b", {"tp": 2, "pp": 1, "dp": 4, "ep": 2}, "sequence_parallel"),
    ("mixtral-8x7b", {"tp": 1, "pp": 1, "dp": 8, "ep": 3}, "ep"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "layers_per_collective": 3}, "layers_per_collective"),
    ("gpt3-13b", {"tp": 2, "pp": 1, "dp": 3, "dp_algo": "hdrm", "topo": "star:hosts=6"}, "dp_algo"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "dp_algo": "dbtree"}, "dp_algo"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "tp_algo": "bogus"}, "tp_algo"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "scale": 0.5}, "scale"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "microbatches": 0}, "microbatches"),
    ("gpt3-13b", {"tp": 2, "pp": 2, "dp": 2, "accelerator": "tpu"}, "accelerator"),
    ("gpt3-175b", {"tp": 2, "pp": 2, "dp": 2}, "model"),
])
def test_bad_input_names_its_field(model, kw, field):
    topo = topology.build(kw.pop("topo", STAR8))
    with pytest.raises(FieldError) as err:
        llm.gen(model, topo, **kw)
    assert err.value.field == field and "\n" not in str(err.value)


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

def test_cli_writes_an_iteration_and_prints_its_placement(tmp_path, capsys):
    out = str(tmp_path / "it.json")
    assert main(["schedule", "gen", "--model", "llama2-7b", "--tp", "2", "--pp", "2", "--dp", "2",
                 "--microbatches", "2", "--layers-per-collective", "16", "--sequence-parallel", "--algo", "hd",
                 "--scale", "100", "--topology", SERVERS8, "-o", out]) == 0
    text = capsys.readouterr().out
    assert "megatron-1f1b, 8 ranks" in text and "every TP group inside one server" in text
    assert "server 3 (h7-h8): ranks 6-7: pp 1, dp 1, tp 0-1" in text and "48 segments (tp 40, pp 4, dp 4)" in text
    data = json.loads(open(out).read())
    assert data["meta"]["parallel"]["sequence_parallel"] and data["meta"]["dp_algo"] == "hd"
    assert main(["schedule", "check", out]) == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "gpt3-13b", "--tp", "2", "--pp", "2", "--topology", STAR8], "field 'dp'"),
    (["--model", "gpt3-13b", "--tp", "2", "--pp", "2", "--dp", "2", "--size", "1MiB", "--topology", STAR8],
     "field 'size'"),
    (["--model", "resnet50", "--algo", "ring", "--tp", "2", "--topology", STAR8], "field 'tp'"),
    (["--size", "1MiB", "--topology", STAR8], "field 'algo'"),
    (["--model", "gpt3-13b", "--tp", "3", "--pp", "1", "--dp", "2", "--topology", "star:hosts=6"], "field 'tp'"),
])
def test_cli_refuses_bad_options_naming_the_field(tmp_path, capsys, args, message):
    assert main(["schedule", "gen", *args, "-o", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
