"""The timing model's compute operations, lanes and free communication, and the check report's iteration fields."""

from __future__ import annotations

import pytest

from emulator.model import fabric, topology
from emulator.model.collectives.generators import generate
from emulator.model.latency import LatencyModel
from emulator.model.prediction import check, timing
from emulator.model.schedule.compose import Composer

MB = 1_000_000


def one_link(src: int, dst: int, lane: int) -> tuple[list[timing.Link], list[float], int]:
    """One directed link of 1 MB/s carries every connection, whatever its ranks and lane."""
    return [("a", "b")], [1e6], 0


def test_a_compute_op_takes_its_seconds_times_the_dilation():
    comp = Composer(["h1", "h2"], 1000)
    work = comp.compute(0, 2.0)
    comp.message(0, 1, MB // 1000, after_src=[work])
    sched = comp.build("test")
    assert timing.simulate(sched, one_link).makespan_s == pytest.approx(2.0 + 1.0)
    assert timing.simulate(sched, one_link, compute_dilation=10.0).makespan_s == pytest.approx(20.0 + 1.0)


@pytest.mark.parametrize(("lanes", "ends"), [((0, 1), [2.0, 2.0]), ((0, 0), [1.0, 2.0])])
def test_lanes_are_separate_connections_sharing_links(lanes, ends):
    comp = Composer(["h1", "h2"], 1000)
    for lane in lanes:
        comp.message(0, 1, MB // 1000, lane=lane)
    sched = comp.build("test")
    sim = timing.simulate(sched, one_link)
    # two lanes: two flows share the link at half rate each; one lane: the second message follows the first
    assert sorted(t.drained or 0.0 for t in sim.transfers) == pytest.approx(ends)
    assert [t.lane for t in sim.transfers] == list(lanes)


def test_compute_only_follows_messages_across_ranks():
    comp = Composer(["h1", "h2", "h3"], 4)
    a = comp.compute(0, 1.0)
    early = comp.compute(1, 0.5)
    _, got = comp.message(0, 1, 1000, after_src=[a], after_dst=[early])
    comp.compute(1, 2.0, [got])
    comp.compute(2, 2.5)
    sched = comp.build("test")
    assert timing.compute_only_s(sched) == pytest.approx(3.0)
    assert timing.compute_only_s(sched, 4.0) == pytest.approx(12.0)
    assert timing.simulate(sched, one_link).makespan_s == pytest.approx(3.0 + 1000 * 4 / 1e6)
    assert timing.simulate(sched, timing.free_path).makespan_s == pytest.approx(3.0)


def test_check_dilates_compute_by_the_fabric_profile():
    topo = topology.build("star:hosts=2")
    comp = Composer([h.name for h in topo.hosts], 4)
    work = [comp.compute(r, 0.001) for r in range(2)]
    comp.collective(generate("ring", topo, 1024), "ar", {r: [work[r]] for r in range(2)})
    sched = comp.build("ring")
    profile = fabric.default()
    report = check.check(sched, topo, "shortest", latency=LatencyModel(profile))
    assert report.compute_dilation == profile.dilation
    compute_only = report.compute_only_s
    assert compute_only == pytest.approx(0.001 * profile.dilation)
    assert report.real_compute_only_s == pytest.approx(0.001)
    assert compute_only is not None and report.iteration_time_s > compute_only
    assert report.scaling_efficiency == pytest.approx(compute_only / report.predicted_time_s)
    plain = check.predict(sched, topo, "shortest", compute_dilation=1.0)
    assert plain.compute_dilation == 1.0 and plain.compute_only_s == pytest.approx(0.001)
    assert check.check(sched, topo, "shortest").compute_dilation == 1.0  # no profile, no dilation


def test_a_plain_collective_has_no_compute_figures():
    topo = topology.build("star:hosts=4")
    report = check.check(generate("ring", topo, 1 << 16), topo, "shortest")
    assert report.compute_only_s is None and report.scaling_efficiency is None
    data = report.to_json()
    assert data["compute_ops"] == 0 and data["compute_only_s"] is None and data["scaling_efficiency"] is None


def test_independent_compute_ops_of_one_rank_share_its_one_compute_stream():
    comp = Composer(["h1", "h2"], 4)
    comp.compute(0, 0.5)
    comp.compute(0, 0.25)  # independent of the first, but the accelerator runs one at a time
    comp.compute(1, 0.5)
    sched = comp.build("two-streams")
    assert timing.compute_only_s(sched) == pytest.approx(0.75)
    assert timing.compute_only_s(sched, compute_dilation=2.0) == pytest.approx(1.5)
