"""Contention counts, the alpha-beta and max-min fair cost models, and every collective's closed form."""

from __future__ import annotations

import dataclasses

import pytest

from emulator.model import fabric, routing, topology
from emulator.model.collectives.algorithms import hier_groups
from emulator.model.collectives.generators import generate
from emulator.model.collectives.registry import REGISTRY, allreduce_formula, collective_formula
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import check
from emulator.model.prediction.cost import (
    analyze,
    maxmin_completion,
    maxmin_rates,
    path_function,
)
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import compute_op, match_transfers, validate, with_ops
from emulator.model.schedule.semantics import ROOTED, bus_bandwidth_mbps
from emulator.model.topology import DEFAULT_MTU, tcp_goodput_factor, tcp_payload_bytes


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
    assert model.profile is not None
    expected = allreduce_formula(algo, p, n, model.profile.alpha_s, _beta(topo), switches=1,
                                 switch_latency=model.profile.switch_latency_s, frame=tcp_payload_bytes(), acks=True)
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
    """A ring adds every reduction; halving-doubling's overlap the wait for the round's ACK (the closed form)."""
    topo = topology.build("star:hosts=8")
    n = 8 << 10
    sched = generate("ring", topo, n)
    without = check(sched, topo, "shortest").predicted_time_s
    with_gamma = check(sched, topo, "shortest", gamma=1e-6).predicted_time_s
    assert with_gamma - without == pytest.approx(7 / 8 * n * 1e-6, rel=1e-9)
    sched = generate("hd", topo, n)
    for gamma in (1e-6, 1e-7):
        with_gamma = check(sched, topo, "shortest", gamma=gamma).predicted_time_s
        expected = allreduce_formula("hd", 8, n, 0.0, _beta(topo), gamma, switches=1, frame=tcp_payload_bytes(),
                                    acks=True)
        assert with_gamma == pytest.approx(expected, rel=1e-9)
    # gamma 1e-6 s/B adds more than the ACKs' waits (a frame of 4 KiB at 10 Mbit/s): the excess shows
    without = check(sched, topo, "shortest").predicted_time_s
    assert 0 < check(sched, topo, "shortest", gamma=1e-6).predicted_time_s - without < 7 / 8 * n * 1e-6


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


# ---------------------------------------------------------------------------
# Every collective: closed forms, contention, lanes, compute
# ---------------------------------------------------------------------------

FORMULA_CASES = [(c, a, p) for c, a in REGISTRY if (c != "allreduce" or a == "rd") and a != "hdrm"
                 for p in (2, 3, 4, 8) if not (REGISTRY[(c, a)].power_of_two or a == "rd") or p != 3]


def _formula(sched, topo, model, switches=1, gamma=0.0, acks=False):
    """The closed form: the step model's sum, or with ``acks`` the timing model's time."""
    return collective_formula(sched.collective, sched.algorithm, sched.p, sched.size, model.profile.alpha_s,
                              _beta(topo), gamma, chunks=sched.chunks, switches=switches,
                              switch_latency=model.profile.switch_latency_s, frame=tcp_payload_bytes(), acks=acks,
                              groups=len(hier_groups(topo, sched.hosts)))


@pytest.mark.parametrize(("collective", "algo", "p"), FORMULA_CASES)
def test_every_collectives_closed_form_is_the_alpha_beta_step_sum_on_a_star(collective, algo, p):
    topo = topology.build(f"star:hosts={p}")
    model = _profile(8, 0)
    sched = generate(algo, topo, 4 * 8 * p * 1024, collective=collective, root=p - 1 if collective in ROOTED else 0)
    costs = analyze(sched, topo, "shortest", latency=model)
    assert costs.alpha_beta_time_s == pytest.approx(_formula(sched, topo, model), rel=1e-9)
    if algo != "dbtree":  # a tree's root feeds two tree roots at once: its link is shared
        assert max(costs.max_flows_per_link) == 1
        assert costs.maxmin_time_s == pytest.approx(costs.alpha_beta_time_s, rel=1e-9)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce"])
def test_hdrm_closed_forms_on_a_bigraph(collective):
    topo = topology.build("bigraph:upper=2,lower=2,hosts_per_switch=2")
    model = _profile(8, 0)
    sched = generate("hdrm", topo, 8 * 4 * 1024, collective=collective, root=3 if collective in ROOTED else 0)
    costs = analyze(sched, topo, "shortest", latency=model)
    assert costs.alpha_beta_time_s == pytest.approx(_formula(sched, topo, model, switches=2), rel=1e-9)


@pytest.mark.parametrize(("collective", "algo"), [("reduce_scatter", "ring"), ("reduce_scatter", "hd"),
                                                  ("reduce_scatter", "direct"), ("reduce", "ring"), ("reduce", "hd")])
def test_the_closed_forms_charge_the_reductions_as_the_step_model_does(collective, algo):
    topo = topology.build("star:hosts=8")
    model = _profile(0, 0)
    sched = generate(algo, topo, 8 * 4 * 1024, collective=collective)
    costs = analyze(sched, topo, "shortest", latency=model, gamma=1e-6)
    assert costs.alpha_beta_time_s == pytest.approx(_formula(sched, topo, model, gamma=1e-6), rel=1e-9)


@pytest.mark.parametrize(("collective", "algo"), [("reduce_scatter", "ring"), ("allgather", "ring"),
                                                  ("reduce_scatter", "hd"), ("allgather", "hd"),
                                                  ("reduce_scatter", "direct"), ("allgather", "direct"),
                                                  ("alltoall", "direct"), ("reduce", "hd")])
@pytest.mark.parametrize("alpha_us, switch_us", [(8.0, 0.0), (8.0, 1.0), (25.0, 3.0)])
def test_the_timing_model_is_the_closed_form_for_rings_and_lockstep_rounds(collective, algo, alpha_us, switch_us):
    """A ring pays one rendezvous (its receives are posted early), lockstep rounds one each, as for allreduce."""
    topo = topology.build("star:hosts=8")
    model = _profile(alpha_us, switch_us)
    report = check(generate(algo, topo, 64 << 10, collective=collective), topo, "shortest", latency=model)
    assert report.valid
    assert report.predicted_time_s == pytest.approx(_formula(report.schedule, topo, model, acks=True), rel=1e-9)


def test_pipelined_chains_overlap_their_latencies_in_the_timing_model():
    """The textbook (C+p-2)·(alpha + n/C·beta) charges every piece its latency; a real chain (and the timing
    model) has the next piece on the wire while the latency of the last is in flight."""
    topo = topology.build("star:hosts=8")
    model = _profile(8, 0)
    sched = generate("ring", topo, 64 << 10, collective="broadcast")
    report = check(sched, topo, "shortest", latency=model)
    assert report.valid
    assert report.predicted_time_s < _formula(sched, topo, model)


def test_alltoall_collides_on_a_leaf_spine_with_one_spine():
    topo = topology.build("leafspine:leaves=2,spines=1,hosts_per_leaf=4")
    costs = analyze(generate("direct", topo, 8 * 4 * 1024, collective="alltoall"), topo, "shortest")
    assert max(costs.max_flows_per_link) > 1
    worst = max(costs.steps, key=lambda s: s.max_flows_per_link)
    assert worst.busiest(1)[0][0] in {("s1", "s3"), ("s2", "s3"), ("s3", "s1"), ("s3", "s2")}  # leaf - spine
    assert costs.maxmin_time_s > costs.alpha_beta_time_s


def test_formulas_refuse_what_they_do_not_cover():
    with pytest.raises(ValueError, match="power of two"):
        collective_formula("allgather", "hd", 6, 1, 1, 1)
    with pytest.raises(ValueError, match="power-of-two"):
        collective_formula("allreduce", "rd", 6, 1, 1, 1)
    with pytest.raises(ValueError, match="chunks"):
        collective_formula("broadcast", "ring", 4, 1, 1, 1)
    with pytest.raises(ValueError, match="gamma"):
        collective_formula("reduce", "dbtree", 4, 1, 1, 1, 1e-9, chunks=8)
    for collective, algo in [("alltoall", "hd"), ("alltoall", "ring"), ("broadcast", "direct"), ("p2p", "ring")]:
        with pytest.raises(ValueError, match="no closed form"):
            collective_formula(collective, algo, 4, 1, 1, 1, chunks=8)
    assert collective_formula("allreduce", "ring", 4, 1024, 1e-3, 1e-6) == allreduce_formula("ring", 4, 1024, 1e-3,
                                                                                              1e-6)


def test_bus_bandwidth_follows_nccl_tests_for_every_collective():
    assert bus_bandwidth_mbps(10**6, 4, 1.0) == bus_bandwidth_mbps(10**6, 4, 1.0, "allreduce") == pytest.approx(12.0)
    for collective in ("reduce_scatter", "allgather", "alltoall"):
        assert bus_bandwidth_mbps(10**6, 4, 1.0, collective) == pytest.approx(6.0)
    for collective in ("broadcast", "reduce", "p2p"):
        assert bus_bandwidth_mbps(10**6, 4, 1.0, collective) == pytest.approx(8.0)
    assert bus_bandwidth_mbps(10**6, 4, 0.0, "alltoall") == 0.0


def _with_lanes(sched, lanes: int):
    """``sched`` with its k-th matched transfer on lane ``k mod lanes`` (both ends)."""
    lane_of: dict[tuple[int, int], int] = {}
    for k, (a, send_id, b, recv_id) in enumerate(match_transfers(sched)):
        lane_of[(a, send_id)] = lane_of[(b, recv_id)] = k % lanes
    return with_ops(sched, [[dataclasses.replace(op, lane=lane_of.get((r.rank, op.id), 0)) for op in r.ops]
                            for r in sched.ranks])


def test_every_lane_is_routed_as_its_own_connection():
    topo = topology.build("leafspine:leaves=2,spines=4,hosts_per_leaf=4")
    sched = _with_lanes(generate("direct", topo, 8 * 4 * 1024, collective="alltoall"), 4)
    assert execute(sched).valid
    costs = analyze(sched, topo, "ecmp", seed=1)
    assert {t.lane for t in costs.transfers} == {0, 1, 2, 3}
    for t in costs.transfers:
        flow = routing.agent_flow(topo, t.src_host, t.dst_host, t.lane)
        assert t.path == routing.route(topo, "ecmp", flow, seed=1)
    path_of = path_function(topo, costs.transfers, costs.goodput)
    for t in costs.transfers:
        links, caps, switches = path_of(t.src, t.dst, t.lane)
        assert switches == len(t.path) - 2 and len(links) == len(caps) == len(t.path) - 1
    # lanes of one pair hash apart: ECMP spreads the cross-leaf transfers over more uplinks than one lane does
    one_lane = analyze(_with_lanes(sched, 1), topo, "ecmp", seed=1)
    assert {tuple(t.path) for t in costs.transfers} != {tuple(t.path) for t in one_lane.transfers}
    assert check(sched, topo, "ecmp", seed=1).valid


def test_path_function_defaults_to_lane_0():
    topo = topology.build("star:hosts=4")
    costs = analyze(generate("ring", topo, 4096), topo, "shortest")
    path_of = path_function(topo, costs.transfers, costs.goodput)
    assert path_of(0, 1) == path_of(0, 1, 0) == path_of(0, 1, lane=0)
    with pytest.raises(KeyError):
        path_of(0, 1, 1)


def test_compute_ops_are_no_transfers():
    topo = topology.build("star:hosts=4")
    sched = generate("ring", topo, 4096, collective="allgather")
    ops = [list(r.ops) for r in sched.ranks]
    ops[0].append(compute_op(len(ops[0]), 0.5, sched.steps - 1, [len(ops[0]) - 1]))
    with_compute = with_ops(sched, ops)
    assert validate(with_compute).compute_ops == 1
    plain, costs = analyze(sched, topo, "shortest"), analyze(with_compute, topo, "shortest")
    assert len(costs.transfers) == len(plain.transfers)
    assert costs.alpha_beta_time_s == plain.alpha_beta_time_s and costs.max_flows_per_link == plain.max_flows_per_link
