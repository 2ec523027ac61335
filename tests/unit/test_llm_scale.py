"""The hybrid-parallel iteration grown to more accelerators: the data-parallel phase's change, by the model."""

from __future__ import annotations

import pytest
from test_llm import TINY_GPT

from emulator.model import fabric, topology
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import check
from emulator.model.workloads import llm, llm_scale

#: 8 accelerators in 4 servers of 2, a NIC each, on BiGraph 2/2/2.
SPEC = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=4,accels_per_server=2,nics_per_server=2,nic_placement=hdrm"


def _config(dp: int) -> llm.LlmConfig:
    return llm.LlmConfig(TINY_GPT, tp=2, pp=2, dp=dp, microbatches=2)


def test_the_dp_phase_alone_is_the_iterations_dp_segments_and_proves():
    topo = topology.build(SPEC)
    phase = llm.dp_phase(topo, _config(2), dp_algo="hdrm")
    whole = llm.iteration(topo, _config(2), dp_algo="hdrm")
    assert [s.name for s in phase.segments] == [s.name for s in whole.segments if s.name.split()[0] == "dp"
                                                 or s.name == "pp emb ar"]
    assert [s.groups for s in phase.segments] == [s.groups for s in whole.segments if s.name in
                                                  {p.name for p in phase.segments}]
    assert check(phase, topo, "bigraph").valid


def test_growing_adds_the_dp_phases_change_and_keeps_the_compute():
    profile = fabric.default()
    points = llm_scale.grow(SPEC, "bigraph", _config(2), "hdrm", 1.0, profile, iteration_s=10.0,
                            compute_only_s=6.0, hosts=(32, 12))
    big, odd = points
    assert big.hosts == 32 and big.dp == 8 and big.topology is not None and big.dp_phase_s
    here = llm_scale.dp_phase_s(topology.at_link_rate(SPEC, profile.emulated_link_mbps), "bigraph", _config(2),
                                "hdrm", 1.0, profile)
    assert big.iteration_s == pytest.approx(10.0 - here + big.dp_phase_s)
    assert big.efficiency == pytest.approx(6.0 / big.iteration_s)
    assert big.real_iteration_s == pytest.approx(big.iteration_s / profile.dilation)
    # 12 accelerators are not 3 replicas of a design that grows: said, not guessed
    assert odd.iteration_s is None and odd.why


def test_the_unproved_timing_is_the_checked_prediction():
    topo = topology.build(SPEC)
    phase = llm.dp_phase(topo, _config(2), dp_algo="hdrm")
    assert llm_scale.dp_phase_s(SPEC, "bigraph", _config(2), "hdrm", 1.0, fabric.default()) == pytest.approx(
        check(phase, topology.build(SPEC, fabric.default().emulated_link_mbps), "bigraph",
              latency=LatencyModel(fabric.default()),
              mtu=fabric.default().emulated_mtu).predicted_time_s)
