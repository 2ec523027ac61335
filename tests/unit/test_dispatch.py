"""One rank's dependency rules, shared by the agents and the timing model."""

from __future__ import annotations

from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule.dispatch import Channel, Completed, Dispatcher, Written
from emulator.model.schedule.format import Op, RankProgram, Schedule


def _ids(ready):
    return [(r.op.id, r.at) for r in ready]


def _rank(schedule: Schedule, rank: int) -> RankProgram:
    return schedule.ranks[rank]


def test_hd_rounds_release_receives_when_a_send_is_written_and_sends_when_it_is_acknowledged():
    sched = generate("hd", topology.build("star:hosts=2"), 64)
    prog = _rank(sched, 0)
    d = Dispatcher(prog)
    send0, recv0, send1, recv1 = (op.id for op in prog.ops)
    assert d.awaited == {send0}  # the next round's send waits for it
    assert _ids(d.start(0.0)) == [(send0, 0.0), (recv0, 0.0)]
    assert _ids(d.done(recv0, 2.0)) == []
    # written: the next round's receive may go (it was ready since the receive completed at 2.0)
    assert _ids(d.written(send0, 1.5)) == [(recv1, 2.0)]
    assert _ids(d.done(send0, 2.5)) == [(send1, 2.5)]  # acknowledged: the next round's send
    assert d.pending == 2


def test_a_peers_queue_hands_out_operations_in_program_order_and_from_the_latest_time():
    sched = generate("ring", topology.build("star:hosts=4"), 4 * 64)
    prog = _rank(sched, 1)
    d = Dispatcher(prog)
    first = d.start(10.0)
    receives = [r for r in first if r.op.kind != "send"]
    # a ring's receives depend on nothing (or on sends long done): they are queued at once, in order
    assert [r.op.id for r in receives] == sorted(r.op.id for r in receives)
    assert all(r.at == 10.0 for r in first)


def test_an_operation_ready_early_waits_for_the_earlier_ones_of_its_queue():
    """A send ready at once, queued behind a send that waits for local work: it goes after it, at its time."""
    ops = (Op(0, "copy", 0, 1, 4, 0, src="scratch", src_chunk=0),
           Op(1, "send", 0, 1, 4, 0, peer=1, deps=(0,)),
           Op(2, "send", 1, 1, 4, 0, peer=1))
    d = Dispatcher(RankProgram(0, "h1", ops))
    assert _ids(d.start(0.0)) == [(0, 0.0)]  # only the copy: send 2 waits behind send 1
    assert _ids(d.done(0, 5.0)) == [(1, 5.0), (2, 5.0)]
    assert not d.awaited


def test_a_send_completed_without_being_written_releases_everything_in_program_order():
    """The symbolic executor completes sends at once (no written event): all dependents go, in list order."""
    sched = generate("hd", topology.build("star:hosts=2"), 64)
    prog = _rank(sched, 0)
    d = Dispatcher(prog)
    send0, recv0, send1, recv1 = (op.id for op in prog.ops)
    d.start(0.0)
    assert _ids(d.done(recv0, 1.0)) == []
    assert _ids(d.done(send0, 2.0)) == [(send1, 2.0), (recv1, 2.0)]


def test_events_are_the_methods_they_stand_for():
    sched = generate("hd", topology.build("star:hosts=2"), 64)
    prog = _rank(sched, 0)
    by_method, by_event = Dispatcher(prog), Dispatcher(prog)
    send0, recv0, _, _ = (op.id for op in prog.ops)
    assert _ids(by_method.start(0.0)) == _ids(by_event.start(0.0))
    assert _ids(by_method.done(recv0, 2.0)) == _ids(by_event.apply(Completed(recv0, 0.0, 2.0)))
    assert _ids(by_method.written(send0, 1.5)) == _ids(by_event.apply(Written(send0, 1.5)))
    assert _ids(by_method.done(send0, 2.5)) == _ids(by_event.apply(Completed(send0, 0.0, 2.5)))
    assert by_method.finished == by_event.finished == {send0, recv0}


def test_channels_heads_and_readiness():
    """What the executor's deadlock report asks: a channel's ops, its first unfinished one, who is ready."""
    ops = (Op(0, "copy", 0, 1, 4, 0, src="scratch", src_chunk=0),
           Op(1, "send", 0, 1, 4, 0, peer=1, deps=(0,)),
           Op(2, "send", 1, 1, 4, 0, peer=1),
           Op(3, "recv", 1, 1, 4, 1, peer=1, deps=(2,)))
    d = Dispatcher(RankProgram(0, "h1", ops))
    to_1, from_1 = Channel(1, sends=True), Channel(1, sends=False)
    assert Channel.of(ops[1]) == to_1 and Channel.of(ops[3]) == from_1 and to_1.opposite(0) == Channel(0, False)
    assert d.channels == [to_1, from_1]
    assert [op.id for op in d.channel_ops(to_1)] == [1, 2] and d.channel_ops(Channel(2, True)) == []
    d.start(0.0)
    assert d.released(2) and not d.released(1)  # ready, though queued behind send 1
    assert d.head(to_1) == ops[1]
    d.done(0, 1.0)
    d.done(1, 2.0)
    assert d.head(to_1) == ops[2]
    d.done(2, 3.0)
    assert d.head(to_1) is None and d.head(from_1) == ops[3] and d.released(3)
