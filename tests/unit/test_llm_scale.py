"""The hybrid-parallel iteration grown to more accelerators: the data-parallel phase's change, by the model.

Expected values are computed here: the grown designs and data-parallel degrees by hand, each rank's bytes
from Megatron's distributed optimizer (4 bytes per parameter of the rank's shard reduce-scattered, 2
all-gathered: test_llm.gpt_shard) and the collectives' bytes per rank ((p-1)/p of the buffer for a
reduce-scatter or all-gather, 2(p-1)/p for an allreduce: docs/schedule-format.md), and the phase's times
from the proved prediction (:func:`~emulator.model.prediction.check.check`) rather than the projection's own.
"""

from __future__ import annotations

import pytest
from test_llm import TINY_GPT, gpt_shard, padded_vocab

from emulator.model import fabric, topology
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import check
from emulator.model.schedule.format import SEND, Schedule
from emulator.model.workloads import llm, llm_scale

#: 8 accelerators in 4 servers of 2, a NIC each, on BiGraph 2/2/2.
SPEC = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=4,accels_per_server=2,nics_per_server=2,nic_placement=hdrm"
#: The same design at 16 accelerators (dp 4), its links at the profile's 50 Mbit/s.
SPEC16 = ("bigraph:upper=4,lower=4,hosts_per_switch=2,bw=50,servers=8,accels_per_server=2,nics_per_server=2,"
          "nic_placement=hdrm")
#: A cell's workload scale, and the fabric it replays on: 100 Gbit/s dilated 2000 times, latencies over the scale.
SCALE = 4
PROFILE = fabric.for_workload_scale(fabric.default().changed(dilation=2000), SCALE)


def _config(dp: int) -> llm.LlmConfig:
    return llm.LlmConfig(TINY_GPT, tp=2, pp=2, dp=dp, microbatches=2)


def _proved_phase_s(spec: str, dp: int) -> float:
    topo = topology.build(spec, PROFILE.emulated_link_mbps, PROFILE.domain_ratio)
    report = check(llm.dp_phase(topo, _config(dp), dp_algo="hdrm", scale=SCALE), topo, "bigraph",
                   latency=LatencyModel(PROFILE), mtu=PROFILE.emulated_mtu)
    assert report.valid
    return report.predicted_time_s


def _sent_bytes(phase: Schedule, rank: int) -> dict[str, int]:
    """Bytes ``rank`` sends in the phase's data-parallel collectives and in the tied embedding's allreduce."""
    out = {"dp": 0, "emb": 0}
    for op in phase.ranks[rank].ops:
        for seg in phase.segments:
            if op.kind == SEND and op.buffer == "data" and seg.chunk <= op.chunk < seg.chunk + seg.chunks:
                out["emb" if seg.name == "pp emb ar" else "dp"] += op.bytes
    return out


def test_the_dp_phase_alone_is_the_iterations_dp_segments_and_proves():
    topo = topology.build(SPEC)
    phase = llm.dp_phase(topo, _config(2), dp_algo="hdrm")
    whole = llm.iteration(topo, _config(2), dp_algo="hdrm")
    assert [s.name for s in phase.segments] == [s.name for s in whole.segments if s.name.split()[0] == "dp"
                                                 or s.name == "pp emb ar"]
    assert [s.groups for s in phase.segments] == [s.groups for s in whole.segments if s.name in
                                                  {p.name for p in phase.segments}]
    assert check(phase, topo, "bigraph").valid


@pytest.mark.parametrize(("hosts", "dp"), [(8, 2), (16, 4), (32, 8)])
def test_each_rank_of_the_grown_phase_moves_its_shard_by_the_collectives_formulas(hosts, dp):
    """Weak scaling: a rank's shard stays, the share of it each rank sends grows as (D-1)/D; the tied
    embedding's allreduce between the first and last stage stays."""
    grown = topology.grown_spec(SPEC, hosts)
    assert grown is not None
    phase = llm.dp_phase(topology.build(grown), _config(dp), dp_algo="hdrm", scale=SCALE)
    embedding = 4 * padded_vocab(TINY_GPT, 2) * TINY_GPT.hidden // 2 / SCALE
    for rank in range(hosts):
        stage = next(int(seg.name[-1]) for seg in phase.segments if seg.name.startswith("dp rs")
                     and any(rank in g for g in seg.groups))
        sent = _sent_bytes(phase, rank)
        shard = gpt_shard(TINY_GPT, 2, 2, stage) / SCALE
        assert sent["dp"] == pytest.approx((dp - 1) / dp * (4 * shard + 2 * shard), rel=0.01)
        assert sent["emb"] == pytest.approx(2 * (2 - 1) / 2 * embedding, rel=0.01)


def test_growing_adds_the_proved_dp_phases_change_and_keeps_the_compute():
    here, there = _proved_phase_s(topology.at_link_rate(SPEC, 50), 2), _proved_phase_s(SPEC16, 4)
    assert there > here  # each rank sends 3/4 of its shard where it sent 1/2
    big, odd = llm_scale.grow(SPEC, "bigraph", _config(2), "hdrm", SCALE, PROFILE, iteration_s=10.0,
                              compute_only_s=6.0, hosts=(16, 12))
    assert (big.hosts, big.topology, big.dp) == (16, SPEC16, 4)
    assert big.dp_phase_s == pytest.approx(there, rel=1e-9)
    assert big.iteration_s == pytest.approx(10.0 - here + there, rel=1e-9)
    assert big.efficiency == pytest.approx(6.0 / (10.0 - here + there), rel=1e-9)
    # emulated seconds of the run at scale 4 on links dilated 2000 times: the real full-size iteration
    assert big.real_iteration_s == pytest.approx((10.0 - here + there) / 2000 * 4, rel=1e-9)
    # 12 accelerators are not 3 replicas of a design that grows: said, not guessed
    assert odd.iteration_s is None and odd.topology is None and "12 accelerators" in odd.why


def test_the_phase_grows_with_the_data_parallel_degree_and_the_efficiency_falls():
    points = llm_scale.grow(SPEC, "bigraph", _config(2), "hdrm", SCALE, PROFILE, iteration_s=10.0,
                            compute_only_s=6.0, hosts=(16, 32, 64))
    phases = [p.dp_phase_s for p in points]
    efficiencies = [p.efficiency for p in points]
    assert [p.dp for p in points] == [4, 8, 16] and None not in phases and None not in efficiencies
    assert phases == sorted(phases) and len(set(phases)) == 3
    assert efficiencies == sorted(efficiencies, reverse=True)
    # no faster than the busiest rank's bytes through its one 50 Mbit/s link
    for p in points:
        assert p.topology is not None
        phase = llm.dp_phase(topology.build(p.topology), _config(p.dp), dp_algo="hdrm", scale=SCALE)
        busiest = max(sum(_sent_bytes(phase, r).values()) for r in range(p.hosts))
        assert p.dp_phase_s >= busiest * 8 / 50e6
