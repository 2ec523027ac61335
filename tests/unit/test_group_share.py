"""Each process group kind's share of an iteration, from recorded op times and from the timing model alike."""

from __future__ import annotations

import pytest
from test_schedule_compose import _grouped

from emulator.model import topology
from emulator.model.prediction import group_share
from emulator.model.prediction.check import check
from emulator.model.schedule.format import match_transfers


def test_a_segments_kind_is_the_first_word_of_its_name():
    assert group_share.kind_of("tp fwd L3 mb0") == "tp" and group_share.kind_of("bucket 2") == "bucket"


def test_overlapping_transfers_of_a_kind_count_once_per_rank():
    sched = _grouped()
    kinds = group_share.send_kinds(sched)
    assert set(kinds.values()) == {"tp", "dp", "all"}
    tp_sends = sorted(key for key, kind in kinds.items() if kind == "tp" and key[0] == 0)
    first = tp_sends[0]
    # rank 0's tp sends: 0-2 s and 1-3 s overlap (3 s busy) on rank 0 and on rank 1 (their receiver); 10 s in all
    intervals = [(0, 1, first[1], 0.0, 2.0), (0, 1, tp_sends[1][1], 1.0, 3.0)]
    (tp,) = group_share.shares(sched, intervals, 10.0)
    assert tp.kind == "tp" and tp.ranks == 2 and tp.share == pytest.approx(0.3)


def test_the_model_and_a_replay_with_the_models_times_give_the_same_shares():
    sched = _grouped()
    report = check(sched, topology.build("star:hosts=8"), "shortest")
    assert report.valid and report.timing is not None
    model = group_share.shares(sched, group_share.model_intervals(report.timing), report.predicted_time_s)
    assert [g.kind for g in model] == ["all", "dp", "tp"] and all(g.ranks == 8 for g in model)
    assert all(0 < g.share <= 1 for g in model)
    # op times as a replay records them: each transfer's send from its start, its receive up to its end
    by_send = {(t.src, t.send_id): t for t in report.timing.transfers}
    op_times: dict[int, dict[int, tuple[float, float]]] = {r: {} for r in range(sched.p)}
    for a, send_id, b, recv_id in match_transfers(sched):
        t = by_send[(a, send_id)]
        op_times[a][send_id] = (t.start, t.end)
        op_times[b][recv_id] = (t.start, t.end)
    measured = group_share.shares(sched, group_share.measured_intervals(sched, op_times), report.predicted_time_s)
    assert measured == model
