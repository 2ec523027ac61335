"""Each process group kind's share of an iteration, from recorded op times and from the timing model alike.

The expected shares are closed forms computed here from the schedule :func:`_grouped` builds, not from
:mod:`~emulator.model.prediction.group_share`: a ring allreduce of ``p`` ranks takes ``2(p-1)`` steps, a ring
reduce-scatter ``p-1`` (docs/schedule-format.md), every rank sending to its ring successor in each.
"""

from __future__ import annotations

import pytest
from test_schedule_compose import _grouped

from emulator.model import topology
from emulator.model.prediction import group_share
from emulator.model.prediction.check import check
from emulator.model.schedule.format import SEND, Schedule, match_transfers

#: _grouped's kinds: tensor-parallel pairs (allreduce on 2), data-parallel fours (allreduce on 4), all eight
#: (reduce-scatter on 8), one after another; each rank's ring steps in each.
STEPS = {"tp": 2 * (2 - 1), "dp": 2 * (4 - 1), "all": 8 - 1}


def _step_of(sched: Schedule) -> dict[tuple[int, int], int]:
    return {(prog.rank, op.id): op.step for prog in sched.ranks for op in prog.ops}


def test_a_segments_kind_is_the_first_word_of_its_name():
    assert group_share.kind_of("tp fwd L3 mb0") == "tp" and group_share.kind_of("bucket 2") == "bucket"


def test_every_send_has_the_kind_of_the_group_its_peer_shares():
    sched = _grouped()
    kinds = group_share.send_kinds(sched)
    sends = [(prog.rank, op) for prog in sched.ranks for op in prog.ops if op.kind == SEND]
    assert len(kinds) == len(sends)  # no send left without a kind
    same_group = {"tp": lambda r, q: r // 2 == q // 2, "dp": lambda r, q: r % 2 == q % 2, "all": lambda r, q: True}
    for rank, op in sends:
        assert same_group[kinds[(rank, op.id)]](rank, op.peer)
    # one send per rank per ring step
    assert {k: sum(1 for v in kinds.values() if v == k) for k in STEPS} == {k: 8 * n for k, n in STEPS.items()}


def test_overlapping_transfers_of_a_kind_count_once_per_rank():
    sched = _grouped()
    kinds = group_share.send_kinds(sched)
    tp_sends = sorted(key for key, kind in kinds.items() if kind == "tp" and key[0] == 0)
    first = tp_sends[0]
    # rank 0's tp sends: 0-2 s and 1-3 s overlap (3 s busy) on rank 0 and on rank 1 (their receiver); 10 s in all
    intervals = [(0, 1, first[1], 0.0, 2.0), (0, 1, tp_sends[1][1], 1.0, 3.0)]
    (tp,) = group_share.shares(sched, intervals, 10.0)
    assert tp.kind == "tp" and tp.ranks == 2 and tp.share == pytest.approx(0.3)


def test_a_replay_whose_transfers_each_take_one_step_shares_the_iteration_by_ring_steps():
    """Each send recorded over the first half of its step, its receive over the second: in flight the whole step.
    A rank sends and receives in every step of its rings, so each kind's share is its steps over all 15, and the
    shares add up to 1."""
    sched = _grouped()
    step = _step_of(sched)
    op_times: dict[int, dict[int, tuple[float, float]]] = {r: {} for r in range(sched.p)}
    for a, send_id, b, recv_id in match_transfers(sched):
        s = step[(a, send_id)]
        op_times[a][send_id] = (s, s + 0.5)
        op_times[b][recv_id] = (s + 0.25, s + 1.0)
    total = sum(STEPS.values())
    measured = group_share.shares(sched, group_share.measured_intervals(sched, op_times), float(total))
    assert {g.kind: g.share for g in measured} == pytest.approx({k: n / total for k, n in STEPS.items()})
    assert all(g.ranks == 8 for g in measured) and sum(g.share for g in measured) == pytest.approx(1.0)


def test_the_models_shares_are_in_the_ratio_of_ring_steps_and_a_replay_at_its_times_reads_the_same():
    """Every message of _grouped is 32 bytes (64/2, 128/4, 256/8), so on a star every step takes the model the
    same time: the shares are in the ratio 2 : 6 : 7, and the kinds, one after another on every rank, add up to
    at most the whole iteration."""
    sched = _grouped()
    report = check(sched, topology.build("star:hosts=8"), "shortest")
    assert report.valid and report.timing is not None
    model = {g.kind: g for g in group_share.shares(sched, group_share.model_intervals(report.timing),
                                                   report.predicted_time_s)}
    assert sorted(model) == ["all", "dp", "tp"] and all(g.ranks == 8 for g in model.values())
    per_step = model["tp"].share / STEPS["tp"]
    assert {k: g.share for k, g in model.items()} == pytest.approx({k: n * per_step for k, n in STEPS.items()})
    assert sum(g.share for g in model.values()) <= 1.0
    # op times as a replay records them: each transfer's send from its start, its receive up to its end
    by_send = {(t.src, t.send_id): t for t in report.timing.transfers}
    op_times: dict[int, dict[int, tuple[float, float]]] = {r: {} for r in range(sched.p)}
    for a, send_id, b, recv_id in match_transfers(sched):
        t = by_send[(a, send_id)]
        op_times[a][send_id] = (t.start, t.end)
        op_times[b][recv_id] = (t.start, t.end)
    measured = group_share.shares(sched, group_share.measured_intervals(sched, op_times), report.predicted_time_s)
    assert measured == [model[k] for k in sorted(model)]
