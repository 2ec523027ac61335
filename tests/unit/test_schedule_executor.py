"""The symbolic executor finds planted deadlocks, double counting, missing data and races."""

from __future__ import annotations

from dataclasses import replace

from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule.deps import derive_deps
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import Op, RankProgram, Schedule, from_dict, validate


def _ring(p: int = 4) -> Schedule:
    return generate("ring", topology.build(f"star:hosts={p}"), 4 * p * 16)


def _edit(sched: Schedule, rank: int, ops: list[Op]) -> Schedule:
    ranks = list(sched.ranks)
    ranks[rank] = RankProgram(rank, ranks[rank].host, tuple(ops))
    return replace(sched, ranks=tuple(ranks))


def _two_ranks(ops0: list[dict], ops1: list[dict], chunks: int = 2) -> Schedule:
    return from_dict({"version": 1, "size": 4 * chunks, "chunks": chunks, "ranks": [
        {"rank": 0, "host": "h1", "ops": ops0}, {"rank": 1, "host": "h2", "ops": ops1}]})


def test_valid_two_rank_exchange():
    sched = _two_ranks(
        [{"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0},
         {"id": 1, "kind": "recv_reduce", "peer": 1, "chunk": 1, "step": 0},
         {"id": 2, "kind": "send", "peer": 1, "chunk": 1, "step": 1, "deps": [1]},
         {"id": 3, "kind": "recv", "peer": 1, "chunk": 0, "step": 1, "deps": [0]}],
        [{"id": 0, "kind": "send", "peer": 0, "chunk": 1, "step": 0},
         {"id": 1, "kind": "recv_reduce", "peer": 0, "chunk": 0, "step": 0},
         {"id": 2, "kind": "send", "peer": 0, "chunk": 0, "step": 1, "deps": [1]},
         {"id": 3, "kind": "recv", "peer": 0, "chunk": 1, "step": 1, "deps": [0]}])
    result = execute(sched)
    assert result.valid, result.errors
    assert result.rounds == 2


def test_planted_deadlock_is_reported_with_ranks_and_ops():
    # Both ranks receive before they send: each recv waits for the other's send,
    # which depends on that rank's own recv.
    sched = _two_ranks(
        [{"id": 0, "kind": "recv_reduce", "peer": 1, "chunk": 1, "step": 0},
         {"id": 1, "kind": "send", "peer": 1, "chunk": 0, "step": 0, "deps": [0]}],
        [{"id": 0, "kind": "recv_reduce", "peer": 0, "chunk": 0, "step": 0},
         {"id": 1, "kind": "send", "peer": 0, "chunk": 1, "step": 0, "deps": [0]}])
    result = execute(sched)
    assert not result.valid
    dl = result.deadlock
    assert dl is not None
    assert dl.ranks == [0, 1]
    assert sorted(dl.cycle) == [(0, 0), (1, 0)]
    assert any("deadlock" in e and "rank 0 op 0" in e and "rank 1" in e for e in result.errors)


def test_planted_deadlock_in_a_generated_ring():
    # Every rank now receives before its first send: the classic ring deadlock.
    sched = _ring(4)
    for prog in sched.ranks:
        ops = list(prog.ops)
        send = next(o for o in ops if o.kind == "send" and o.step == 0)
        recv = next(o for o in ops if o.kind == "recv_reduce" and o.step == 0)
        ops.remove(send)
        ops.insert(ops.index(recv) + 1, replace(send, deps=(*send.deps, recv.id)))
        sched = _edit(sched, prog.rank, ops)
    result = execute(validate(sched))
    assert not result.valid and result.deadlock is not None
    assert result.deadlock.ranks == [0, 1, 2, 3]
    assert len(result.deadlock.cycle) == 4
    assert {r for r, _ in result.deadlock.cycle} == {0, 1, 2, 3}
    assert "deadlock" in result.errors[-1] and "wait-for cycle" in result.errors[-1]


def test_unmatched_send_is_a_deadlock():
    sched = _two_ranks([{"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0}], [])
    result = execute(sched)
    assert not result.valid
    assert "never posts" in result.deadlock.summary()
    assert any("sends 1 messages to rank 1 but rank 1 receives 0" in e for e in result.errors)


def test_planted_double_count_is_found():
    sched = _ring(4)
    # Rank 0 sends its first chunk to rank 1 twice, and rank 1 reduces both.
    ops0, ops1 = list(sched.ranks[0].ops), list(sched.ranks[1].ops)
    send = next(o for o in ops0 if o.kind == "send" and o.peer == 1)
    recv = next(o for o in ops1 if o.kind == "recv_reduce" and o.peer == 0)
    ops0.insert(ops0.index(send) + 1, replace(send, id=100))
    ops1.insert(ops1.index(recv) + 1, replace(recv, id=100))
    sched = _edit(_edit(sched, 0, derive_deps(ops0)), 1, derive_deps(ops1))
    result = execute(validate(sched))
    assert not result.valid
    assert result.deadlock is None
    assert any("counts the contribution of rank 0 2 times" in e for e in result.errors), result.errors


def test_missing_contribution_is_found():
    sched = _two_ranks(
        [{"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0}],
        [{"id": 0, "kind": "recv", "peer": 0, "chunk": 0, "step": 0}], chunks=1)
    result = execute(sched)
    assert not result.valid
    text = " ".join(result.errors)
    assert "rank 1 chunk 0: misses the contribution of ranks [1]" in text
    assert "rank 0 chunk 0: misses the contribution of ranks [1]" in text


def test_data_race_is_reported():
    # Rank 0 overwrites chunk 0 while a send of chunk 0 may still be reading it.
    sched = _two_ranks(
        [{"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0},
         {"id": 1, "kind": "recv", "peer": 1, "chunk": 0, "step": 0}],
        [{"id": 0, "kind": "recv_reduce", "peer": 0, "chunk": 0, "step": 0},
         {"id": 1, "kind": "send", "peer": 0, "chunk": 0, "step": 0, "deps": [0]}], chunks=1)
    result = execute(sched)
    assert any("data race" in e and "rank 0" in e for e in result.errors)
    assert not result.valid


def test_mixing_chunks_is_reported():
    sched = _two_ranks(
        [{"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0}],
        [{"id": 0, "kind": "recv_reduce", "peer": 0, "chunk": 1, "step": 0}])
    result = execute(sched)
    assert any("adds chunk 0 into chunk 1" in e for e in result.errors)


def test_local_copy_and_reduce_through_scratch():
    data = {"version": 1, "size": 8, "chunks": 1, "scratch_chunks": 1, "ranks": [
        {"rank": 0, "host": "h1", "ops": [
            {"id": 0, "kind": "send", "peer": 1, "chunk": 0, "step": 0},
            {"id": 1, "kind": "recv", "peer": 1, "chunk": 0, "buffer": "scratch", "step": 0},
            {"id": 2, "kind": "reduce", "chunk": 0, "src": "scratch", "src_chunk": 0, "step": 0, "deps": [0, 1]}]},
        {"rank": 1, "host": "h2", "ops": [
            {"id": 0, "kind": "copy", "chunk": 0, "buffer": "scratch", "src": "data", "src_chunk": 0, "step": 0},
            {"id": 1, "kind": "recv_reduce", "peer": 0, "chunk": 0, "step": 0, "deps": [0]},
            {"id": 2, "kind": "send", "peer": 0, "chunk": 0, "buffer": "scratch", "step": 0, "deps": [0]}]},
    ]}
    # scratch_chunks=1 and chunk size 8 bytes: 2 float32 per chunk.
    result = execute(from_dict(data))
    assert result.valid, result.errors


def test_runaway_reduction_overflows_cleanly():
    # scratch += data, then data += scratch, again and again: counts grow like Fibonacci numbers.
    ops = []
    for i in range(0, 120, 2):
        ops.append({"id": i, "kind": "reduce", "chunk": 0, "buffer": "scratch", "src": "data", "src_chunk": 0,
                    "step": 0, "deps": [i - 1] if i else []})
        ops.append({"id": i + 1, "kind": "reduce", "chunk": 0, "src": "scratch", "src_chunk": 0, "step": 0,
                    "deps": [i]})
    sched = from_dict({"version": 1, "size": 4, "chunks": 1, "scratch_chunks": 1, "ranks": [
        {"rank": 0, "host": "h1", "ops": ops}, {"rank": 1, "host": "h2", "ops": []}]})
    result = execute(sched)
    assert not result.valid
    assert any("rank 0 chunk 0" in e for e in result.errors)


def test_a_send_queued_behind_another_on_its_channel_is_matched_after_it():
    """The executor queues by the agents' rules (emulator.model.schedule.dispatch): send 2, ready at once, waits for
    send 1, which waits for a copy; so they are matched in list order, one round apart."""
    sched = _two_ranks(
        [{"id": 0, "kind": "copy", "chunk": 0, "src": "data", "src_chunk": 1, "step": 0},
         {"id": 1, "kind": "send", "peer": 1, "chunk": 0, "step": 0, "deps": [0]},
         {"id": 2, "kind": "send", "peer": 1, "chunk": 1, "step": 0}],
        [{"id": 0, "kind": "recv_reduce", "peer": 0, "chunk": 0, "step": 0},
         {"id": 1, "kind": "recv_reduce", "peer": 0, "chunk": 1, "step": 0, "deps": [0]}])
    result = execute(sched)
    assert result.matches == [(0, 1, 1, 0), (0, 2, 1, 1)]
    assert result.completed_round[(0, 1)] == 0 and result.completed_round[(0, 2)] == 1
