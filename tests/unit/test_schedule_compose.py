"""Composed schedules: segments of several collectives, messages and compute, proved by the executor."""

from __future__ import annotations

import pytest

from emulator.base.errors import FieldError
from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.schedule import executor
from emulator.model.schedule import format as fmt
from emulator.model.schedule.compose import Composer


def _ring(p: int, size: int) -> fmt.Schedule:
    return generate("ring", topology.build(f"star:hosts={p}"), size)


def test_two_allreduces_and_compute_compose_into_one_proved_schedule():
    p = 4
    first, second = _ring(p, 64), _ring(p, 128)
    comp = Composer(first.hosts, first.chunk_bytes)
    grads = [comp.compute(r, 0.01) for r in range(p)]
    a = comp.collective(first, "bucket 0", {r: [grads[r]] for r in range(p)})
    more = [comp.compute(r, 0.02, [grads[r]]) for r in range(p)]
    b = comp.collective(second, "bucket 1", {r: [more[r], a[r]] for r in range(p)})
    sched = comp.build("ring", meta={"model": "test"})
    assert sched.collective == "allreduce" and len(sched.segments) == 2
    assert sched.chunks == first.chunks + 2 * second.chunks and sched.compute_ops == 2 * p  # refined to 16 B
    assert executor.execute(sched).valid
    # bucket 1's first ops wait for the compute and for bucket 0 on every rank
    for r in range(p):
        entry = [op for op in sched.ranks[r].ops if op.kind != "compute" and set(op.deps) >= {more[r].sinks[0]}]
        assert entry and all(set(a[r].sinks) <= set(op.deps) for op in entry)
    assert b[0].sinks
    assert fmt.from_dict(sched.to_dict()) == sched


def test_a_broken_segment_is_named():
    p = 4
    part = _ring(p, 64)
    comp = Composer(part.hosts, part.chunk_bytes)
    comp.collective(part, "ok")
    comp.collective(part, "broken")
    sched = comp.build("ring")
    ops = list(sched.ranks[1].ops)
    victim = next(i for i, op in enumerate(ops) if op.kind == "recv_reduce" and op.chunk >= part.chunks)
    ops[victim] = fmt.Op(**{**ops[victim].__dict__, "kind": "recv"})
    broken = fmt.with_ops(sched, [ops if r == 1 else prog.ops for r, prog in enumerate(sched.ranks)])
    result = executor.execute(broken)
    assert not result.valid
    assert any("misses the contribution" in e for e in result.errors)


def test_messages_form_p2p_segments():
    comp = Composer(["h1", "h2", "h3"], 4, dtype="uint8")
    s, r = comp.message(0, 2, 3, lane=1)
    comp.message(2, 1, 1, after_src=[r])
    sched = comp.build("trace")
    assert sched.collective == "p2p" and sched.dtype == "uint8"
    assert [seg.collective for seg in sched.segments] == ["p2p", "p2p"]
    assert fmt.match_transfers(sched) == [(0, 0, 2, 0), (2, 1, 1, 0)]
    assert executor.execute(sched).valid


def test_mixed_segments_and_their_checks():
    p = 2
    doc = {"version": 2, "collective": "mixed", "size": 32, "chunks": 4, "output_chunks": 2,
           "segments": [{"name": "ar", "collective": "allreduce", "chunk": 0, "chunks": 2},
                        {"name": "ag", "collective": "allgather", "chunk": 2, "chunks": 1,
                         "output_chunk": 0, "output_chunks": 2}],
           "ranks": [{"rank": r, "host": f"h{r + 1}", "ops": []} for r in range(p)]}
    sched = fmt.from_dict(doc)
    result = executor.execute(sched)
    assert not result.valid and "rank 0 chunk 0: misses the contribution of ranks [1]" in result.errors[0]
    doc["segments"][1]["chunk"] = 1
    with pytest.raises(FieldError, match=r"segments\[1\]\.chunk"):
        fmt.from_dict(doc)
    doc["segments"][1].update(chunk=2, collective="allreduce")
    with pytest.raises(FieldError, match=r"segments\[1\]\.output_chunks"):
        fmt.from_dict(doc)


def _grouped() -> fmt.Schedule:
    """Eight ranks: an allreduce within each of the tensor-parallel pairs, then one across each pair's peers
    (two groups of four), then a reduce-scatter among all eight."""
    hosts = [f"h{i + 1}" for i in range(8)]
    tp = [[0, 1], [2, 3], [4, 5], [6, 7]]
    dp = [[0, 2, 4, 6], [1, 3, 5, 7]]
    comp = Composer(hosts, 16)
    first = comp.group_collective(_ring(2, 64), "tp", tp)
    second = comp.group_collective(_ring(4, 128), "dp", dp, {r: [first[r]] for r in range(8)})
    everyone = generate("ring", topology.build("star:hosts=8"), 256, collective="reduce_scatter")
    comp.collective(everyone, "all", {r: [second[r]] for r in range(8)})
    return comp.build("groups")


def test_process_groups_share_a_segment_and_each_computes_its_collective():
    sched = _grouped()
    assert [seg.groups for seg in sched.segments] == [((0, 1), (2, 3), (4, 5), (6, 7)),
                                                      ((0, 2, 4, 6), (1, 3, 5, 7)), ()]
    assert [len(s.members) for s in sched.shapes] == [2, 2, 2, 2, 4, 4, 8]
    assert sched.version == 3 and fmt.from_dict(sched.to_dict()) == sched
    assert executor.execute(sched).valid
    # every rank's peers in the dp segment are its own group's
    for r, prog in enumerate(sched.ranks):
        dp_peers = {op.peer for op in prog.ops if op.peer is not None and sched.segments[1].chunk <= op.chunk
                    < sched.segments[1].chunk + sched.segments[1].chunks and op.buffer == "data"}
        assert dp_peers <= {g for g in range(8) if g % 2 == r % 2} - {r}


def test_data_crossing_into_another_group_is_caught():
    """Ranks 0 and 1 trade places in the dp collective: a consistent exchange, but among the wrong groups."""
    sched = _grouped()
    seg = sched.segments[1]

    def in_dp(op: fmt.Op) -> bool:
        return op.is_comm and op.buffer == "data" and seg.chunk <= op.chunk < seg.chunk + seg.chunks

    swap = {0: 1, 1: 0}
    ops = {r: list(prog.ops) for r, prog in enumerate(sched.ranks)}
    for r in range(2, 8):
        ops[r] = [fmt.Op(**{**op.__dict__, "peer": swap.get(op.partner, op.partner)}) if in_dp(op) else op
                  for op in ops[r]]
    ops[0], ops[1] = ([theirs if in_dp(theirs) else mine for mine, theirs in zip(ops[a], ops[b], strict=True)]
                      for a, b in ((0, 1), (1, 0)))
    assert fmt.with_ops(sched, [ops[r] for r in range(8)]) != sched
    result = executor.execute(fmt.with_ops(sched, [ops[r] for r in range(8)]))
    assert not result.valid and not result.deadlock
    assert any("contribution of rank" in e for e in result.errors), result.errors


@pytest.mark.parametrize("groups, needle", [
    ([[0, 1], [1, 2]], "groups[1][0]"),
    ([[0]], "groups[0]"),
    ([[0, 9]], "groups[0][1]"),
    ("all", "segments[0].groups"),
])
def test_bad_groups_are_named(groups, needle):
    data = _grouped().to_dict()
    data["segments"][0]["groups"] = groups
    with pytest.raises(FieldError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        fmt.from_dict(data)


def test_groups_need_version_3():
    data = _grouped().to_dict()
    data["version"] = 2
    with pytest.raises(FieldError, match="version 3"):
        fmt.from_dict(data)
