"""One rank's dependency rules: which operations are ready, in what order they are queued, and from when.

Pure, shared by the host agent (:mod:`emulator.agent`), which runs them on
sockets, and the timing model (:mod:`emulator.schedule.timing`), which
simulates them, so both follow one set of rules (``docs/schedule-format.md``,
execution model):

* An operation is ready once each of its dependencies is released. A
  dependency on a receive or a local operation is released when that
  completes (:meth:`Dispatcher.done`). A dependency on a send is released
  when the send completes, except that receives and local operations that
  depend on an *awaited* send (one another send of the rank depends on) are
  released as soon as it is written (:meth:`Dispatcher.written`): the data
  has left the buffer, but the next send must not share the uplink with its
  tail.
* Per peer, sends are queued in program order, and receives too: a
  communication operation is queued once it is ready and every earlier one
  of its queue is.

Every event carries a time, and every operation handed back carries the time
it became ready (local) or was queued (communication): the latest time among
the releases it waited for, not when the caller got round to it. The agents
schedule their messages from these *virtual* times, so the time an agent
spends on its own bookkeeping does not add to the emulated fabric's latency.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from emulator.schedule.format import SEND, Op, RankProgram


@dataclass(frozen=True)
class Ready:
    """An operation handed to the caller: run it (local) or queue it on its peer's channel (send, receive)."""

    op: Op
    at: float


class Dispatcher:
    """The rules above for one rank's program; see the module docstring."""

    def __init__(self, program: RankProgram):
        self.ops = {op.id: op for op in program.ops}
        sends = {op.id for op in program.ops if op.kind == SEND}
        #: Sends another send of this rank depends on.
        self.awaited = frozenset(d for op in program.ops if op.kind == SEND for d in op.deps if d in sends)
        self._on_written: dict[int, list[int]] = defaultdict(list)
        self._on_done: dict[int, list[int]] = defaultdict(list)
        for op in program.ops:
            for d in op.deps:
                early = d in self.awaited and op.kind != SEND
                (self._on_written if early else self._on_done)[d].append(op.id)
        self._waiting = {op.id: len(op.deps) for op in program.ops}
        self._ready_at: dict[int, float] = {}
        self._queues: dict[tuple[bool, int], list[int]] = defaultdict(list)
        self._queue_of: dict[int, tuple[bool, int]] = {}
        for op in program.ops:
            if op.is_comm:
                key = (op.kind == SEND, op.partner)
                self._queues[key].append(op.id)
                self._queue_of[op.id] = key
        self._next = {key: 0 for key in self._queues}
        self._last_queued_at = {key: float("-inf") for key in self._queues}
        self._ready_comm: set[int] = set()
        self._released_written: set[int] = set()
        self.finished: set[int] = set()

    @property
    def pending(self) -> int:
        """Operations not yet completed."""
        return len(self.ops) - len(self.finished)

    def start(self, at: float) -> list[Ready]:
        """The operations without dependencies, ready at ``at``."""
        out: list[Ready] = []
        for op_id, left in self._waiting.items():
            if left == 0:
                self._ready_at[op_id] = at
                self._become_ready(op_id, out)
        return out

    def written(self, op_id: int, at: float) -> list[Ready]:
        """An awaited send was written at ``at``: release its receive and local dependents."""
        out: list[Ready] = []
        if op_id not in self._released_written:
            self._released_written.add(op_id)
            self._release(self._on_written[op_id], at, out)
        return out

    def done(self, op_id: int, at: float) -> list[Ready]:
        """``op_id`` completed at ``at``: release what waited for it."""
        out = self.written(op_id, at)
        self.finished.add(op_id)
        self._release(self._on_done[op_id], at, out)
        return out

    def _release(self, dependents: list[int], at: float, out: list[Ready]) -> None:
        for nxt in dependents:
            self._waiting[nxt] -= 1
            self._ready_at[nxt] = max(self._ready_at.get(nxt, at), at)
            if self._waiting[nxt] == 0:
                self._become_ready(nxt, out)

    def _become_ready(self, op_id: int, out: list[Ready]) -> None:
        op = self.ops[op_id]
        if not op.is_comm:
            out.append(Ready(op, self._ready_at[op_id]))
            return
        self._ready_comm.add(op_id)
        key = self._queue_of[op_id]
        ids = self._queues[key]
        while self._next[key] < len(ids) and ids[self._next[key]] in self._ready_comm:
            queued = ids[self._next[key]]
            self._next[key] += 1
            at = max(self._ready_at[queued], self._last_queued_at[key])
            self._last_queued_at[key] = at
            out.append(Ready(self.ops[queued], at))
