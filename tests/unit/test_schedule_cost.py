"""Contention counts and the alpha-beta and max-min fair cost models."""

from __future__ import annotations

import pytest

from emulator import fabric, topology
from emulator.latency import LatencyModel
from emulator.schedule.check import check
from emulator.schedule.cost import (
    allreduce_formula,
    analyze,
    bus_bandwidth_mbps,
    maxmin_completion,
    maxmin_rates,
)
from emulator.schedule.generators import generate
from emulator.topology import DEFAULT_MTU, tcp_goodput_factor, tcp_payload_bytes


def _beta(topo: topology.Topology, mtu: int = DEFAULT_MTU) -> float:
    return 1 / (topo.host_bw * 1e6 / 8 * tcp_goodput_factor(mtu))


def _profile(alpha_us: float, switch_us: float) -> LatencyModel:
    return LatencyModel(fabric.parse(f"alpha_us={alpha_us},switch_latency_us={switch_us},dilation=10000"))


@pytest.mark.parametrize("algo, p", [("ring", 5), ("ring", 8), ("hd", 8), ("hd", 16), ("hdrm", 8)])
def test_step_sums_match_the_closed_forms_without_contention(algo, p):
    spec = f"star:hosts={p}" if algo != "hdrm" else "bigraph:upper=2,lower=2,hosts_per_switch=2"
    topo = topology.build(spec)
    n = 4 * p * 1024
    costs = analyze(generate(algo, topo, n), topo, "shortest", latency=_profile(0, 0))
    switches = 1 if algo != "hdrm" else 2  # hdrm's partners sit in opposite groups
    expected = allreduce_formula(algo, p, n, 0.0, _beta(topo), switches=switches, frame=tcp_payload_bytes())
    if algo == "ring":  # the lockstep sum charges every step what the pipelined closed form charges once
        expected += 2 * (p - 1) * 0.0
    assert costs.alpha_beta_time_s == pytest.approx(expected, rel=1e-9)
    assert costs.maxmin_time_s == pytest.approx(costs.alpha_beta_time_s, rel=1e-9)  # no link is shared


@pytest.mark.parametrize("algo, p, n", [("ring", 4, 64 << 10), ("ring", 16, 1 << 20), ("ring", 16, 4096 * 16),
                                        ("hd", 8, 64 << 10), ("hd", 16, 16 << 20), ("hd", 16, 64 * 16)])
@pytest.mark.parametrize("alpha_us, switch_us", [(8.0, 0.0), (8.0, 1.0), (0.0, 0.0), (25.0, 3.0)])
def test_the_timing_model_is_the_closed_form_on_a_star(algo, p, n, alpha_us, switch_us):
    """Ring: 2(p-1) messages and one rendezvous; hd: 2 log2(p) lockstep rounds, each with its rendezvous."""
    topo = topology.build(f"star:hosts={p}")
    model = _profile(alpha_us, switch_us)
    report = check(generate(algo, topo, n), topo, "shortest", latency=model)
    expected = allreduce_formula(algo, p, n, model.profile.alpha_s, _beta(topo), switches=1,
                                 switch_latency=model.profile.switch_latency_s, frame=tcp_payload_bytes())
    assert report.predicted_time_s == pytest.approx(expected, rel=1e-9)
    assert report.real_time_s == pytest.approx(expected / 10000, rel=1e-9)


def test_the_latency_terms_alone_are_2_p_minus_1_alphas_for_ring_and_2_log_p_for_hd():
    topo = topology.build("star:hosts=16")
    n = 64 * 16  # 1 KiB: serialisation a few ms at 10 Mbit/s
    base = {a: check(generate(a, topo, n), topo, "shortest", latency=_profile(0, 0)).predicted_time_s
            for a in ("ring", "hd")}
    with_alpha = {a: check(generate(a, topo, n), topo, "shortest", latency=_profile(8, 0)).predicted_time_s
                  for a in ("ring", "hd")}
    alpha = 8e-6 * 10000
    assert with_alpha["ring"] - base["ring"] == pytest.approx(2 * 15 * alpha, rel=1e-9)
    assert with_alpha["hd"] - base["hd"] == pytest.approx(2 * 4 * alpha, rel=1e-9)


def test_gamma_adds_the_reductions_on_the_critical_path():
    topo = topology.build("star:hosts=8")
    n = 8 << 10
    for algo in ("ring", "hd"):
        sched = generate(algo, topo, n)
        without = check(sched, topo, "shortest").predicted_time_s
        with_gamma = check(sched, topo, "shortest", gamma=1e-6).predicted_time_s
        assert with_gamma - without == pytest.approx(7 / 8 * n * 1e-6, rel=1e-9)


def test_lockstep_rounds_wait_for_the_slowest_pair_and_rings_pipeline():
    """On a leaf-spine with dmodk (no contention), paths cross 1 or 3 switches: hd's rounds pay the slowest,
    the ring's chains pay the mean of their hops."""
    topo = topology.build("leafspine:leaves=4,spines=4,hosts_per_leaf=4")
    model = _profile(0, 10)  # 0.1 s per switch, nothing else of note at 64 B
    hd = check(generate("hd", topo, 64 * 16), topo, "dmodk", latency=model)
    assert max(hd.costs.max_flows_per_link) == 1
    spans = hd.step_times()  # a step runs from its transfers' start (after the rendezvous) to their end
    # rounds 0-1 pair ranks on one leaf (1 switch), rounds 2-3 across leaves (3 switches)
    assert spans[0] == pytest.approx(0.1, abs=0.01) and spans[2] == pytest.approx(0.3, abs=0.01)
    # each round also waits for its rendezvous: 2 x (2 x 0.2 + 2 x 0.6)
    assert hd.predicted_time_s == pytest.approx(3.2, abs=0.05)
    ring = check(generate("ring", topo, 64 * 16), topo, "dmodk", latency=model)
    # every chain of 30 hops visits one cross-leaf edge in four: 30 · (3·0.3 + 1·0.1) / 4 + the first rendezvous
    assert ring.predicted_time_s == pytest.approx(30 * (3 * 0.1 + 0.3) / 4 + 0.3, rel=0.05)


def test_maxmin_rates_share_bottlenecks_fairly():
    cap = {("a", "b"): 10.0, ("b", "c"): 4.0, ("b", "d"): 10.0}
    flows = [[("a", "b"), ("b", "c")], [("a", "b"), ("b", "c")], [("a", "b"), ("b", "d")]]
    assert maxmin_rates(flows, cap) == pytest.approx([2.0, 2.0, 6.0])


def test_maxmin_completion_reallocates_when_flows_finish():
    cap = {("a", "b"): 10.0}
    # Two flows share 10 B/s: the 10-byte one ends at t=2, then the other runs alone.
    assert maxmin_completion([10, 30], [[("a", "b")], [("a", "b")]], cap) == pytest.approx(4.0)


def test_contention_slows_hd_with_identity_placement():
    topo = topology.build("bigraph:upper=4,lower=4,hosts_per_switch=4")
    costs = analyze(generate("hd", topo, 1 << 20), topo, "shortest")
    worst = max(range(len(costs.steps)), key=lambda s: costs.steps[s].max_flows_per_link)
    step = costs.steps[worst]
    assert step.max_flows_per_link == 8
    assert step.maxmin_s > step.alpha_beta_s
    assert step.busiest(1)[0][1] == 8


def test_check_report_json_fields():
    topo = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")
    report = check(generate("hdrm", topo, 1 << 16), topo, "shortest")
    data = report.to_json()
    assert data["valid"] is True and data["steps"] == 6
    assert data["max_flows_per_link"] == [1] * 6
    assert data["predicted_time_s"] > 0 and data["deadlock"] is None
    assert len(data["per_step"]) == 6
    assert bus_bandwidth_mbps(1 << 16, 8, data["predicted_time_s"]) == pytest.approx(data["busbw_mbps"])
    assert data["busbw_mbps"] < topo.host_bw


def test_formula_rejects_unknown_algorithms():
    with pytest.raises(ValueError):
        allreduce_formula("dbtree", 8, 1, 1, 1)
    with pytest.raises(ValueError):
        allreduce_formula("hd", 6, 1, 1, 1)
