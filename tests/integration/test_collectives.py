"""Every collective over real TCP with its data check on every rank: our generators, public MSCCL algorithm
files (several channels per pair: a connection per lane), ASTRA-sim's Chakra traces (per collective, and its
MSCCL-generated point-to-point allreduce), on one star network per rank count; and lanes under ECMP. Then
issue 31's: any size on any rank count, mlcommons/chakra's PyTorch-recorded ResNet-50 trace, collectives within
process groups, and a Megatron-LM iteration.

The files are in tests/data/msccl and tests/data/chakra (sources and licences in their SOURCES.md).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import tarfile

import pytest
from chakra.schema.protobuf import et_def_pb2 as pb

from emulator.base.naming import switch_intf
from emulator.emulation.machine import calibration_file
from emulator.emulation.session import fidelity
from emulator.emulation.session.replay import ReplaySession, lanes_of
from emulator.model import fabric, routing, topology
from emulator.model.collectives import generators, msccl
from emulator.model.prediction import cost
from emulator.model.schedule.format import Schedule, match_transfers
from emulator.model.workloads import chakra, llm, llm_models
from emulator.model.workloads.chakra_groups import ProcessGroup

from .measured import band
from .soak_only import soak_only

pytestmark = pytest.mark.integration

DATA = os.path.join(os.path.dirname(__file__), "..", "data")
SIZE = 256 << 10
#: The lanes test's measured repetitions, and its bands (docs/testing-accuracy.md: the documented accuracy plus the
#: noise measured here): a switch link's counted bytes against the payload route() puts on it (frame headers and the
#: reverse flows' ACKs add about 1 %), and the run's measured/predicted time.
LANES_REPEAT = 2
LINK_BYTES_BAND = (0.98, 1.06)
ACK_SLACK_BYTES = 16 << 10
COLLECTIVE_BAND = band(noise=0.035)


def _session(spec: str, policy: str = "shortest", lanes: int = 1) -> tuple[ReplaySession, topology.Topology]:
    profile = fabric.default()
    topo = topology.load(spec, profile.emulated_link_mbps)
    model = fidelity.latency_model(profile, calibration_file.load_calibration(profile.emulated_mtu))
    return ReplaySession(topo, policy, latency=model, lanes=lanes), topo


def _replay_all(session: ReplaySession, schedules: dict[str, Schedule], out) -> None:
    """Replay each schedule once; every rank's data check must pass, and every recorded message be delivered."""
    for name, schedule in schedules.items():
        res = session.run(schedule, str(out / name), repeat=1, warmup=0)
        assert res.status == "ok", (name, res.error)
        assert all(rep.correct for rep in res.repetitions), name
        assert res.config["collective"] == schedule.collective
        timeline = (out / name / "timeline.jsonl").read_text().splitlines()
        transfers = [line for line in timeline if '"kind": "compute"' not in line]
        assert len(transfers) == len(match_transfers(schedule)), name
        summary = res.summary()
        assert summary is not None and summary.busbw_mbps > 0, name


def _chakra(kind: str, npus: int) -> list[str]:
    return sorted(glob.glob(os.path.join(DATA, "chakra", "microbenchmarks", kind, f"{npus}npus_1MB", "*.et")))


def test_eight_ranks_every_collective_msccl_lanes_and_chakra_traces(tmp_path):
    session, topo = _session("star:hosts=8", lanes=1)
    schedules = {
        f"{collective}-{algo}": generators.generate(algo, topo, SIZE, collective=collective, root=3)
        if collective in ("broadcast", "reduce") else generators.generate(algo, topo, SIZE, collective=collective)
        for collective, algo in [("reduce_scatter", "ring"), ("allgather", "hd"), ("alltoall", "direct"),
                                 ("broadcast", "dbtree"), ("reduce", "hd")]
    }
    schedules["msccl-r48ll"] = msccl.load(os.path.join(DATA, "msccl", "r48ll.xml"), SIZE)
    schedules["msccl-a2a2ll"] = msccl.load(os.path.join(DATA, "msccl", "a2a2ll.xml"), SIZE)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        schedules[f"chakra-{kind}"] = chakra.load(_chakra(kind, 8), algo="ring" if kind != "all_to_all" else "direct")
    p2p = chakra.load(sorted(glob.glob(os.path.join(DATA, "chakra", "custom_ring_allreduce_8npus_1MB", "*.et"))))
    schedules["chakra-msccl-p2p"] = p2p
    assert lanes_of(schedules["msccl-r48ll"]) == 32 and p2p.collective in ("p2p", "mixed")
    with session:
        _replay_all(session, schedules, tmp_path)
    # the point-to-point trace: every recorded byte crossed, each message as recorded (8 ranks x 14 x 128 KiB)
    assert sum(op.bytes for r in p2p.ranks for op in r.ops if op.kind == "send") == 8 * 14 * 131072


def _resnet_trace(directory) -> str:
    """mlcommons/chakra's ResNet-50 trace, recorded on one rank of a PyTorch DDP job (tests/data/chakra/SOURCES.md)."""
    with tarfile.open(os.path.join(DATA, "chakra", "feeder_tests_trace.tar.gz")) as tar:
        member = tar.extractfile("tests/data/chakra.0.et")
        assert member is not None
        (directory / "resnet.0.et").write_bytes(member.read())
    return str(directory / "resnet.0.et")


def _hybrid_trace(directory) -> list[str]:
    """An 8-rank step as PyTorch records it with process groups: each rank's pg_config metadata, then a
    tensor-parallel pair's allreduce, a data-parallel group's (4 ranks) reduce-scatter and an allreduce of all."""
    tp = [(0, 1), (2, 3), (4, 5), (6, 7)]
    dp = [(0, 2, 4, 6), (1, 3, 5, 7)]
    pgs = [ProcessGroup("0", (), 8, "default_pg")] + [ProcessGroup(str(1 + i), g) for i, g in enumerate(tp + dp)]
    paths = []
    for r in range(8):
        mine = [g for g in pgs if not g.ranks or r in g.ranks]
        tp_pg = next(g.name for g in mine if g.ranks in tp)
        dp_pg = next(g.name for g in mine if g.ranks in dp)
        nodes = [chakra.pg_init_node(1, mine), chakra.comp_node(2, "fwd", 200, deps=[1]),
                 chakra.coll_node(3, "tp ar", pb.ALL_REDUCE, 64 << 10, tp_pg, deps=[2]),
                 chakra.comp_node(4, "bwd", 400, deps=[3]),
                 chakra.coll_node(5, "dp rs", pb.REDUCE_SCATTER, 128 << 10, dp_pg, deps=[4]),
                 chakra.coll_node(6, "world ar", pb.ALL_REDUCE, 16 << 10, "0", deps=[5])]
        paths.append(str(directory / f"hybrid.{r}.et"))
        chakra.write_trace(paths[-1], nodes)
    return paths


@soak_only("three replays with their data on one network (88 s under load, docs/testing-accuracy.md 2026-12-06); "
           "in make test the unit tests prove these schedules and the eight-rank test replays every collective")
def test_any_size_process_groups_a_pytorch_trace_and_a_language_model_replay_with_their_data(tmp_path):
    """Issue 31's schedules over real TCP on one network, every rank's data checked:
    - 1 MiB on 6, 10 and 12 ranks by ring (chunks one element apart), hd (extra ranks folded in) and dbtree;
    - mlcommons/chakra's ResNet-50 trace, one rank of a PyTorch DDP job replicated to 8 ranks and scaled by 1000
      (its 1209 GPU kernels as compute, its 7 collectives over every rank);
    - a Chakra trace with process groups (tensor-parallel pairs, data-parallel groups of 4), each collective
      within its groups;
    - a Megatron-LM iteration of a small GPT (TP 2, PP 2, DP 2: 1F1B messages between the stages, the
      distributed optimizer's reduce-scatter and all-gather after them)."""
    schedules = {f"{algo}-{p}": generators.generate(algo, topology.build(f"star:hosts={p}"), 1 << 20)
                 for p in (6, 10, 12) for algo in ("ring", "hd", "dbtree")}
    assert not schedules["ring-6"].layout.equal
    resnet = chakra.load([_resnet_trace(tmp_path)], ranks=8, scale=1000)
    assert resnet.compute_ops == 8 * 1209 and len(resnet.segments) == 7
    trace = chakra.load(_hybrid_trace(tmp_path))
    assert [(seg.collective, len(seg.groups)) for seg in trace.segments] == [
        ("allreduce", 4), ("reduce_scatter", 2), ("allreduce", 0)]
    tiny = dataclasses.replace(llm_models.MODELS["gpt3-13b"], name="tiny-gpt", layers=4, hidden=64, heads=8,
                               ffn=256, seq_length=32, vocab=1000)
    iteration = llm.iteration(topology.build("star:hosts=8"), llm.LlmConfig(tiny, tp=2, pp=2, dp=2, microbatches=2),
                              max_padding=0.2)
    assert {seg.name.split()[0] for seg in iteration.segments} == {"tp", "pp", "dp"}
    schedules.update({"resnet50-trace": resnet, "hybrid-trace": trace, "tiny-gpt": iteration})
    session, _ = _session("star:hosts=12")
    with session:
        _replay_all(session, schedules, tmp_path)


def test_four_ranks_msccl_allgather_and_reduce_scatter(tmp_path):
    session, _ = _session("star:hosts=4")
    schedules = {name: msccl.load(os.path.join(DATA, "msccl", f"{name}.xml"), 288 << 10)  # 24 chunks of ar_tree
                 for name in ("ag_hier_4_LL", "reduce_scatter_ring_4gpus_2channels", "ar_tree_12_LL")}
    assert [s.collective for s in schedules.values()] == ["allgather", "reduce_scatter", "allreduce"]
    with session:
        _replay_all(session, schedules, tmp_path)


def _switch_link_bytes(topo: topology.Topology, links_jsonl: str) -> dict[int, dict[tuple[str, str], int]]:
    """Per repetition, the bytes each switch sent to each other switch, as its port's tc qdisc counted them."""
    port_of = {switch_intf(a, link.port_of(a)): (a, b) for link in topo.links if link.kind != "host"
               for a, b in ((link.a, link.b), (link.b, link.a))}
    out: dict[int, dict[tuple[str, str], int]] = {}
    for line in open(links_jsonl).read().splitlines():
        rec = json.loads(line)
        if rec.get("source") == "tc" and rec["interface"] in port_of:
            out.setdefault(rec["rep"], {})[port_of[rec["interface"]]] = rec["bytes"]
    return out


def test_lanes_under_ecmp_each_take_their_own_hashed_path(tmp_path):
    """An 8-rank ring with 4 channels on an ECMP leaf-spine: the controller routes every lane's 5-tuple.

    What the switches counted says so: each leaf sends its cross-leaf neighbour's lanes over both spines (one
    connection per pair would load one uplink per leaf), and every switch-to-switch link carries the bytes
    :func:`emulator.model.prediction.cost.transfers` routes over it (each lane's own 5-tuple hashed, seed 0)."""
    session, topo = _session("leafspine:leaves=4,spines=2,hosts_per_leaf=2", "ecmp", lanes=4)
    schedule = msccl.load(os.path.join(DATA, "msccl", "allreduce_ring_8gpus_4channels_1instance.xml"), SIZE)
    assert lanes_of(schedule) == 4
    with session:
        _replay_all(session, {"ring-4-lanes": schedule}, tmp_path)
        res = session.run(schedule, str(tmp_path / "again"), repeat=LANES_REPEAT, warmup=0)
    predicted: dict[tuple[str, str], int] = {}
    for t in cost.transfers(schedule, topo, "ecmp", seed=session.seed):
        for link in routing.switch_links_of(t.path):
            predicted[link] = predicted.get(link, 0) + t.bytes
    counted = _switch_link_bytes(topo, str(tmp_path / "again" / "links.jsonl"))
    assert sorted(counted) == list(range(LANES_REPEAT)), sorted(counted)
    leaves = sorted({h.switch for h in topo.hosts}, key=topology.node_sort_key)
    for rep, measured in counted.items():
        for leaf in leaves:
            up = {b: n for (a, b), n in measured.items() if a == leaf}
            # ACKs alone are under 1 % of the data; a spine with under a tenth of the leaf's bytes carried no lane
            spread = [b for b, n in up.items() if n > 0.1 * sum(up.values())]
            assert len(spread) == len(up) == 2, f"rep {rep}: {leaf}'s uplinks carried {up}: the lanes share a spine"
        print(f"lanes rep {rep}: counted/routed bytes per switch link " + ", ".join(
            f"{a}->{b} {measured.get((a, b), 0) / predicted[(a, b)]:.3f}" for a, b in sorted(predicted)))
        for link in sorted(set(predicted) | set(measured)):
            want, got = predicted.get(link, 0), measured.get(link, 0)
            assert LINK_BYTES_BAND[0] * want <= got <= LINK_BYTES_BAND[1] * want + ACK_SLACK_BYTES, \
                f"rep {rep}: {link[0]}->{link[1]} counted {got} bytes, route() puts {want} on it"
    summary = res.summary()
    ratio = summary.measured_over_predicted if summary is not None else None
    print(f"lanes: measured/predicted time {ratio}")
    assert ratio is not None and COLLECTIVE_BAND[0] < ratio < COLLECTIVE_BAND[1], ratio
