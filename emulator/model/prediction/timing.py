"""The timing model: when every transfer of a schedule starts and ends, by the host agents' own rules.

An event-driven, flow-level simulation of one execution. Its rules are those
of :mod:`emulator.emulation.agents.agent` (which follows the execution model of
``docs/schedule-format.md``), with the per-message latency terms of
:mod:`emulator.model.latency`:

1. Every rank starts at ``t = 0``.
2. Which operations are ready, and when they are queued, is
   :class:`~emulator.model.schedule.dispatch.Dispatcher`'s (the agents' own): an
   operation waits for its dependencies, receives and local work that depend
   on an *awaited* send only until it is written, and communication is queued
   per peer in program order. A receive is *posted* when it is queued.
3. A transfer (a matched send and receive, :func:`format.match_transfers`)
   starts at ``t_v = max(send queued, receive posted + L_cts)``. Its first
   byte arrives at ``max(t_v + message, posted + cts_path)``
   (:class:`~emulator.model.latency.PathLatency`), and from then its bytes flow,
   but not before the previous message on the same connection has drained:
   latency is in flight, it does not hold up the channel. (Open MPI's
   protocol, :class:`~emulator.model.latency.LatencyModel`'s ``eager_bytes``:
   an eager message has no ``L_cts`` and no ``cts_path``; a rendezvous's
   request to send leaves when the send is queued and the bytes written
   before it on its connection have drained, and its clear to send is the
   request's message latency later (or the receive's posting, if later) and
   the reply's after that; and every send completes once written, rule 6's
   ACK is not waited for.)
4. Flows share links max-min fairly: every directed link's goodput is shared
   by progressive filling over the flows crossing it, recomputed whenever a
   flow starts or drains (:func:`emulator.model.prediction.cost.maxmin_rates`).
5. A drained flow's send is *written*; its last frame
   (:func:`~emulator.model.topology.last_segment_bytes`) still crosses every link
   after the first, one frame time per link (store-and-forward), and then
   its data has arrived.
6. A send completes when written; an awaited one ``ack`` after its data
   arrived, or later: the receiver's ACK leaves its host behind that host's
   own outgoing frames on the link it takes (:func:`ack_departure`). A
   shaper lets a frame go and then holds the link for the frame's time: a
   flow there whose last frame left while the message's last one was on
   its way holds the ACK for that frame; one still flowing when the
   message arrived, until it drains, at most a full frame time. (In
   halving-doubling's exchanges both sides finish together: a last frame
   per round, which weighs ``scale`` times more in a scaled-down workload;
   docs/fidelity.md has the capture that showed it.)
   Local operations, and a ``recv_reduce``'s addition after its data
   arrived, take ``gamma`` seconds per byte.
7. A ``compute`` operation takes its ``seconds`` times ``compute_dilation``
   (the fabric profile's dilation ``D``: a replay sleeps ``D·seconds``; 1
   for the real system's time) and then completes like a local operation.
   A rank has one compute stream, as an accelerator runs one kernel at a
   time: its compute operations run one after another in the order they
   became ready, as the agents run them.

Over a server's accelerator interconnect (``switches`` is
:data:`~emulator.model.fabric.DOMAIN`) a transfer has no frames: it has no
store-and-forward tail, and its send completes when its bytes drain, as
:mod:`emulator.emulation.agents.interconnect` times it.

Connections: the transfers of one sender, receiver and *lane* form one
connection (rules 3 and 5 hold per connection); different lanes between the
same ranks are separate connections whose flows share links max-min like any
others. ``path_of(src, dst, lane)`` gives each one's links. A path without
links is free: its transfers drain as soon as their first byte is due
(:func:`free_path`, with which :func:`compute_only_s` finds a schedule's time
when communication costs nothing).

So halving-doubling's lockstep rounds wait for their slowest pair and pay a
rendezvous per round, while a ring's pre-posted receives let it pipeline, as
they do on real sockets. :func:`simulate` returns every transfer's times and
the makespan.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from emulator.model.fabric import DOMAIN
from emulator.model.latency import ZERO, PathLatency
from emulator.model.prediction.cost import Link, maxmin_rates
from emulator.model.schedule.dispatch import Dispatcher, Ready
from emulator.model.schedule.format import COMPUTE, RECV_REDUCE, SEND, Schedule, match_transfers
from emulator.model.topology import last_segment_bytes

_EPS = 1e-12


@dataclass
class TransferTiming:
    """One transfer's path and when it happened in the simulation (seconds from the start)."""

    src: int
    dst: int
    send_id: int
    recv_id: int
    step: int
    bytes: int
    links: list[Link]
    latency: PathLatency
    tail_s: float
    lane: int = 0
    domain: bool = False  # over a server's interconnect: complete when drained, no tail, no ACK
    posted: float | None = None
    cts_due: float | None = None  # when its clear to send is due, once known
    requested: float | None = None  # when its request to send left (an Open MPI rendezvous)
    cts_at: float | None = None
    queued: float | None = None
    start: float | None = None  # t_v
    first_byte: float | None = None
    drained: float | None = None
    end: float | None = None


@dataclass
class Timing:
    """What :func:`simulate` found: every transfer's times, per-step spans and the makespan (seconds)."""

    transfers: list[TransferTiming]
    makespan_s: float
    op_end: dict[tuple[int, int], float] = field(default_factory=dict)

    def step_spans(self) -> dict[int, tuple[float, float]]:
        """Per step: from its first transfer's start to its last transfer's end."""
        spans: dict[int, list[float]] = {}
        for t in self.transfers:
            assert t.start is not None and t.end is not None
            span = spans.setdefault(t.step, [t.start, t.end])
            span[0], span[1] = min(span[0], t.start), max(span[1], t.end)
        return {s: (a, b) for s, (a, b) in sorted(spans.items())}


#: ``(src_rank, dst_rank, lane) -> (directed links, their capacities in bytes/s, switches crossed)``.
PathOf = Callable[[int, int, int], tuple[list[Link], list[float], int]]
#: A connection: sender, receiver and lane.
Conn = tuple[int, int, int]


def is_reverse(link: Link, back: Link) -> bool:
    """Whether ``back`` runs along ``link`` the other way (a link's first name may carry its sending port,
    ``s17-eth6``: :func:`emulator.model.prediction.cost.physical_links`)."""
    return back[0].split("-eth")[0] == link[1] and back[1] == link[0].split("-eth")[0]


def ack_departure(arrived: float, drained: float, behind: Iterable[tuple[float, float]], frame_s: float) -> float:
    """When the ACK of a message leaves its receiver's host (rule 6).

    ``arrived`` and ``drained`` are the message's (seconds); ``behind``
    holds, for each flow leaving the receiver by the link the ACK takes
    (that flowed while the message did), when it drained (``inf``: not yet)
    and its last frame's time on that link; ``frame_s`` is a full frame's.
    A flow that drained before the message did holds nothing up; one whose
    last frame left while the message's was on its way holds the ACK for
    that frame; one still flowing when the message arrived, until it
    drains, at most a frame time.
    """
    leaves = arrived
    for other_drained, last_frame_s in behind:
        if other_drained < drained - _EPS:
            continue
        if other_drained <= arrived + _EPS:
            leaves = max(leaves, arrived + last_frame_s)
        else:
            leaves = max(leaves, min(other_drained, arrived + frame_s))
    return leaves


def free_path(src: int, dst: int, lane: int) -> tuple[list[Link], list[float], int]:
    """A path that costs nothing: no links and no switches (its transfers take no time at all)."""
    return [], [], 0


class _Simulation:
    """The mutable state of one :func:`simulate` run (see the module docstring for the rules)."""

    def __init__(self, schedule: Schedule, path_of: PathOf, latency_of: Callable[[int], PathLatency],
                 mss: int, gamma: float, compute_dilation: float):
        self.gamma = gamma
        self.compute_dilation = compute_dilation
        self.mss = mss
        self.dispatch = {r.rank: Dispatcher(r) for r in schedule.ranks}
        self.capacity: dict[Link, float] = {}
        self.transfers: list[TransferTiming] = []
        self.by_send: dict[tuple[int, int], int] = {}
        self.by_recv: dict[tuple[int, int], int] = {}
        for a, send_id, b, recv_id in match_transfers(schedule):
            op = self.dispatch[a].ops[send_id]
            links, caps, switches = path_of(a, b, op.lane)
            self.capacity.update(zip(links, caps, strict=True))
            domain = switches == DOMAIN
            # over an interconnect no frame is stored and forwarded: the bytes are through when they drain
            tail = 0.0 if domain else sum(last_segment_bytes(op.bytes, mss) / cap for cap in caps[1:])
            self.by_send[(a, send_id)] = self.by_recv[(b, recv_id)] = len(self.transfers)
            self.transfers.append(TransferTiming(a, b, send_id, recv_id, op.step, op.bytes, links,
                                                 latency_of(switches), tail, op.lane, domain))
        # per connection (src, dst, lane): sends queued, waiting for their clear to send, in order; whether
        # bytes of one are flowing; and the ones whose first byte is due behind those
        self.channel: dict[Conn, list[int]] = defaultdict(list)
        self.busy: set[Conn] = set()
        self.backlog: dict[Conn, list[int]] = defaultdict(list)
        # per connection: transfers started and not drained; Open MPI rendezvous requests written behind them
        self.unfinished: dict[Conn, int] = defaultdict(int)
        self.requests: dict[Conn, list[int]] = defaultdict(list)
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.active: dict[int, float] = {}  # transfer -> bytes left
        self.rates: dict[int, float] = {}
        self.op_end: dict[tuple[int, int], float] = {}
        self.compute_free: dict[int, float] = {}  # per rank: when its compute stream is free
        # rule 6: the transfers leaving by each link; awaited transfers whose ACK has not left yet (the link it
        # takes, the flows on it it still waits for, those it found there); when their data arrived
        self.leaving: dict[Link, list[int]] = defaultdict(list)
        for i, tr in enumerate(self.transfers):
            if tr.links:
                self.leaving[tr.links[0]].append(i)
        self.ack_behind: dict[int, tuple[Link | None, set[int], set[int]]] = {}  # (its link, active now, at first)
        self.arrived_at: dict[int, float] = {}
        self.exit_link: dict[Link, Link | None] = {}

    def push(self, when: float, kind: str, rank: int, op_id: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, rank, op_id))

    def hand(self, rank: int, ready: list[Ready]) -> None:
        """Operations the rank's dispatcher released: local ones run, communication is queued."""
        for r in ready:
            op = r.op
            if op.kind == COMPUTE:  # one compute stream per rank, in release order (as the agents run it)
                start = max(r.at, self.compute_free.get(rank, 0.0))
                self.compute_free[rank] = start + self.compute_dilation * op.seconds
                self.push(self.compute_free[rank], "done", rank, op.id)
            elif not op.is_comm:
                self.push(r.at + self.gamma * op.bytes, "done", rank, op.id)
            elif op.kind == SEND:
                i = self.by_send[(rank, op.id)]
                tr = self.transfers[i]
                tr.queued = r.at
                conn = (rank, op.partner, op.lane)
                if tr.latency.needs_request(tr.bytes):  # its request follows what the connection carries
                    if self.unfinished[conn]:
                        self.requests[conn].append(i)
                    else:
                        tr.requested = r.at
                        self.schedule_cts(tr)
                self.channel[conn].append(i)
                self.try_start(conn)
            else:
                tr = self.transfers[self.by_recv[(rank, op.id)]]
                tr.posted = r.at
                self.schedule_cts(tr)

    def schedule_cts(self, tr: TransferTiming) -> None:
        """The transfer's clear to send, once when it can be known (:meth:`PathLatency.clear_to_send_at`)."""
        if tr.cts_due is None:
            tr.cts_due = tr.latency.clear_to_send_at(tr.bytes, tr.posted, tr.requested)
            if tr.cts_due is not None:
                self.push(tr.cts_due, "cts", tr.src, tr.send_id)

    def try_start(self, conn: Conn) -> None:
        """Start the sends queued on connection ``conn`` whose clear to send is in, in order."""
        queue = self.channel[conn]
        while queue and self.transfers[queue[0]].cts_at is not None:
            tr = self.transfers[queue.pop(0)]
            assert tr.posted is not None
            tr.start = self.now
            self.unfinished[conn] += 1
            first = max(tr.start + tr.latency.message_s, tr.posted + tr.latency.first_byte_after_post_s(tr.bytes))
            self.push(first, "flow", conn[0], tr.send_id)

    def done(self, rank: int, op_id: int) -> None:
        self.op_end[(rank, op_id)] = self.now
        self.hand(rank, self.dispatch[rank].done(op_id, self.now))

    def handle(self, kind: str, rank: int, op_id: int) -> None:
        if kind == "done":
            self.done(rank, op_id)
        elif kind == "cts":
            tr = self.transfers[self.by_send[(rank, op_id)]]
            tr.cts_at = self.now
            self.try_start((tr.src, tr.dst, tr.lane))
        elif kind == "flow":
            i = self.by_send[(rank, op_id)]
            tr = self.transfers[i]
            tr.first_byte = self.now
            conn = (tr.src, tr.dst, tr.lane)
            if conn in self.busy:  # its bytes follow the previous message's in the same stream
                self.backlog[conn].append(i)
                return
            self.busy.add(conn)
            self.flow(i)
            self.reshare()
        elif kind == "arrived":
            tr = self.transfers[self.by_recv[(rank, op_id)]]
            if self.acknowledged(tr):
                self.acknowledge(self.by_recv[(rank, op_id)])
            reduce_s = self.gamma * tr.bytes if self.dispatch[rank].ops[op_id].kind == RECV_REDUCE else 0.0
            if reduce_s > 0:
                self.push(self.now + reduce_s, "reduced", rank, op_id)
            else:
                self.handle("reduced", rank, op_id)
        elif kind == "ack_due":
            self.settle_ack(self.by_send[(rank, op_id)])
        elif kind == "reduced":
            self.transfers[self.by_recv[(rank, op_id)]].end = self.now
            self.done(rank, op_id)

    def acknowledged(self, tr: TransferTiming) -> bool:
        """The transfer's send is awaited and completes on its receiver's ACK (rule 6; not Open MPI's)."""
        return tr.send_id in self.dispatch[tr.src].awaited and tr.latency.sends_wait_for_ack and not tr.domain

    def reverse(self, link: Link) -> Link | None:
        """The directed link back along ``link``, if some transfer uses it."""
        if link not in self.exit_link:
            self.exit_link[link] = next((lk for lk in self.capacity if is_reverse(link, lk)), None)
        return self.exit_link[link]

    def acknowledge(self, i: int) -> None:
        """Transfer ``i``'s data arrived: its receiver sends the ACK its (awaited) send completes on (rule 6)."""
        tr = self.transfers[i]
        out = self.reverse(tr.links[-1]) if tr.links else None
        self.arrived_at[i] = self.now
        ahead = {j for j in self.leaving[out] if j in self.active} if out is not None else set()
        self.ack_behind[i] = (out, ahead, set(ahead))
        if ahead and out is not None:
            self.push(self.now + self.mss / self.capacity[out], "ack_due", tr.src, tr.send_id)
        else:
            self.settle_ack(i)

    def settle_ack(self, i: int) -> None:
        """The flows transfer ``i``'s ACK waited behind have drained, or a frame time passed: when it leaves."""
        if i not in self.ack_behind:
            return
        out, _, ahead = self.ack_behind.pop(i)
        tr = self.transfers[i]
        leaves = self.arrived_at[i]
        if out is not None:
            assert tr.drained is not None
            behind = []
            for j in self.leaving[out]:
                other = self.transfers[j]
                if j in ahead or (other.drained is not None and other.drained <= leaves + _EPS):
                    behind.append((math.inf if other.drained is None else other.drained,
                                   last_segment_bytes(other.bytes, self.mss) / self.capacity[out]))
            leaves = ack_departure(leaves, tr.drained, behind, self.mss / self.capacity[out])
        self.push(max(self.now, leaves) + tr.latency.ack_s, "done", tr.src, tr.send_id)

    def flow(self, i: int) -> None:
        """Transfer ``i``'s bytes start to flow (its connection is now busy with it); on a free path they are
        through at once. The caller reshares the links."""
        tr = self.transfers[i]
        if tr.links:
            self.active[i] = float(tr.bytes)
        else:
            self.drained(i)

    def drained(self, i: int) -> None:
        tr = self.transfers[i]
        tr.drained = self.now
        for waiting, (_, active, _) in list(self.ack_behind.items()):
            if i in active:
                active.discard(i)
                if not active:
                    self.settle_ack(waiting)
        if self.acknowledged(tr):
            self.hand(tr.src, self.dispatch[tr.src].written(tr.send_id, self.now))
        else:
            self.done(tr.src, tr.send_id)
        self.push(self.now + tr.tail_s, "arrived", tr.dst, tr.recv_id)
        conn = (tr.src, tr.dst, tr.lane)
        self.unfinished[conn] -= 1
        if not self.unfinished[conn]:
            for j in self.requests.pop(conn, []):
                self.transfers[j].requested = self.now
                self.schedule_cts(self.transfers[j])
        self.busy.discard(conn)
        if self.backlog[conn]:
            nxt = self.backlog[conn].pop(0)
            self.busy.add(conn)
            self.flow(nxt)

    def reshare(self) -> None:
        ids = list(self.active)
        rates = maxmin_rates([self.transfers[i].links for i in ids], self.capacity) if ids else []
        self.rates = dict(zip(ids, rates, strict=True))

    def run(self) -> Timing:
        for rank, dispatcher in self.dispatch.items():
            self.hand(rank, dispatcher.start(0.0))
        while self.events or self.active:
            next_event = self.events[0][0] if self.events else float("inf")
            drain_at = min((self.now + left / self.rates[i] for i, left in self.active.items()),
                           default=float("inf"))
            until = max(self.now, min(next_event, drain_at))
            for i in self.active:
                self.active[i] -= self.rates[i] * (until - self.now)
            self.now = until
            finished = [i for i, left in self.active.items() if left <= _EPS * self.transfers[i].bytes
                        or left / self.rates[i] <= _EPS]
            if finished:
                for i in finished:
                    del self.active[i]
                for i in finished:
                    self.drained(i)
                self.reshare()
                continue
            _, _, kind, rank, op_id = heapq.heappop(self.events)
            self.handle(kind, rank, op_id)
        for rank, dispatcher in self.dispatch.items():
            if dispatcher.pending:
                op = next(op for op in dispatcher.ops.values() if op.id not in dispatcher.finished)
                raise ValueError(f"timing model: rank {rank} {op.describe()} never ran "
                                 "(the schedule deadlocks; `emu schedule check` names the cycle)")
        return Timing(self.transfers, max(self.op_end.values(), default=0.0), self.op_end)


def simulate(schedule: Schedule, path_of: PathOf, latency_of: Callable[[int], PathLatency] = lambda s: ZERO, *,
             mss: int = 8948, gamma: float = 0.0, compute_dilation: float = 1.0) -> Timing:
    """Simulate one execution of ``schedule`` (see the module docstring).

    ``path_of(src_rank, dst_rank, lane)`` returns the connection's directed
    links, their capacities (bytes/s) and the number of switches it crosses
    (no links: free, :func:`free_path`); ``latency_of(switches)`` its latency
    terms; ``mss`` is the payload of a full frame (bytes), for the
    store-and-forward of the last frame; a ``compute`` op takes its
    ``seconds`` times ``compute_dilation`` (pass the fabric profile's
    ``dilation`` for emulated seconds, 1 for the real system's).
    Raises :class:`ValueError` for a schedule that deadlocks.
    """
    return _Simulation(schedule, path_of, latency_of, mss, gamma, compute_dilation).run()


def compute_only_s(schedule: Schedule, compute_dilation: float = 1.0) -> float:
    """The schedule's time with communication free: the longest chain of ``compute`` ops along dependencies
    (a rank's own, and across ranks through the messages, which take no time).

    Seconds of the real system with ``compute_dilation`` 1 (the default),
    emulated ones with the fabric profile's dilation; 0 for a schedule
    without compute. Raises :class:`ValueError` for a schedule that deadlocks.
    """
    return simulate(schedule, free_path, compute_dilation=compute_dilation).makespan_s
