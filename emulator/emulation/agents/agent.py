"""The host agent: one process per rank, inside its Mininet host, replaying a schedule over real TCP.

Started by :mod:`emulator.emulation.session.replay` (through :mod:`emulator.emulation.agents.agent_launcher`) as
``python -m emulator.emulation.agents.agent --schedule F --topology T --rank R --control SOCK
--log FILE --latency PLAN``. It:

1. listens on its host's IP, port :data:`routing.AGENT_LISTEN_PORT`, and opens
   one TCP connection to every rank it sends to per lane it uses, from the
   source port :func:`emulator.model.routing.agent_flow` gives that lane -- the
   5-tuple it predicts, so the controller's path and the checker's
   prediction are the path the bytes take;
2. reports ``ready`` on the control socket (:mod:`emulator.emulation.agents.agent_protocol`, a Unix
   socket: it crosses network namespaces) and waits for ``go`` -- the
   barrier, so every connection is established before the clock starts;
3. per repetition: fills its buffers with values that identify the rank and
   element (:mod:`emulator.model.schedule.buffers`), runs its operations honouring their
   dependencies (sends and receives on different connections run
   concurrently; on one connection in program order, so TCP stream order
   matches the schedule), really adds received data for
   ``recv_reduce``/``reduce``, runs ``compute`` operations as timed work (the
   recorded seconds times the plan's time dilation, one at a time, as on one
   accelerator stream), records every operation's start and end on
   ``CLOCK_MONOTONIC`` (shared by all namespaces), checks that its buffers
   hold the collective's result, and reports ``done`` with its timings.

Where the topology gives servers an accelerator interconnect (``domain_bw``),
the connections to ranks of the same server are Unix sockets instead, and
their transfers are timed by the interconnect's arbiter rather than by links
(:mod:`emulator.emulation.agents.interconnect`): the same protocol, the same latency rule,
each send complete when the arbiter says its bytes are through.

The parts: :mod:`emulator.emulation.agents.peer` owns the data connections (set-up, framing,
delivery tracking); :class:`~emulator.model.schedule.dispatch.Dispatcher` decides
which operation may run when (the rules the schedule checker proves
schedules with); :mod:`emulator.model.schedule.buffers` does the numeric work. This module
composes them: per repetition, one send worker thread per connection it
sends on, one receive worker per connection it receives on, one compute
worker, and the main thread, which feeds the workers' events to the
dispatcher and runs local operations.

Messages follow a rendezvous protocol, as large messages do in MPI and as
NCCL's InfiniBand transport does (the receiver posts a buffer, the sender
writes into it): a receiver posts a receive once its dependencies are done
and the earlier receives from that peer are posted, sends a *clear to send*
back on the same connection, and the sender starts the message only on
receiving it. Receives that depend on nothing (a ring's) are all posted at
once, so a pipeline never waits on a clear to send. This is the schedule
checker's execution model too (a send and its receive complete together once
both are ready). Without it, a rank that ran late let its partners' *next*
messages reach it while it still received the current one: two flows met at
one switch port in a contention-free schedule, the late transfer slowed
further, and in halving-doubling's lockstep rounds the lateness fed itself.

The latency plan (:func:`latency_plan`, written by the replay) gives every
path this rank sends on its fabric profile's latency terms
(:class:`emulator.model.latency.PathLatency`): the send worker holds each message
back until the profile's rendezvous and message latency have passed, counted
in virtual time from when the operations became ready
(:mod:`emulator.model.schedule.dispatch`), less what this machine adds by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from emulator.base.files import read_json
from emulator.emulation.agents.agent_protocol import AgentChannel, Msg
from emulator.emulation.agents.interconnect import DomainPlan, DomainSendChannel, open_domain_channels
from emulator.emulation.agents.peer import (
    Channels,
    ConnectionPlan,
    ConnKey,
    Delivered,
    PeerError,
    RecvChannel,
    Route,
    SendChannel,
    open_channels,
)
from emulator.emulation.machine import confinement
from emulator.model import routing, topology
from emulator.model.latency import ZERO, PathLatency
from emulator.model.schedule import format as sformat
from emulator.model.schedule.buffers import RankBuffers, Staging, bytes_view, expected_sum, input_values, rank_bytes
from emulator.model.schedule.dispatch import Completed, Dispatcher, Ready, Written
from emulator.model.schedule.format import COMPUTE, COPY, RECV, RECV_REDUCE, REDUCE, SEND, Op, Schedule

__all__ = ["Agent", "AgentError", "RepetitionResult", "SendTiming", "expected_sum", "input_values", "latency_plan",
           "load_latency_plan", "main"]

#: The interpreter's thread switch interval in an agent process (see :func:`main`).
GIL_SWITCH_INTERVAL_S = 0.0002
log = logging.getLogger("emulator.emulation.agents.agent")


class AgentError(Exception):
    """Something went wrong that names this rank (mismatch, peer gone, bad data)."""


@dataclass(frozen=True)
class Failed:
    """A worker's operation failed; the repetition stops with ``error``."""

    op_id: int
    error: AgentError


#: What the workers tell the main thread.
WorkerEvent = Written | Completed | Failed


@dataclass(frozen=True)
class SendTiming:
    """One send's rendezvous: when its receive was posted (virtual), when the clear to send came, when
    ``sendall`` began, and how late that was against the latency deadline (monotonic seconds)."""

    posted: float
    cleared: float
    sent: float
    late_s: float

    def to_json(self) -> list[float]:
        return [self.posted, self.cleared, self.sent, self.late_s]


@dataclass(frozen=True)
class RepetitionResult:
    """What :meth:`Agent.run_once` found: every operation's times, the data check, every send's rendezvous,
    when every receive's last byte reached the host (``arrivals``, the kernel's stamp, monotonic), and the CPU
    seconds this agent process spent on the repetition (``cpu_s``, all its threads, user and system)."""

    ops: dict[int, Completed]
    wrong: str | None  # None: the buffers hold the collective's result
    sends: dict[int, SendTiming]
    arrivals: dict[int, float] = field(default_factory=dict)
    cpu_s: float | None = None

    @property
    def correct(self) -> bool:
        return self.wrong is None

    def to_json(self) -> dict[str, Any]:
        """The ``done`` message's fields (``ops``: ``[id, start, end]`` lists; ``sends`` and ``arrivals``: by op
        id as text)."""
        return {"ops": [[i, c.start, c.end] for i, c in sorted(self.ops.items())], "correct": self.correct,
                "wrong": self.wrong, "sends": {str(i): v.to_json() for i, v in sorted(self.sends.items())},
                "arrivals": {str(i): t for i, t in sorted(self.arrivals.items())}, "cpu_s": self.cpu_s}


@dataclass
class _Repetition:
    """One repetition's moving parts, shared by the main thread and the workers."""

    rep: int
    dispatcher: Dispatcher
    sends: dict[ConnKey, queue.Queue[Ready | None]]  # per connection: the sends queued for its worker
    receives: dict[ConnKey, queue.Queue[Ready | None]]
    computes: queue.Queue[Ready | None]
    watched: set[int]
    on_step: Callable[[int], None] | None
    events: queue.Queue[WorkerEvent] = field(default_factory=queue.Queue)
    timings: dict[int, Completed] = field(default_factory=dict)
    send_timings: dict[int, SendTiming] = field(default_factory=dict)
    arrivals: dict[int, float] = field(default_factory=dict)  # receive op id -> its last byte reached the host

    def entered(self, step: int) -> None:
        """An operation of ``step`` is released: the first time for a watched step, say so."""
        if step in self.watched and self.on_step is not None:
            self.watched.discard(step)
            self.on_step(step)

    def stop(self) -> None:
        """Every worker: no more operations."""
        for q in [*self.sends.values(), *self.receives.values(), self.computes]:
            q.put(None)


class _Sender:
    """One repetition's messages to one peer, in order; each starts on its clear to send, at the fabric's latency.

    A transfer starts (virtual time ``t_v``) once the send is queued and
    the clear to send could have crossed the emulated fabric (posted +
    ``rendezvous_target_s``); ``sendall`` follows ``sleep_s`` later, so
    that the first byte arrives the profile's message latency after
    ``t_v`` (:mod:`emulator.model.latency`). A message whose deadline passes
    while the previous one is still being written follows it at once: its
    bytes queue behind the previous ones in the stream, as on a real NIC.
    Deliveries are watched while this worker waits or sleeps.

    ``sendall`` returns once the data is in the kernel's send buffer; a send
    counted complete then would let a dependent send to *another* peer
    share the uplink with this one's tail. So a send that other sends wait
    for (an *awaited* one) completes when the peer has acknowledged its last
    byte, as the schedule checker assumes; receives and local work that wait
    for it go as soon as it is written (the kernel holds a copy, the buffer
    is free, and a receive posted then lets its sender start one return trip
    earlier). The next message to the same peer does not wait for that (it
    follows in the same TCP stream, so they cannot share a link).
    (Blocking the channel until the ACK came back put the return path's
    queueing delay into every ring step.)
    """

    def __init__(self, channel: SendEnd, latency: PathLatency, buffers: RankBuffers, run: _Repetition):
        self.channel = channel
        self.latency = latency
        self.buffers = buffers
        self.run = run
        self.written_at = float("-inf")  # when the previous message's sendall returned (on the interconnect: drained)

    def __call__(self) -> None:
        """The worker thread: every queued send, until told to stop; a failure is reported as :class:`Failed`."""
        op: Op | None = None
        try:
            while (ready := self.channel.next(self.run.sends[self.channel.key], self._delivered)) is not None:
                op = ready.op
                self._send(ready)
        except BaseException as exc:
            failed = self.channel.delivery.oldest or op
            if failed is not None:
                error = AgentError(f"send {failed.describe()} to {self.channel.key.describe()}: "
                                   f"{describe_exception(exc)}")
                error.__cause__ = exc  # an allocation refused stays recognisable (confinement.is_out_of_memory)
                self.run.events.put(Failed(failed.id, error))

    def _delivered(self, delivered: Delivered) -> None:
        self.run.events.put(Completed(delivered.op.id, delivered.start, delivered.at))

    def _send(self, ready: Ready) -> None:
        op, lat, rep = ready.op, self.latency, self.run.rep
        payload = bytes_view(self.buffers.target(op))
        if len(payload) != op.bytes:
            raise AgentError(f"op {op.id}: buffer holds {len(payload)} bytes, op says {op.bytes}")
        clear = self.channel.clear_to_send(self._delivered)
        cleared = time.monotonic()
        if (clear.rep, clear.step) != (rep, op.step):
            raise AgentError(f"expected clear to send for repetition {rep} step {op.step}, "
                             f"got repetition {clear.rep} step {clear.step}")
        t_v = max(ready.at, clear.posted_at + lat.rendezvous_target_s)
        deadline = t_v + lat.sleep_s + lat.unshaped_s(op.bytes)
        self.channel.sleep_until(deadline, self._delivered)
        sent = time.monotonic()
        if isinstance(self.channel, DomainSendChannel):  # timed by the interconnect's arbiter: done when through
            drained = self.channel.transfer(rep, op.step, payload, sent)
            # late: beyond the deadline, and beyond the previous message's drain, which this worker waited out
            late = max(0.0, sent - max(deadline, self.written_at))
            self.written_at = drained
            self.run.send_timings[op.id] = SendTiming(clear.posted_at, cleared, sent, late)
            self.run.events.put(Completed(op.id, t_v, drained))
            return
        self.channel.send(rep, op.step, payload)
        # late: beyond the deadline, and beyond the previous message's sendall, which it follows anyway
        late = max(0.0, sent - max(deadline, self.written_at))
        self.written_at = time.monotonic()
        self.run.send_timings[op.id] = SendTiming(clear.posted_at, cleared, sent, late)
        if op.id in self.run.dispatcher.awaited:
            self.run.events.put(Written(op.id, self.written_at))
            self.channel.delivery.watch(op, t_v)
        else:
            self.run.events.put(Completed(op.id, t_v, self.written_at))


#: A send connection: over the fabric (TCP) or over the server's interconnect (timed).
SendEnd = SendChannel | DomainSendChannel


class Agent:
    """Executes one rank's program; see the module docstring."""

    def __init__(self, schedule: Schedule, topo: topology.Topology, rank: int,
                 ip_of: dict[str, str] | None = None, latency: dict[int, PathLatency] | None = None,
                 compute_dilation: float = 1.0, domain_dir: str | None = None):
        """``ip_of`` maps host names to addresses (default: the topology's plan; tests use loopback);
        ``latency`` the latency terms of the path to each rank this one sends to (default: none);
        ``compute_dilation`` what a compute operation's seconds are multiplied by (the fabric's dilation);
        ``domain_dir`` where the server's interconnect sockets are (:mod:`emulator.emulation.agents.interconnect`;
        needed
        when the topology has one and this rank talks to another of its server)."""
        self.schedule = schedule
        self.ip_of = ip_of or {h.name: h.ip for h in topo.hosts}
        self.topo = topo
        self.rank = rank
        self.program = schedule.ranks[rank]
        self.buffers = RankBuffers(schedule, rank)
        self.compute_dilation = compute_dilation
        self.computes = any(op.kind == COMPUTE for op in self.program.ops)
        self.send_keys = sorted({ConnKey(op.partner, op.lane) for op in self.program.ops if op.kind == SEND})
        self.recv_keys = sorted({ConnKey(op.partner, op.lane) for op in self.program.ops
                                 if op.kind in (RECV, RECV_REDUCE)})
        self.send_peers = sorted({key.peer for key in self.send_keys})
        self.recv_peers = sorted({key.peer for key in self.recv_keys})
        me = self.program.host
        self.domain_keys = {key for key in [*self.send_keys, *self.recv_keys]
                            if topo.over_domain(me, schedule.ranks[key.peer].host)}
        if self.domain_keys and domain_dir is None:
            raise AgentError(f"rank {rank} talks to {min(self.domain_keys).describe()} over its server's "
                             "interconnect, but has no --domain directory")
        self.domain_dir = domain_dir
        self.latency = {peer: (latency or {}).get(peer, ZERO) for peer in self.send_peers}
        self.link_bps = topo.host_bw * 1e6
        largest = max((op.bytes for op in self.program.ops if op.is_comm), default=0)
        # Room for a whole message before the receiver has posted its receive (see peer.open_channels).
        self.rcvbuf = min(max(2 * largest + (1 << 16), 1 << 20), 32 << 20)
        self.channels: Channels[SendEnd] = Channels({}, {})  # none until connect

    # ------------------------------------------------------------ connections
    def host_of(self, rank: int) -> topology.Host:
        return self.topo.host(self.schedule.ranks[rank].host)

    def ip(self, rank: int) -> str:
        return self.ip_of[self.schedule.ranks[rank].host]

    def connection_plan(self) -> ConnectionPlan:
        """This rank's data connections: each send peer along the 5-tuple :func:`routing.agent_flow` predicts."""
        me = self.host_of(self.rank)
        routes = []
        for key in self.send_keys:
            if key in self.domain_keys:
                continue
            dst = self.host_of(key.peer)
            try:
                flow = routing.agent_flow(self.topo, me.name, dst.name, key.lane)
            except ValueError as exc:
                raise AgentError(f"connection to {key.describe()}: {exc}") from None
            routes.append(Route(key, self.ip(key.peer), flow.sport, flow.dport,
                                f"{key.describe()} ({dst.name} {self.ip(key.peer)})"))
        receive = tuple(key for key in self.recv_keys if key not in self.domain_keys)
        return ConnectionPlan(self.rank, self.ip(self.rank), routing.AGENT_LISTEN_PORT, receive,
                              tuple(routes), self.rcvbuf, self.link_bps)

    def domain_plan(self) -> DomainPlan:
        """This rank's connections over its server's interconnect."""
        assert self.domain_dir is not None
        return DomainPlan(self.rank, self.domain_dir, self.host_of(self.rank).index,
                          tuple(key for key in self.recv_keys if key in self.domain_keys),
                          tuple((key, self.host_of(key.peer).index) for key in self.send_keys
                                if key in self.domain_keys))

    def connect(self, timeout_s: float = 30.0) -> None:
        """Open every data connection: listen for our receive peers, connect to our send peers (over the
        fabric, and over the server's interconnect where the topology has one)."""
        try:
            fabric = open_channels(self.connection_plan(), timeout_s)
            self.channels = Channels[SendEnd]({**fabric.send}, dict(fabric.receive))
            if self.domain_keys:
                timed = open_domain_channels(self.domain_plan(), timeout_s)
                self.channels.send.update(timed.send)
                self.channels.receive.update(timed.receive)
        except PeerError as exc:
            raise AgentError(str(exc)) from None

    def close(self) -> None:
        self.channels.close()

    # -------------------------------------------------------------- execution
    def prepare(self) -> None:
        """Reset the buffers to this rank's input, before the barrier: after ``go`` every rank starts at once."""
        self.buffers.reset()

    def run_once(self, rep: int, start_at: float | None = None, watch_steps: Iterable[int] = (),
                 on_step: Callable[[int], None] | None = None) -> RepetitionResult:
        """One repetition (after :meth:`connect` and :meth:`prepare`): every operation's times and the data check.

        ``start_at`` is a time on the monotonic clock, which every emulated
        host shares: all ranks set up their workers, then release their first
        operations at that same instant (released on receipt of the control
        message instead, ranks would start as far apart as the control
        messages arrive, and halving-doubling rounds carry such lateness
        forward). ``on_step(step)`` is called the first time an operation of
        one of ``watch_steps`` is released (the replay fires step-triggered
        faults on it).

        Which operations run when is the :class:`Dispatcher`'s; it hands each
        one over with the virtual time it became ready, which the send
        workers schedule from (:class:`_Sender`). Timings: a send runs from
        its transfer's start to its completion, a receive from being posted
        to its last byte, a local operation as it ran.
        """
        run = _Repetition(rep, Dispatcher(self.program),
                          {key: queue.Queue() for key in self.send_keys},
                          {key: queue.Queue() for key in self.recv_keys}, queue.Queue(), set(watch_steps), on_step)
        cpu_before = time.process_time()
        self._start_workers(self.channels, run)
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.monotonic()))
        try:
            self._hand(run, run.dispatcher.start(time.monotonic() if start_at is None else start_at))
            while run.dispatcher.pending:
                event = run.events.get()
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Completed):
                    run.timings[event.op_id] = event
                # a written awaited send releases the receives and local work that may use its buffer
                self._hand(run, run.dispatcher.apply(event))
        finally:
            run.stop()
        cpu_s = time.process_time() - cpu_before  # before the data check: the repetition's own work
        return RepetitionResult(run.timings, self.buffers.wrong(), run.send_timings, run.arrivals, cpu_s)

    def _start_workers(self, channels: Channels[SendEnd], run: _Repetition) -> None:
        workers = [threading.Thread(target=_Sender(channels.send[key], self.latency[key.peer], self.buffers, run),
                                    daemon=True) for key in self.send_keys]
        workers += [threading.Thread(target=self._receive_worker, args=(channels.receive[key], run), daemon=True)
                    for key in self.recv_keys]
        if self.computes:
            workers.append(threading.Thread(target=self._compute_worker, args=(run,), daemon=True))
        for w in workers:
            w.start()

    def _hand(self, run: _Repetition, ready: list[Ready]) -> None:
        """Run the local operations the dispatcher released, and queue its sends and receives on their workers.

        In order: a peer's receives are posted as the dispatcher queued them.
        Local work costs the modelled fabric nothing, so what it releases is
        ready when it was.
        """
        todo = deque(ready)
        while todo:
            r = todo.popleft()
            op = r.op
            run.entered(op.step)
            if op.kind == COMPUTE:
                run.computes.put(r)
            elif op.kind in (REDUCE, COPY):
                t0 = time.monotonic()
                self.buffers.run_local(op)
                run.timings[op.id] = Completed(op.id, t0, time.monotonic())
                todo.extend(run.dispatcher.done(op.id, r.at))
            elif op.kind == SEND:
                run.sends[ConnKey(op.partner, op.lane)].put(r)
            else:
                self._post_receive(op, run.rep, r.at)
                run.receives[ConnKey(op.partner, op.lane)].put(r)

    def _post_receive(self, op: Op, rep: int, at: float) -> None:
        """Tell ``op``'s sender that this receive is posted (its clear to send), as of ``at``."""
        try:
            self.channels.receive[ConnKey(op.partner, op.lane)].post(rep, op.step, at)
        except OSError as exc:
            raise AgentError(f"{op.describe()}: clear to send to rank {op.partner}: {exc}") from None

    def _compute_worker(self, run: _Repetition) -> None:
        """The compute stream: each compute operation in the order released, ``seconds × dilation`` long.

        An operation starts at its virtual ready time or when the previous one
        ended, whichever is later (one accelerator runs one kernel at a time),
        and its completion carries that virtual end, so the agent's own lateness
        does not lengthen the modelled compute.
        """
        free_at = float("-inf")
        while (ready := run.computes.get()) is not None:
            op = ready.op
            start = max(ready.at, free_at)
            end = start + op.seconds * self.compute_dilation
            time.sleep(max(0.0, end - time.monotonic()))
            free_at = end
            run.events.put(Completed(op.id, start, end))

    def _receive_worker(self, channel: RecvChannel, run: _Repetition) -> None:
        """The worker thread of one receive connection: its messages in order, each reported as it completes
        (a timed one as of when its bytes were through, as its send: :mod:`emulator.emulation.agents.interconnect`)."""
        staging = Staging()
        while (ready := run.receives[channel.key].get()) is not None:
            op = ready.op  # a receive's time runs from its posting
            try:
                arrived = self._receive(channel, op, run.rep, staging)
                if arrived is not None:
                    run.arrivals[op.id] = arrived
                end = arrived if channel.timed and arrived is not None else time.monotonic()
                run.events.put(Completed(op.id, ready.at, end))
            except BaseException as exc:
                error = AgentError(f"{op.describe()}: {describe_exception(exc)}")
                error.__cause__ = exc
                run.events.put(Failed(op.id, error))
                return

    def _receive(self, channel: RecvChannel, op: Op, rep: int, staging: Staging) -> float | None:
        """One message into its buffer (added, for a receive-reduce); when its last byte reached the host."""
        header = channel.header()
        if (header.rep, header.step, header.nbytes) != (rep, op.step, op.bytes):
            raise AgentError(f"expected repetition {rep} step {op.step} with {op.bytes} bytes, "
                             f"got repetition {header.rep} step {header.step} with {header.nbytes} bytes")
        target = self.buffers.target(op)
        if op.kind == RECV:
            return channel.payload_into(bytes_view(target))
        received = staging.take(target.size)
        arrived = channel.payload_into(bytes_view(received))
        self.buffers.add(target, received)
        return arrived


# ---------------------------------------------------------------- process main
def latency_plan(paths: dict[tuple[int, int], PathLatency], compute_dilation: float = 1.0) -> dict[str, Any]:
    """The latency plan file's contents: per sending rank, per receiving rank, the path's latency terms; and
    the time dilation compute operations run at."""
    plan: dict[str, dict[str, Any]] = {}
    for (src, dst), path in sorted(paths.items()):
        plan.setdefault(str(src), {})[str(dst)] = path.to_json()
    return {"version": 1, "ranks": plan, "compute_dilation": compute_dilation}


@dataclass(frozen=True)
class TimingPlan:
    """This rank's part of a latency plan: each send path's latency terms, and the compute dilation."""

    latency: dict[int, PathLatency]
    compute_dilation: float = 1.0


def load_latency_plan(path: str | None, rank: int) -> TimingPlan:
    """This rank's entries of a plan written from :func:`latency_plan` (none without a file)."""
    if path is None:
        return TimingPlan({})
    data = read_json(path)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise AgentError(f"latency plan {path}: not a version 1 plan")
    latency = {int(dst): PathLatency.from_json(v) for dst, v in data["ranks"].get(str(rank), {}).items()}
    return TimingPlan(latency, float(data.get("compute_dilation", 1.0)))


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="emulator.emulation.agents.agent")
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--latency", default=None, help="latency plan (JSON, see load_latency_plan)")
    parser.add_argument("--domain", default=None, help="the folder of the servers' interconnect sockets "
                        "(emulator.emulation.agents.interconnect)")
    return parser.parse_args(argv)


def _serve(control: AgentChannel, agent: Agent) -> None:
    """Connect, report ``ready``, then one repetition per ``go`` until ``quit``."""
    rank = agent.rank
    log.info("connecting: sends to %s, receives from %s", agent.send_peers, agent.recv_peers)
    agent.connect()
    agent.prepare()
    control.send(Msg.READY, rank=rank)
    log.info("ready")
    while True:
        msg = control.receive()
        if msg["type"] == Msg.QUIT:
            return
        if msg["type"] == Msg.GO:
            rep = int(msg["rep"])
            result = agent.run_once(rep, msg.get("start_at"), msg.get("watch_steps", ()),
                                    lambda step: control.send(Msg.STEP, rank=rank, step=step))
            log.info("repetition %d done, correct=%s", rep, result.correct)
            if not result.correct:
                log.error("wrong result: %s", result.wrong)
            agent.prepare()
            control.send(Msg.DONE, rank=rank, rep=rep, **result.to_json())


def main(argv: list[str] | None = None) -> int:
    """The agent process (see the module docstring): 0 after ``quit``, 1 after reporting an ``error``,
    :data:`emulator.emulation.machine.confinement.OUT_OF_MEMORY_STATUS` after running out of its memory limit (one
    line in its log
    and its stderr, and an ``error`` with ``out_of_memory``)."""
    args = _arguments(argv)
    # A worker woken by its socket waits for the GIL up to the switch interval
    # (5 ms by default) while another thread computes, and every message
    # passes two such hand-offs (worker -> main -> worker): a short interval
    # keeps them from adding to every message's latency (docs/fidelity.md).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    logging.basicConfig(filename=args.log, level=logging.INFO,
                        format=f"%(asctime)s rank {args.rank} %(levelname)s %(message)s")
    log.info("memory limit %s (RLIMIT_DATA)", confinement.describe_limit(confinement.data_limit()))
    control = AgentChannel(args.control)
    control.send(Msg.HELLO, rank=args.rank)
    agent = None
    try:
        schedule = sformat.load(args.schedule)  # this rank's view, of a schedule the replay validated whole
        topo = topology.load(args.topology)
        timing = load_latency_plan(args.latency, args.rank)
        agent = Agent(schedule, topo, args.rank, latency=timing.latency, compute_dilation=timing.compute_dilation,
                      domain_dir=args.domain)
        _serve(control, agent)
        return 0
    except BaseException as exc:
        if confinement.is_out_of_memory(exc):
            return _out_of_memory(control, args.rank, args.schedule, exc)
        log.error("failed: %s\n%s", exc, traceback.format_exc())
        try:
            control.send(Msg.ERROR, rank=args.rank, message=str(exc))
        except OSError:
            pass
        return 1
    finally:
        if agent is not None:
            agent.close()


def _out_of_memory(control: AgentChannel, rank: int, schedule_path: str, exc: BaseException) -> int:
    """One line in the log and on stderr, an ``error`` that says so, and :data:`confinement.OUT_OF_MEMORY_STATUS`."""
    exc.__traceback__ = None  # let the frames (and the buffers they hold) go
    try:
        buffers: int | None = rank_bytes(sformat.load(schedule_path), rank)
    except Exception:
        buffers = None
    limit = confinement.data_limit()
    line = confinement.agent_out_of_memory_line(rank, limit, buffers)
    with contextlib.suppress(Exception):  # still short of memory, or the session is gone: the status says it
        log.error("%s: %s", line, describe_exception(exc))
        print(line, file=sys.stderr, flush=True)
        control.send(Msg.ERROR, rank=rank, message=line, out_of_memory=True, memory_limit=limit)
    return confinement.OUT_OF_MEMORY_STATUS


def describe_exception(exc: BaseException) -> str:
    """``MemoryError: Unable to allocate ...`` (the exception's type even when its text is empty)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
