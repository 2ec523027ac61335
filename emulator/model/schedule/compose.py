"""Composing one schedule out of several: collectives, point-to-point messages and compute, in dependency order.

A training iteration or a recorded trace is not one collective: it is, per
rank, a graph of compute, collectives and messages. :class:`Composer` builds
such a schedule out of parts, each a :class:`~emulator.model.schedule.format.Segment`
of the result (its own ranges of ``data`` and ``output`` and its own chunk
labels, so the symbolic executor and the agents' data check verify every
collective in it):

* :meth:`Composer.collective` adds a whole schedule over the same ranks (as
  a generator or importer built it) at fresh buffer ranges;
* :meth:`Composer.group_collective` adds one within each of several process
  groups (a communicator split: every group runs it on the same ranges);
* :meth:`Composer.message` adds one point-to-point message (a ``p2p``
  segment: delivery is checked, no data);
* :meth:`Composer.compute` adds a ``compute`` operation to one rank.

Every part is added *after* some earlier parts of the same rank (a
:class:`Node` each): its first operations (those without dependencies inside
the part) then depend on the last operations of those parts (those nothing
else in them depends on). Steps are renumbered so that every part's steps
follow those of everything added before it, which keeps a step never below
its dependencies' and matched sends and receives in one step.

Chunks are of one size for the whole schedule (``chunk_bytes``): every part
must be built with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from emulator.base.errors import FieldError
from emulator.model.schedule.format import (
    MAX_STEPS,
    RECV,
    SEND,
    Op,
    RankProgram,
    Schedule,
    Segment,
    compute_op,
    validate,
)
from emulator.model.schedule.semantics import MIXED, P2P


@dataclass(frozen=True)
class Node:
    """A part as one rank sees it: the ids of its operations there that nothing else in the part waits for."""

    rank: int
    sinks: tuple[int, ...]


@dataclass
class _Rank:
    host: str
    ops: list[Op] = field(default_factory=list)
    last_step: int = -1


class Composer:
    """Builds one schedule out of parts over the ranks placed on ``hosts``; see the module docstring."""

    def __init__(self, hosts: Sequence[str], chunk_bytes: int, dtype: str = "float32"):
        self.ranks = [_Rank(h) for h in hosts]
        self.chunk_bytes = chunk_bytes
        self.dtype = dtype
        self.segments: list[Segment] = []
        self.data_chunks = 0
        self.output_chunks = 0
        self.scratch_chunks = 0
        self.step = 0  # the first step of the next part

    @property
    def p(self) -> int:
        return len(self.ranks)

    def collective(self, part: Schedule, name: str, after: Mapping[int, Iterable[Node]] | None = None,
                   ) -> list[Node]:
        """Add ``part`` (a schedule over the same ranks, same chunk size) after ``after[rank]``; one node per rank.

        Its ``data``, ``output`` and ``scratch`` chunks get fresh ranges; its
        scratch is reused by no other part, so parts may overlap in time.
        """
        if part.p != self.p:
            raise ValueError(f"part {name!r}: {part.p} ranks, composing {self.p}")
        nodes = self._add(part, name, (tuple(range(self.p)),), after, grouped=False)
        return [nodes[r] for r in range(self.p)]

    def group_collective(self, part: Schedule, name: str, groups: Sequence[Sequence[int]],
                         after: Mapping[int, Iterable[Node]] | None = None) -> dict[int, Node]:
        """Add ``part`` within each of ``groups`` (lists of ranks, each as many as ``part`` has): its rank ``i``
        runs on the group's ``i``-th rank. One segment for all the groups (they share its buffer ranges, as one
        collective on a split communicator); one node per rank of every group."""
        for g in groups:
            if len(g) != part.p:
                raise ValueError(f"part {name!r}: {part.p} ranks, group {list(g)} has {len(g)}")
        return self._add(part, name, tuple(tuple(g) for g in groups), after, grouped=True)

    def _add(self, part: Schedule, name: str, groups: tuple[tuple[int, ...], ...],
             after: Mapping[int, Iterable[Node]] | None, grouped: bool) -> dict[int, Node]:
        if not part.layout.equal or part.chunk_bytes % self.chunk_bytes:
            raise ValueError(f"part {name!r}: chunks of {part.layout.largest_bytes} bytes"
                             f"{'' if part.layout.equal else ' (unequal)'}, composing {self.chunk_bytes}-byte chunks")
        part = refine(part, part.chunk_bytes // self.chunk_bytes)
        if part.segments:
            raise ValueError(f"part {name!r} has segments of its own")
        offsets = {"data": self.data_chunks, "output": self.output_chunks, "scratch": self.scratch_chunks}
        self.segments.append(Segment(name, part.collective, self.data_chunks, part.chunks, self.output_chunks,
                                     part.output_chunks, part.root, groups if grouped else ()))
        self.data_chunks += part.chunks
        self.output_chunks += part.output_chunks
        self.scratch_chunks += part.scratch_chunks
        nodes = {}
        for group in groups:
            for i, prog in enumerate(part.ranks):
                ops = [op if op.peer is None else replace(op, peer=group[op.peer]) for op in prog.ops]
                nodes[group[i]] = self._splice(group[i], ops, offsets, (after or {}).get(group[i], ()))
        self.step += part.steps
        return nodes

    def message(self, src: int, dst: int, nchunks: int, lane: int = 0, name: str = "message",
                after_src: Iterable[Node] = (), after_dst: Iterable[Node] = ()) -> tuple[Node, Node]:
        """One point-to-point message of ``nchunks`` chunks from ``src`` to ``dst`` on ``lane``: its send and receive.

        It is a ``p2p`` segment of its own: the sender's chunks are sent into
        the same range of the receiver's ``data``.
        """
        lo = self.data_chunks
        self.segments.append(Segment(name, P2P, lo, nchunks))
        self.data_chunks += nchunks
        nbytes = nchunks * self.chunk_bytes
        send = Op(id=0, kind=SEND, chunk=0, nchunks=nchunks, bytes=nbytes, step=0, peer=dst, lane=lane)
        recv = Op(id=0, kind=RECV, chunk=0, nchunks=nchunks, bytes=nbytes, step=0, peer=src, lane=lane)
        offsets = {"data": lo, "output": 0, "scratch": 0}
        out = (self._splice(src, [send], offsets, after_src), self._splice(dst, [recv], offsets, after_dst))
        self.step += 1
        return out

    def compute(self, rank: int, seconds: float, after: Iterable[Node] = ()) -> Node:
        """A compute operation of ``seconds`` on ``rank``, after ``after``."""
        me = self.ranks[rank]
        deps = sorted({d for node in after for d in self._own(rank, node)})
        step = max((me.ops[d].step for d in deps), default=max(me.last_step, 0))
        op = compute_op(len(me.ops), seconds, step, deps)
        me.ops.append(op)
        return Node(rank, (op.id,))

    def build(self, algorithm: str, meta: Mapping[str, Any] | None = None, topology: str | None = None,
              placement: str | None = None) -> Schedule:
        """The composed schedule, validated (:class:`FieldError` when it has more steps than the format allows)."""
        if self.step > MAX_STEPS:
            raise FieldError(f"schedule {algorithm!r}", "steps", f"at most {MAX_STEPS} (one per collective step and "
                             "per message of what is composed)", self.step)
        kinds = {seg.collective for seg in self.segments}
        # compute alone carries no data: point-to-point's "nothing to check"
        collective = P2P if not kinds else kinds.pop() if len(kinds) == 1 else MIXED
        dtype = self.dtype
        schedule = Schedule(
            algorithm=algorithm, size=max(self.data_chunks, 1) * self.chunk_bytes, chunks=max(self.data_chunks, 1),
            ranks=tuple(RankProgram(r, me.host, tuple(me.ops)) for r, me in enumerate(self.ranks)),
            scratch_chunks=self.scratch_chunks, dtype=dtype, collective=collective, topology=topology,
            placement=placement, meta=dict(meta or {}), output_chunks=self.output_chunks,
            segments=tuple(self.segments))
        return validate(schedule, f"schedule {algorithm!r}")

    # ------------------------------------------------------------------ parts
    def _own(self, rank: int, node: Node) -> tuple[int, ...]:
        if node.rank != rank:
            raise ValueError(f"rank {rank}'s part cannot wait for a part of rank {node.rank}")
        return node.sinks

    def _splice(self, rank: int, ops: Sequence[Op], offsets: Mapping[str, int], after: Iterable[Node]) -> Node:
        """Append ``ops`` (one rank's program of a part) with fresh ids (their list positions), buffer offsets and
        steps from :attr:`step` on (above every earlier part's); their entry operations wait for ``after``."""
        me = self.ranks[rank]
        before = sorted({d for node in after for d in self._own(rank, node)})
        base = len(me.ops)
        new_id = {op.id: base + i for i, op in enumerate(ops)}
        waited = {d for op in ops for d in op.deps}
        for op in ops:
            deps = tuple(new_id[d] for d in op.deps) if op.deps else tuple(before)
            me.ops.append(replace(op, id=new_id[op.id], chunk=op.chunk + offsets.get(op.buffer, 0) if op.nchunks else 0,
                                  src_chunk=None if op.src is None else (op.src_chunk or 0) + offsets[op.src],
                                  step=op.step + self.step, deps=deps))
            me.last_step = max(me.last_step, me.ops[-1].step)
        return Node(rank, tuple(new_id[op.id] for op in ops if op.id not in waited))


def refine(schedule: Schedule, factor: int) -> Schedule:
    """The same schedule on chunks ``factor`` times smaller: chunk ``c`` becomes chunks ``c·f .. c·f+f-1``.

    Every collective's meaning scales with its chunks, so the result proves
    and runs as the original does.
    """
    if factor == 1:
        return schedule

    def split(op: Op) -> Op:
        if not op.nchunks:
            return op
        return replace(op, chunk=op.chunk * factor, nchunks=op.nchunks * factor,
                       src_chunk=None if op.src_chunk is None else op.src_chunk * factor)

    ranks = tuple(RankProgram(r.rank, r.host, tuple(split(op) for op in r.ops)) for r in schedule.ranks)
    segments = tuple(replace(seg, chunk=seg.chunk * factor, chunks=seg.chunks * factor,
                             output_chunk=seg.output_chunk * factor, output_chunks=seg.output_chunks * factor)
                     for seg in schedule.segments)
    return replace(schedule, chunks=schedule.chunks * factor, output_chunks=schedule.output_chunks * factor,
                   scratch_chunks=schedule.scratch_chunks * factor, ranks=ranks, segments=segments)
