"""One rank's dependency rules: which operations are ready, in what order they are queued, and from when.

Pure, and the one statement of the execution model (``docs/schedule-format.md``)
for everything that runs a schedule: the host agent (:mod:`emulator.emulation.agents.agent`)
runs it on sockets, the timing model (:mod:`emulator.model.prediction.timing`)
simulates it in time, and the symbolic executor
(:mod:`emulator.model.schedule.executor`) proves with it that the schedule is an
allreduce. The rules:

* An operation is ready once each of its dependencies is released. A
  dependency on a receive or a local operation is released when that
  completes (:meth:`Dispatcher.done`). A dependency on a send is released
  when the send completes, except that receives and local operations that
  depend on an *awaited* send (one another send of the rank depends on) are
  released as soon as it is written (:meth:`Dispatcher.written`): the data
  has left the buffer, but the next send must not share the uplink with its
  tail.
* Per :class:`Channel` (one direction of the connection to one peer on one
  lane), sends are queued in program order, and receives too: a
  communication operation is queued once it is ready and every earlier one
  of its channel is. The
  k-th send queued on a channel is matched with the k-th receive queued on
  the peer's opposite channel.

Every event carries a time, and every operation handed back carries the time
it became ready (local) or was queued (communication): the latest time among
the releases it waited for, not when the caller got round to it. The agents
schedule their messages from these *virtual* times, so the time an agent
spends on its own bookkeeping does not add to the emulated fabric's latency.
The executor's times are its round numbers.

Callers report what happened as events (:class:`Written`, :class:`Completed`,
given to :meth:`Dispatcher.apply`) or through the methods they stand for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from emulator.model.schedule.format import SEND, Op, RankProgram


@dataclass(frozen=True)
class Channel:
    """One direction of a rank's connection to ``peer`` on ``lane``: its sends to it (``sends``) or its receives."""

    peer: int
    sends: bool
    lane: int = 0

    @staticmethod
    def of(op: Op) -> Channel:
        """The channel a send or receive travels on (for a rank's own operation)."""
        return Channel(op.partner, op.kind == SEND, op.lane)

    def opposite(self, rank: int) -> Channel:
        """The peer's channel that carries the other end of this one's messages, ``rank`` being this side."""
        return Channel(rank, not self.sends, self.lane)


@dataclass(frozen=True)
class Ready:
    """An operation handed to the caller: run it (local) or queue it on its peer's channel (send, receive)."""

    op: Op
    at: float


@dataclass(frozen=True)
class Written:
    """An awaited send's data left its buffer at ``at`` (the acknowledgement comes later)."""

    op_id: int
    at: float


@dataclass(frozen=True)
class Completed:
    """An operation ran from ``start`` to ``end``."""

    op_id: int
    start: float
    end: float


Event = Written | Completed


class Dispatcher:
    """The rules above for one rank's program; see the module docstring."""

    def __init__(self, program: RankProgram):
        self.ops = {op.id: op for op in program.ops}
        self._order = {op.id: i for i, op in enumerate(program.ops)}
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
        # per channel (by its index in the order channels first appear): its op ids in program order, how many
        # are queued, and when the last one was
        self._channel_index: dict[Channel, int] = {}
        self._channel_of: dict[int, Channel] = {}
        self._queue_of: dict[int, int] = {}
        self._queues: list[list[int]] = []
        channels: list[Channel] = []
        by_key: dict[tuple[int, bool, int], int] = {}
        for op in program.ops:
            if op.is_comm:
                key = (op.partner, op.kind == SEND, op.lane)
                k = by_key.get(key)
                if k is None:
                    k = by_key[key] = len(channels)
                    channels.append(Channel(*key))
                    self._channel_index[channels[k]] = k
                    self._queues.append([])
                self._queues[k].append(op.id)
                self._queue_of[op.id] = k
                self._channel_of[op.id] = channels[k]  # one object per channel
        self._next = [0] * len(self._queues)
        self._last_queued_at = [float("-inf")] * len(self._queues)
        self._ready_comm: set[int] = set()
        self._released_written: set[int] = set()
        self.finished: set[int] = set()

    @property
    def pending(self) -> int:
        """Operations not yet completed."""
        return len(self.ops) - len(self.finished)

    @property
    def channels(self) -> list[Channel]:
        """Every channel this rank sends or receives on, in the order its first operation appears."""
        return list(self._channel_index)

    def channel_of(self, op_id: int) -> Channel:
        """The channel of send or receive ``op_id`` (always the same object: cheap to look up by)."""
        return self._channel_of[op_id]

    def channel_ops(self, channel: Channel) -> list[Op]:
        """The operations of ``channel``, in program order (none for a channel this rank does not use)."""
        return [self.ops[i] for i in self._channel_ids(channel)]

    def head(self, channel: Channel) -> Op | None:
        """The first operation of ``channel`` not completed yet (None: all are, or there are none)."""
        return next((self.ops[i] for i in self._channel_ids(channel) if i not in self.finished), None)

    def _channel_ids(self, channel: Channel) -> list[int]:
        k = self._channel_index.get(channel)
        return [] if k is None else self._queues[k]

    def released(self, op_id: int) -> bool:
        """Whether every dependency of ``op_id`` is released (it is ready, though perhaps not queued yet)."""
        return self._waiting[op_id] == 0

    def start(self, at: float) -> list[Ready]:
        """The operations without dependencies, ready at ``at``."""
        out: list[Ready] = []
        for op_id, left in self._waiting.items():
            if left == 0:
                self._ready_at[op_id] = at
                self._become_ready(op_id, out)
        return out

    def apply(self, event: Event) -> list[Ready]:
        """:meth:`written` or :meth:`done`, as ``event`` says."""
        if isinstance(event, Written):
            return self.written(event.op_id, event.at)
        return self.done(event.op_id, event.end)

    def written(self, op_id: int, at: float) -> list[Ready]:
        """An awaited send was written at ``at``: release its receive and local dependents."""
        out: list[Ready] = []
        if op_id not in self._released_written:
            self._released_written.add(op_id)
            self._release(self._on_written[op_id], at, out)
        return out

    def done(self, op_id: int, at: float) -> list[Ready]:
        """``op_id`` completed at ``at``: release what waited for it, in program order."""
        early = self._on_written.get(op_id)
        if not early or op_id in self._released_written:
            dependents = self._on_done.get(op_id, [])
        else:  # never reported written (a send the executor completes at once): everything goes now, in order
            dependents = sorted(early + self._on_done.get(op_id, []), key=self._order.__getitem__)
        self._released_written.add(op_id)
        out: list[Ready] = []
        self.finished.add(op_id)
        self._release(dependents, at, out)
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
