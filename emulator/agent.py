"""The host agent: one process per rank, inside its Mininet host, replaying a schedule over real TCP.

Started by :mod:`emulator.replay` as ``python -m emulator.agent --schedule F
--topology T --rank R --control SOCK --log FILE --latency PLAN``. It:

1. listens on its host's IP, port :data:`routing.AGENT_LISTEN_PORT`, and opens
   one TCP connection to every rank it sends to, from source port
   ``AGENT_SOURCE_PORT_BASE + J`` for destination host ``hJ`` -- the 5-tuple
   :func:`emulator.routing.agent_flow` predicts, so the controller's path and
   the checker's prediction are the path the bytes take;
2. reports ``ready`` on the control socket (a Unix socket: it crosses network
   namespaces) and waits for ``go`` -- the barrier, so every connection is
   established before the clock starts;
3. per repetition: fills its buffer with float32 values that identify the rank,
   runs its operations honouring their dependencies (sends and receives to
   different peers run concurrently; to the same peer in program order, so TCP
   stream order matches the schedule), really adds received data for
   ``recv_reduce``/``reduce``, records every operation's start and end on
   ``CLOCK_MONOTONIC`` (shared by all namespaces), checks that the final buffer
   is the sum of all ranks' inputs, and reports ``done`` with its timings.

Control messages are JSON lines: agent -> ``hello``, ``ready``, ``done``,
``error``; orchestrator -> ``go`` (with ``rep``), ``quit``. Every data message
is a header (repetition, step, bytes) followed by the payload, so a mismatch
between sender and receiver is caught and named instead of corrupting data.

Messages follow a rendezvous protocol, as large messages do in MPI and as
NCCL's InfiniBand transport does (the receiver posts a buffer, the sender
writes into it): a receiver posts a receive once its dependencies are done
and the earlier receives from that peer are posted, sends a *clear to send*
(repetition, step, and when it was posted) back on the same connection, and
the sender starts the message only on receiving it. Receives that depend on nothing (a ring's) are
all posted at once, so a pipeline never waits on a clear to send. This is the
schedule checker's execution model too (a send and its receive complete
together once both are ready). Without it, a rank that ran late let its partners' *next* messages
reach it while it still received the current one: two flows met at one switch
port in a contention-free schedule, the late transfer slowed further, and in
halving-doubling's lockstep rounds the lateness fed itself (measured: one
16 MiB HDRM repetition in three collapsed from 0.9 to 0.7 of the link).

The latency plan (:func:`latency_plan`, written by the replay) gives every
path this rank sends on its fabric profile's latency terms
(:class:`emulator.latency.PathLatency`): the send worker holds each message
back until the profile's rendezvous and message latency have passed, counted
in virtual time from when the operations became ready
(:mod:`emulator.schedule.dispatch`), less what this machine adds by itself.
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import queue
import select
import socket
import struct
import sys
import termios
import threading
import time
import traceback
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from emulator import routing, topology
from emulator.control import AgentChannel, Msg
from emulator.files import read_json
from emulator.latency import ZERO, PathLatency
from emulator.schedule import format as sformat
from emulator.schedule.dispatch import Dispatcher, Ready
from emulator.schedule.format import COPY, RECV, RECV_REDUCE, REDUCE, SEND, Op, Schedule

HEADER = struct.Struct("!IIQ")  # repetition, step, payload bytes
HELLO = struct.Struct("!I")  # sender rank, first thing on a data connection
#: receiver -> sender, "this receive is posted": repetition, step, and when it was posted (CLOCK_MONOTONIC,
#: virtual: the time its dependencies were done, see emulator.schedule.dispatch)
CLEAR_TO_SEND = struct.Struct("!IId")
GIL_SWITCH_INTERVAL_S = 0.0002
#: Below this many unacknowledged full frames (of the connection's MSS) delivery is polled every frame time / 4,
#: at least every DELIVERY_TAIL_POLL_S: they may already be past the bottleneck, their ACK due any moment.
DELIVERY_TAIL_FRAMES = 4
DELIVERY_TAIL_POLL_S = 0.001
log = logging.getLogger("emulator.agent")


class AgentError(Exception):
    """Something went wrong that names this rank (mismatch, peer gone, bad data)."""


def input_values(rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s input: small integers (exact in float32 when summed) that differ per rank and element."""
    i = np.arange(n, dtype=np.int64)
    return (((rank * 131 + i * 7) % 61) + 1).astype(np.float32)


def expected_sum(p: int, n: int) -> np.ndarray:
    """The allreduce result of :func:`input_values` over ranks 0..p-1, computed without p passes."""
    table = np.array([sum(((r * 131 + c) % 61) + 1 for r in range(p)) for c in range(61)], dtype=np.float32)
    i = np.arange(n, dtype=np.int64)
    return table[(i * 7) % 61]


def _bytes_view(array: np.ndarray) -> memoryview:
    """A writable byte view of a contiguous numpy array (no copy)."""
    return memoryview(array.data).cast("B")


def _recv_exact(sock: socket.socket, view: memoryview, quickack: bool = False,
                readable: Callable[[], bool] | None = None) -> None:
    """Fill ``view`` from ``sock``; ``readable()``, when given, is asked before every read (False: ask again)."""
    got = 0
    total = len(view)
    while got < total:
        if readable is not None and not readable():
            continue
        if quickack:  # the kernel leaves quick-ACK mode on its own; ask again before every read
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise AgentError("connection closed by peer")
        got += n


class Agent:
    """Executes one rank's program; see the module docstring."""

    def __init__(self, schedule: Schedule, topo: topology.Topology, rank: int,
                 ip_of: dict[str, str] | None = None, latency: dict[int, PathLatency] | None = None):
        """``ip_of`` maps host names to addresses (default: the topology's plan; tests use loopback);
        ``latency`` the latency terms of the path to each rank this one sends to (default: none)."""
        self.schedule = schedule
        self.ip_of = ip_of or {h.name: h.ip for h in topo.hosts}
        self.topo = topo
        self.rank = rank
        self.program = schedule.ranks[rank]
        self.elems_per_chunk = schedule.chunk_bytes // 4
        self.buffers = {
            "data": np.zeros(schedule.chunks * self.elems_per_chunk, dtype=np.float32),
            "scratch": np.zeros(max(schedule.scratch_chunks, 1) * self.elems_per_chunk, dtype=np.float32),
        }
        self.send_peers = sorted({op.partner for op in self.program.ops if op.kind == SEND})
        self.latency = {peer: (latency or {}).get(peer, ZERO) for peer in self.send_peers}
        self.recv_peers = sorted({op.partner for op in self.program.ops if op.kind in (RECV, RECV_REDUCE)})
        self.out_socks: dict[int, socket.socket] = {}
        self.written: dict[int, int] = {}  # bytes written on each out_sock, for delivery tracking
        self.in_socks: dict[int, socket.socket] = {}
        self.expected = expected_sum(schedule.p, len(self.buffers["data"]))
        self.inputs = input_values(rank, len(self.buffers["data"]))
        self.link_bps = topo.host_bw * 1e6
        self._mss: dict[int, int] = {}  # per receiving peer: the connection's TCP MSS
        # Additions into one chunk may be unordered (the schedule allows it);
        # numpy releases the GIL while adding, so they take turns here.
        self.reduce_lock = threading.Lock()
        # Sends another send waits for complete on delivery (see _send_worker);
        # receives and local work wait only until the data is written.
        self.awaited_sends = Dispatcher(self.program).awaited
        largest = max((op.bytes for op in self.program.ops if op.is_comm), default=0)
        self.rcvbuf = min(max(2 * largest + (1 << 16), 1 << 20), 32 << 20)

    # ------------------------------------------------------------ connections
    def host_of(self, rank: int) -> topology.Host:
        return self.topo.host(self.schedule.ranks[rank].host)

    def ip(self, rank: int) -> str:
        return self.ip_of[self.schedule.ranks[rank].host]

    def connect(self, timeout_s: float = 30.0) -> None:
        """Open every data connection: listen for our receive peers, connect to our send peers."""
        me = self.host_of(self.rank)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Room for a whole message before the receiver has posted its receive,
        # so a late receiver does not throttle its sender (set before listen:
        # accepted sockets inherit it, and the window scale follows it).
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        listener.bind((self.ip(self.rank), routing.AGENT_LISTEN_PORT))
        listener.listen(max(len(self.recv_peers), 1))
        listener.settimeout(timeout_s)
        accept_error: list[BaseException] = []

        def accept_all() -> None:
            try:
                while len(self.in_socks) < len(self.recv_peers):
                    conn, _ = listener.accept()
                    conn.settimeout(None)
                    buf = bytearray(HELLO.size)
                    _recv_exact(conn, memoryview(buf))
                    (peer,) = HELLO.unpack(buf)
                    if peer not in self.recv_peers or peer in self.in_socks:
                        raise AgentError(f"unexpected connection from rank {peer}")
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    self.in_socks[peer] = conn
            except BaseException as exc:  # reported by the caller
                accept_error.append(exc)

        acceptor = threading.Thread(target=accept_all, daemon=True)
        acceptor.start()
        deadline = time.monotonic() + timeout_s
        for peer in self.send_peers:
            dst = self.host_of(peer)
            flow = routing.agent_flow(self.topo, me.name, dst.name)
            while True:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.bind((self.ip(self.rank), flow.sport))
                sock.settimeout(max(deadline - time.monotonic(), 0.1))
                try:
                    sock.connect((self.ip(peer), flow.dport))
                    break
                except (ConnectionRefusedError, TimeoutError, OSError) as exc:
                    sock.close()
                    if time.monotonic() > deadline:
                        raise AgentError(f"cannot connect to rank {peer} ({dst.name} {self.ip(peer)}): {exc}") from None
                    time.sleep(0.05)
            sock.settimeout(None)
            sock.sendall(HELLO.pack(self.rank))
            self.out_socks[peer] = sock
            self.written[peer] = HELLO.size
        acceptor.join(max(deadline - time.monotonic(), 0.1))
        listener.close()
        if accept_error:
            raise AgentError(f"accepting connections: {accept_error[0]}")
        missing = sorted(set(self.recv_peers) - set(self.in_socks))
        if missing:
            raise AgentError(f"ranks {missing} never connected")

    def close(self) -> None:
        for sock in [*self.out_socks.values(), *self.in_socks.values()]:
            try:
                sock.close()
            except OSError:
                pass

    # -------------------------------------------------------------- execution
    def _view(self, buffer: str, chunk: int, nchunks: int) -> np.ndarray:
        e = self.elems_per_chunk
        return self.buffers[buffer][chunk * e:(chunk + nchunks) * e]

    def prepare(self) -> None:
        """Reset the buffers to this rank's input, before the barrier: after ``go`` every rank starts at once."""
        np.copyto(self.buffers["data"], self.inputs)
        self.buffers["scratch"][:] = 0

    def run_once(self, rep: int, start_at: float | None = None, watch_steps: Iterable[int] = (),
                 on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
        """One repetition (after :meth:`prepare`): returns per-op timings and whether the result is right.

        ``start_at`` is a time on the monotonic clock, which every emulated
        host shares: all ranks set up their workers, then release their first
        operations at that same instant. (Released on receipt of the control
        message instead, ranks started up to 20 ms apart on 2 cores, and
        halving-doubling rounds carry such lateness forward.)
        ``on_step(step)`` is called the first time an operation of one of
        ``watch_steps`` is released (the replay fires step-triggered faults
        on it).

        Which operations run when is :class:`~emulator.schedule.dispatch.Dispatcher`'s;
        it hands each one over with the virtual time it became ready, which
        the send workers schedule from (see :meth:`_send_worker`). Timings:
        a send runs from its transfer's start to its completion, a receive
        from being posted to its last byte, a local operation as it ran.
        ``sends`` holds, per send, when its receive was posted, when the
        clear to send came, when ``sendall`` began and how late that was.
        """
        watched = set(watch_steps)
        dispatcher = Dispatcher(self.program)
        # (op id, start, end, error, final): final is False for "an awaited send is written"
        events: queue.Queue[tuple[int, float, float, BaseException | None, bool]] = queue.Queue()
        send_q: dict[int, queue.Queue[tuple[Op, float] | None]] = defaultdict(queue.Queue)
        recv_q: dict[int, queue.Queue[tuple[Op, float] | None]] = defaultdict(queue.Queue)
        self.send_info: dict[int, list[float]] = {}
        workers = [threading.Thread(target=self._send_worker, args=(peer, rep, send_q[peer], events), daemon=True)
                   for peer in self.send_peers]
        workers += [threading.Thread(target=self._recv_worker, args=(peer, rep, recv_q[peer], events), daemon=True)
                    for peer in self.recv_peers]
        for w in workers:
            w.start()
        timings: dict[int, tuple[float, float]] = {}

        def hand(ready: list[Ready]) -> None:
            todo = deque(ready)  # in order: a peer's receives are posted as the dispatcher queued them
            while todo:
                r = todo.popleft()
                op = r.op
                if op.step in watched and on_step is not None:
                    watched.discard(op.step)
                    on_step(op.step)
                if op.kind in (REDUCE, COPY):
                    t0 = time.monotonic()
                    self._local(op)
                    timings[op.id] = (t0, time.monotonic())
                    todo.extend(dispatcher.done(op.id, r.at))  # local work costs the modelled fabric nothing
                elif op.kind == SEND:
                    send_q[op.partner].put((op, r.at))
                else:
                    self._post_receive(op, rep, r.at)
                    recv_q[op.partner].put((op, r.at))

        if start_at is not None:
            time.sleep(max(0.0, start_at - time.monotonic()))
        try:
            hand(dispatcher.start(time.monotonic() if start_at is None else start_at))
            while dispatcher.pending:
                op_id, t0, t1, error, final = events.get()
                if error is not None:
                    raise error
                if not final:  # an awaited send is written: receives and local work may use its buffer
                    hand(dispatcher.written(op_id, t1))
                    continue
                timings[op_id] = (t0, t1)
                hand(dispatcher.done(op_id, t1))
        finally:
            for q in [*send_q.values(), *recv_q.values()]:
                q.put(None)
        correct = bool(np.array_equal(self.buffers["data"], self.expected))
        wrong = None
        if not correct:
            bad = np.flatnonzero(self.buffers["data"] != self.expected)
            first = int(bad[0])
            wrong = (f"{len(bad)} of {len(self.expected)} elements wrong; element {first} "
                     f"(chunk {first // self.elems_per_chunk}) is {self.buffers['data'][first]:g}, "
                     f"expected {self.expected[first]:g}")
        return {"ops": [[i, t[0], t[1]] for i, t in sorted(timings.items())], "correct": correct, "wrong": wrong,
                "sends": {str(i): v for i, v in sorted(self.send_info.items())}}

    def _local(self, op: Op) -> None:
        target = self._view(op.buffer, op.chunk, op.nchunks)
        source = self._view(op.src or "data", op.src_chunk or 0, op.nchunks)
        with self.reduce_lock:
            if op.kind == REDUCE:
                np.add(target, source, out=target)
            else:
                target[:] = source

    def _post_receive(self, op: Op, rep: int, at: float) -> None:
        """Tell ``op``'s sender that this receive is posted (its clear to send), as of ``at``."""
        try:
            self.in_socks[op.partner].sendall(CLEAR_TO_SEND.pack(rep, op.step, at))
        except OSError as exc:
            raise AgentError(f"{op.describe()}: clear to send to rank {op.partner}: {exc}") from None

    def _send_worker(self, peer: int, rep: int, ops: queue.Queue, events: queue.Queue) -> None:
        """Send ``peer``'s messages in order; each starts on its clear to send, at the fabric's latency.

        A transfer starts (virtual time ``t_v``) once the send is queued and
        the clear to send could have crossed the emulated fabric (posted +
        ``rendezvous_target_s``); ``sendall`` follows ``sleep_s`` later, so
        that the first byte arrives the profile's message latency after
        ``t_v`` (:mod:`emulator.latency`). A message whose deadline passes
        while the previous one is still being written follows it at once: its
        bytes queue behind the previous ones in the stream, as on a real NIC.
        Deliveries are watched while this worker waits or sleeps.

        ``sendall`` returns once the data is in the kernel's send buffer; a send
        counted complete then would let a dependent send to *another* peer
        share the uplink with this one's tail. So a send that other sends wait
        for completes when the peer has acknowledged its last byte, as the
        schedule checker assumes; receives and local work that wait for it go
        as soon as it is written (the kernel holds a copy, the buffer is free,
        and a receive posted then lets its sender start one return trip
        earlier). The next message to the same peer does not wait for that (it
        follows in the same TCP stream, so they cannot share a link).
        (Blocking the channel until the ACK came back put the return path's
        queueing delay into every ring step.)
        """
        sock = self.out_socks[peer]
        lat = self.latency[peer]
        clear = bytearray(CLEAR_TO_SEND.size)
        pending: deque[tuple[Op, float, int]] = deque()  # awaited sends not yet acknowledged: op, t0, end offset
        op: Op | None = None
        written_at = float("-inf")
        try:
            while (item := self._next_while_delivering(ops, sock, peer, pending, events)) is not None:
                op, queued_at = item
                payload = _bytes_view(self._view(op.buffer, op.chunk, op.nchunks))
                if len(payload) != op.bytes:
                    raise AgentError(f"op {op.id}: buffer holds {len(payload)} bytes, op says {op.bytes}")
                _recv_exact(sock, memoryview(clear),
                            readable=lambda: self._readable_while_delivering(sock, peer, pending, events))
                cts_at = time.monotonic()
                their_rep, step, posted_at = CLEAR_TO_SEND.unpack(clear)
                if (their_rep, step) != (rep, op.step):
                    raise AgentError(f"expected clear to send for repetition {rep} step {op.step}, "
                                     f"got repetition {their_rep} step {step}")
                t_v = max(queued_at, posted_at + lat.rendezvous_target_s)
                deadline = t_v + lat.sleep_s + lat.unshaped_s(op.bytes)
                self._sleep_while_delivering(deadline, sock, peer, pending, events)
                sent = time.monotonic()
                sock.sendall(HEADER.pack(rep, op.step, op.bytes))
                sock.sendall(payload)
                # late: beyond the deadline, and beyond the previous message's sendall, which it follows anyway
                late = max(0.0, sent - max(deadline, written_at))
                written_at = time.monotonic()
                self.written[peer] += HEADER.size + len(payload)
                self.send_info[op.id] = [posted_at, cts_at, sent, late]
                if op.id in self.awaited_sends:
                    events.put((op.id, t_v, written_at, None, False))
                    pending.append((op, t_v, self.written[peer]))
                else:
                    events.put((op.id, t_v, written_at, None, True))
        except BaseException as exc:
            failed = pending[0][0] if pending else op
            if failed is not None:
                events.put((failed.id, 0.0, 0.0, AgentError(f"send {failed.describe()} to rank {peer}: {exc}"), True))

    def _sleep_while_delivering(self, deadline: float, sock: socket.socket, peer: int, pending: deque,
                                events: queue.Queue) -> None:
        """Wait until ``deadline`` (monotonic), completing the pending sends the peer acknowledges meanwhile."""
        while (left := deadline - time.monotonic()) > 0:
            wait = self._report_delivered(sock, peer, pending, events)
            time.sleep(min(left, wait) if pending else left)

    def _report_delivered(self, sock: socket.socket, peer: int, pending: deque, events: queue.Queue) -> float:
        """Complete the pending sends the peer has acknowledged; return how long to wait before looking again."""
        buf = bytearray(4)
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)
        acked = self.written[peer] - int.from_bytes(buf, sys.byteorder)
        now = time.monotonic()
        while pending and pending[0][2] <= acked:
            op, t0, _ = pending.popleft()
            events.put((op.id, t0, now, None, True))
        if not pending:
            return 0.0
        # Half the time the first pending send's remainder needs at the link
        # rate beyond its last frames; once only those are unacknowledged, their
        # ACK can come any moment (they may be past the bottleneck already):
        # look every quarter frame time, or each step would end up to a frame
        # late. (A fixed 128 KiB tail polled every millisecond: 64 agents at
        # 5 Mbit/s ran 1.5x the model with 23% CPU idle; this: 1.1x, 38%.)
        mss = self._mss.get(peer) or self._mss.setdefault(peer, sock.getsockopt(socket.IPPROTO_TCP,
                                                                                socket.TCP_MAXSEG))
        left = pending[0][2] - acked
        tail = DELIVERY_TAIL_FRAMES * mss
        if left <= tail:
            return max(DELIVERY_TAIL_POLL_S, mss * 8 / self.link_bps / 4)
        return min(max((left - tail) * 8 / self.link_bps / 2, DELIVERY_TAIL_POLL_S), 0.02)

    def _next_while_delivering(self, ops: queue.Queue, sock: socket.socket, peer: int, pending: deque,
                               events: queue.Queue) -> tuple[Op, float] | None:
        while True:
            wait = self._report_delivered(sock, peer, pending, events)
            if not pending:
                return ops.get()
            try:
                return ops.get(timeout=wait)
            except queue.Empty:
                continue

    def _readable_while_delivering(self, sock: socket.socket, peer: int, pending: deque,
                                   events: queue.Queue) -> bool:
        """Whether ``sock`` can be read now; meanwhile completes the pending sends the peer acknowledged."""
        if not pending:
            return True  # nothing to watch: a blocking read is fine
        wait = self._report_delivered(sock, peer, pending, events)
        return not pending or bool(select.select([sock], [], [], wait)[0])

    def _recv_worker(self, peer: int, rep: int, ops: queue.Queue, events: queue.Queue) -> None:
        sock = self.in_socks[peer]
        header = bytearray(HEADER.size)
        scratch = np.empty(0, dtype=np.float32)
        while (item := ops.get()) is not None:
            op, t0 = item  # a receive's time runs from its posting
            try:
                _recv_exact(sock, memoryview(header))
                their_rep, step, nbytes = HEADER.unpack(header)
                if (their_rep, step, nbytes) != (rep, op.step, op.bytes):
                    raise AgentError(f"expected repetition {rep} step {op.step} with {op.bytes} bytes, "
                                     f"got repetition {their_rep} step {step} with {nbytes} bytes")
                target = self._view(op.buffer, op.chunk, op.nchunks)
                # ACK at once: the sender's send completes on the last ACK.
                if op.kind == RECV:
                    _recv_exact(sock, _bytes_view(target), quickack=True)
                else:
                    if scratch.size < target.size:
                        scratch = np.empty(target.size, dtype=np.float32)
                    tmp = scratch[:target.size]
                    _recv_exact(sock, _bytes_view(tmp), quickack=True)
                    with self.reduce_lock:  # two receives may add into the same chunk (tree children)
                        np.add(target, tmp, out=target)
                events.put((op.id, t0, time.monotonic(), None, True))
            except BaseException as exc:
                events.put((op.id, 0.0, 0.0, AgentError(f"{op.describe()}: {exc}"), True))
                return


# ---------------------------------------------------------------- process main
def latency_plan(paths: dict[tuple[int, int], PathLatency]) -> dict[str, Any]:
    """The latency plan file's contents: per sending rank, per receiving rank, the path's latency terms."""
    plan: dict[str, dict[str, Any]] = {}
    for (src, dst), path in sorted(paths.items()):
        plan.setdefault(str(src), {})[str(dst)] = path.to_json()
    return {"version": 1, "ranks": plan}


def load_latency_plan(path: str | None, rank: int) -> dict[int, PathLatency]:
    """This rank's entries of a plan written from :func:`latency_plan` (none without a file)."""
    if path is None:
        return {}
    data = read_json(path)
    if not isinstance(data, dict) or data.get("version") != 1:
        raise AgentError(f"latency plan {path}: not a version 1 plan")
    return {int(dst): PathLatency.from_json(v) for dst, v in data["ranks"].get(str(rank), {}).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="emulator.agent")
    parser.add_argument("--schedule", required=True)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--latency", default=None, help="latency plan (JSON, see load_latency_plan)")
    args = parser.parse_args(argv)
    # A worker woken by its socket waits for the GIL up to the switch interval
    # (5 ms by default) while another thread computes; every message passes
    # two such hand-offs (worker -> main -> worker). Measured at 1 MiB on 16
    # ranks: hd's measured/predicted time fell from 1.27 to 1.17.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    logging.basicConfig(filename=args.log, level=logging.INFO,
                        format=f"%(asctime)s rank {args.rank} %(levelname)s %(message)s")
    control = AgentChannel(args.control)
    control.send(Msg.HELLO, rank=args.rank)
    agent = None
    try:
        schedule = sformat.load(args.schedule)
        topo = topology.load(args.topology)
        agent = Agent(schedule, topo, args.rank, latency=load_latency_plan(args.latency, args.rank))
        log.info("connecting: sends to %s, receives from %s", agent.send_peers, agent.recv_peers)
        agent.connect()
        agent.prepare()
        control.send(Msg.READY, rank=args.rank)
        log.info("ready")
        while True:
            msg = control.receive()
            if msg["type"] == Msg.QUIT:
                break
            if msg["type"] == Msg.GO:
                rep = int(msg["rep"])
                result = agent.run_once(rep, msg.get("start_at"), msg.get("watch_steps", ()),
                                        lambda step: control.send(Msg.STEP, rank=args.rank, step=step))
                log.info("repetition %d done, correct=%s", rep, result["correct"])
                if not result["correct"]:
                    log.error("wrong result: %s", result["wrong"])
                agent.prepare()
                control.send(Msg.DONE, rank=args.rank, rep=rep, **result)
        return 0
    except BaseException as exc:
        log.error("failed: %s\n%s", exc, traceback.format_exc())
        try:
            control.send(Msg.ERROR, rank=args.rank, message=str(exc))
        except OSError:
            pass
        return 1
    finally:
        if agent is not None:
            agent.close()


if __name__ == "__main__":
    sys.exit(main())
