"""Contention counts and the alpha-beta and max-min fair cost models."""

from __future__ import annotations

import pytest

from emulator import topology
from emulator.schedule.check import check
from emulator.schedule.cost import (
    TCP_GOODPUT,
    allreduce_formula,
    analyze,
    bus_bandwidth_mbps,
    maxmin_completion,
    maxmin_rates,
)
from emulator.schedule.generators import generate


def _beta(topo: topology.Topology) -> float:
    return 1 / (topo.host_bw * 1e6 / 8 * TCP_GOODPUT)


@pytest.mark.parametrize("algo, p", [("ring", 5), ("ring", 8), ("hd", 8), ("hd", 16), ("hdrm", 8)])
def test_step_sums_match_the_closed_forms_without_contention(algo, p):
    spec = f"star:hosts={p}" if algo != "hdrm" else "bigraph:upper=2,lower=2,hosts_per_switch=2"
    topo = topology.build(spec)
    n = 4 * p * 1024
    costs = analyze(generate(algo, topo, n), topo, "shortest", alpha=1e-4)
    expected = allreduce_formula(algo, p, n, 1e-4, _beta(topo))
    assert costs.alpha_beta_time_s == pytest.approx(expected, rel=1e-9)
    assert costs.maxmin_time_s == pytest.approx(expected, rel=1e-9)  # no link is shared


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
