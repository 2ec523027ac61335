"""The data connections between host agents: set-up, framing, and delivery tracking.

One TCP connection per ordered pair of ranks and lane (a schedule's lanes
stand for an MSCCL channel or a Chakra tag, each its own connection, as NCCL
opens one per channel), opened by the sender (:func:`open_channels`). What
crosses it, in order:

1. sender -> receiver, once: :data:`HELLO` (the sender's rank and the lane),
   so the receiver knows whose connection it accepted;
2. receiver -> sender, per posted receive: :data:`CLEAR_TO_SEND`
   (repetition, step, and when the receive was posted, on the shared
   ``CLOCK_MONOTONIC``, as a virtual time: see :mod:`emulator.model.schedule.dispatch`);
3. sender -> receiver, per message: :data:`HEADER` (repetition, step,
   payload bytes), then the payload. The receiver checks the header against
   the receive it expects, so a mismatch is named instead of corrupting data.

:class:`SendChannel` is the sender's end, :class:`RecvChannel` the
receiver's. The sender's end also tracks *delivery* (:class:`DeliveryTracker`):
``sendall`` returns once the data is in the kernel's send buffer, and a send
that other sends wait for is complete only once the peer has acknowledged its
last byte. The kernel says how many bytes it still holds (``SIOCOUTQ``: unsent
plus unacknowledged); bytes written minus those are acknowledged. The channel
polls that while it waits for anything else (the next message, a clear to
send, a latency deadline), at a pace set by how much is left: see
:meth:`DeliveryTracker.poll`.
"""

from __future__ import annotations

import fcntl
import queue
import select
import socket
import struct
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar

from emulator.base.waiting import wait_until
from emulator.model.schedule.format import Op

HEADER = struct.Struct("!IIQ")  # repetition, step, payload bytes
HELLO = struct.Struct("!II")  # sender rank and lane, first thing on a data connection
#: receiver -> sender, "this receive is posted": repetition, step, and when it was posted (CLOCK_MONOTONIC,
#: virtual: the time its dependencies were done, see emulator.model.schedule.dispatch)
CLEAR_TO_SEND = struct.Struct("!IId")
#: Below this many unacknowledged full frames (of the connection's MSS) delivery is polled every frame time / 4,
#: at least every DELIVERY_TAIL_POLL_S: they may already be past the bottleneck, their ACK due any moment.
DELIVERY_TAIL_FRAMES = 4
DELIVERY_TAIL_POLL_S = 0.001
#: Between two attempts to connect to a peer that is not listening yet.
CONNECT_RETRY_S = 0.05
#: ``SO_TIMESTAMPNS`` (``SO_TIMESTAMPNS_OLD``: 64-bit ``struct timespec``, CLOCK_REALTIME) on Linux's common
#: architectures; Python 3.11's socket module does not name it. TCP returns, with every read, the time the
#: last segment read reached this host's stack.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
_TIMESTAMP_CMSG_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
#: ``SO_TIMESTAMPING`` (``SO_TIMESTAMPING_OLD``, as ``SO_TIMESTAMPNS``) with the flags that make the kernel queue,
#: on the socket's error queue, when the peer's ACK covered the last byte of each write (software clock, no
#: payload echoed, tagged with that byte's offset in the stream): the time a send was delivered, however late
#: the agent looks (linux/net_tstamp.h: SOFTWARE 1<<4, OPT_ID 1<<7, TX_ACK 1<<9, OPT_TSONLY 1<<11).
SO_TIMESTAMPING = 37
ACK_TIMESTAMPING_FLAGS = (1 << 4) | (1 << 7) | (1 << 9) | (1 << 11)
_SO_EE_ORIGIN_TIMESTAMPING = 4
_SCM_TSTAMP_ACK = 2
_EXTENDED_ERR = struct.Struct("@IBBBBII")  # struct sock_extended_err: errno, origin, type, code, pad, info, data
_ACK_CMSG_BYTES = socket.CMSG_SPACE(3 * _TIMESPEC.size) + socket.CMSG_SPACE(_EXTENDED_ERR.size + 16)

T = TypeVar("T")


class ConnKey(NamedTuple):
    """Which connection: the peer rank at its other end, and the lane."""

    peer: int
    lane: int = 0

    def describe(self) -> str:
        return f"rank {self.peer}" + (f" lane {self.lane}" if self.lane else "")


class PeerError(Exception):
    """A data connection could not be set up, or the peer closed it."""


@dataclass(frozen=True)
class ClearToSend:
    """A receiver's "this receive is posted" (:data:`CLEAR_TO_SEND`)."""

    rep: int
    step: int
    posted_at: float


@dataclass(frozen=True)
class Header:
    """What precedes every message's payload (:data:`HEADER`)."""

    rep: int
    step: int
    nbytes: int


@dataclass(frozen=True)
class Delivered:
    """A watched send whose every byte the peer acknowledged: it ran from ``start`` to ``at``."""

    op: Op
    start: float
    at: float


@dataclass(frozen=True)
class _InFlight:
    """A watched send: its operation, its start, and the stream offset just past its last byte."""

    op: Op
    start: float
    end: int


def recv_exact(sock: socket.socket, view: memoryview, quickack: bool = False,
               readable: Callable[[], bool] | None = None) -> float | None:
    """Fill ``view`` from ``sock``; return when its last byte reached this host, on ``CLOCK_MONOTONIC``, where the
    socket has ``SO_TIMESTAMPNS`` on (None: no stamp came with the reads).

    ``readable()``, when given, is asked before every read (False: ask
    again). ``quickack`` re-arms ``TCP_QUICKACK`` before every read (the
    kernel leaves quick-ACK mode on its own), so the sender learns of
    delivery at once. Raises :class:`PeerError` when the peer closes the
    connection first.
    """
    got, total, arrived = 0, len(view), None
    while got < total:
        if readable is not None and not readable():
            continue
        if quickack:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        n, ancillary, _, _ = sock.recvmsg_into([view[got:]], _TIMESTAMP_CMSG_BYTES)
        if n == 0:
            raise PeerError("connection closed by peer")
        got += n
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                arrived = sec + nsec * 1e-9
    if arrived is None:
        return None
    return on_monotonic(arrived)


def on_monotonic(realtime: float) -> float:
    """A kernel's ``CLOCK_REALTIME`` stamp on the monotonic clock."""
    return realtime - (time.time() - time.monotonic())


def ack_stamps(sock: socket.socket) -> list[tuple[int, float]]:
    """The ACK timestamps the kernel queued on ``sock``'s error queue (:data:`ACK_TIMESTAMPING_FLAGS`), oldest
    first: for each, the stream offset just past the acknowledged write's last byte (modulo 2**32, counted from
    when stamping was switched on) and when the ACK came (monotonic)."""
    out: list[tuple[int, float]] = []
    while True:
        try:
            _, ancillary, _, _ = sock.recvmsg(0, _ACK_CMSG_BYTES, socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return out
        stamp, offset = None, None
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(data) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                stamp = sec + nsec * 1e-9
            elif len(data) >= _EXTENDED_ERR.size:
                _, origin, _, _, _, info, key = _EXTENDED_ERR.unpack_from(data)
                if origin == _SO_EE_ORIGIN_TIMESTAMPING and info == _SCM_TSTAMP_ACK:
                    offset = (key + 1) & 0xFFFFFFFF
        if stamp is not None and offset is not None:
            out.append((offset, on_monotonic(stamp)))


class DeliveryTracker:
    """Which of the sends written on one connection the peer has acknowledged (see the module docstring).

    ``written`` counts every byte written on the connection since it opened;
    :meth:`watch` marks the sends written so far whose delivery matters, and
    :meth:`poll` reports those the peer acknowledged, oldest first, as of
    when the ACK came: the kernel stamps it (:func:`ack_stamps`), so how
    often the agent looks sets how soon it learns, not the time it
    records (where the kernel cannot stamp, the time it looked).
    """

    def __init__(self, sock: socket.socket, link_bps: float, written: int = 0):
        self.sock = sock
        self.link_bps = link_bps
        self.written = written
        self._watched: deque[_InFlight] = deque()
        self._mss: int | None = None  # the connection's TCP MSS, asked once it matters
        self._stamps: deque[tuple[int, float]] = deque()  # (offset past an acknowledged write, ACK time)
        self._stamped_from: int | None = written  # the stream offset stamps count from (None: no stamps)
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, ACK_TIMESTAMPING_FLAGS)
        except OSError:
            self._stamped_from = None

    def wrote(self, nbytes: int) -> None:
        """``nbytes`` more were written on the connection."""
        self.written += nbytes
        self._collect_stamps()  # every write is stamped: keep the error queue short

    def _collect_stamps(self) -> None:
        if self._stamped_from is None:
            return
        for offset, at in ack_stamps(self.sock):
            last = self._stamps[-1][0] if self._stamps else self._stamped_from
            self._stamps.append((last + ((offset - (last - self._stamped_from)) & 0xFFFFFFFF), at))
        oldest = self._watched[0].end if self._watched else self.written
        while self._stamps and self._stamps[0][0] < oldest:
            self._stamps.popleft()

    def _acknowledged_at(self, end: int, now: float) -> float:
        """When the ACK covering stream offset ``end`` came (``now`` when no stamp says)."""
        return next((at for offset, at in self._stamps if offset >= end), now)

    def watch(self, op: Op, start: float) -> None:
        """``op`` (which started at ``start``) is complete once every byte written so far is acknowledged."""
        self._watched.append(_InFlight(op, start, self.written))

    @property
    def watching(self) -> bool:
        """Whether some watched send is not acknowledged yet."""
        return bool(self._watched)

    @property
    def oldest(self) -> Op | None:
        """The oldest watched send not acknowledged yet (the one to blame if the connection breaks)."""
        return self._watched[0].op if self._watched else None

    def poll(self, on_delivered: Callable[[Delivered], None]) -> float:
        """Report the watched sends the peer has acknowledged; return how long to wait before looking again.

        0 when nothing is watched any more. Otherwise half the time the oldest
        watched send's remainder needs at the link rate beyond its last
        :data:`DELIVERY_TAIL_FRAMES` frames (at most 20 ms, at least
        :data:`DELIVERY_TAIL_POLL_S`); once only those frames are
        unacknowledged, their ACK can come any moment (they may be past the
        bottleneck already): a quarter frame time, so that a step does not end
        up to a frame late. The figures behind this are in docs/fidelity.md.
        """
        buf = bytearray(4)
        fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, buf)
        acked = self.written - int.from_bytes(buf, sys.byteorder)
        now = time.monotonic()
        self._collect_stamps()  # also keeps the error queue from waking a wait for data
        while self._watched and self._watched[0].end <= acked:
            done = self._watched.popleft()
            on_delivered(Delivered(done.op, done.start, min(now, self._acknowledged_at(done.end, now))))
        if not self._watched:
            return 0.0
        if self._mss is None:
            self._mss = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        mss = self._mss
        left = self._watched[0].end - acked
        tail = DELIVERY_TAIL_FRAMES * mss
        if left <= tail:
            return max(DELIVERY_TAIL_POLL_S, mss * 8 / self.link_bps / 4)
        return min(max((left - tail) * 8 / self.link_bps / 2, DELIVERY_TAIL_POLL_S), 0.02)


class SendChannel:
    """Our end of the connection to a rank we send to: clears to send in, messages out, delivery tracked.

    Every wait takes ``on_delivered``: while waiting, the channel keeps
    polling delivery and reports each acknowledged watched send through it.
    """

    timed = False  # its transfers take what the links give them (emulator.emulation.agents.interconnect's are timed)

    def __init__(self, sock: socket.socket, key: ConnKey, link_bps: float):
        self.sock = sock
        self.key = key
        self.peer = key.peer
        self.delivery = DeliveryTracker(sock, link_bps)
        self._clear = bytearray(CLEAR_TO_SEND.size)

    def hello(self, rank: int) -> None:
        """Introduce ourselves (``rank``, and the lane): the first thing on a new connection."""
        self.sock.sendall(HELLO.pack(rank, self.key.lane))
        self.delivery.wrote(HELLO.size)

    def next(self, items: queue.Queue[T | None], on_delivered: Callable[[Delivered], None]) -> T | None:
        """The next item of ``items`` (None: stop), polling delivery meanwhile."""
        while True:
            wait = self.delivery.poll(on_delivered)
            if not self.delivery.watching:
                return items.get()
            try:
                return items.get(timeout=wait)
            except queue.Empty:
                continue

    def clear_to_send(self, on_delivered: Callable[[Delivered], None]) -> ClearToSend:
        """Block for the peer's next clear to send, polling delivery meanwhile."""

        def readable() -> bool:
            if not self.delivery.watching:
                return True  # nothing to watch: a blocking read is fine
            wait = self.delivery.poll(on_delivered)
            if not self.delivery.watching:
                return True
            if not select.select([self.sock], [], [], wait)[0]:
                return False
            # an ACK stamp on the error queue wakes select too: read only when data (or the end) is there
            try:
                self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            return True

        recv_exact(self.sock, memoryview(self._clear), readable=readable)
        return ClearToSend(*CLEAR_TO_SEND.unpack(self._clear))

    def sleep_until(self, deadline: float, on_delivered: Callable[[Delivered], None]) -> None:
        """Wait until ``deadline`` (monotonic), polling delivery meanwhile."""
        while (left := deadline - time.monotonic()) > 0:
            wait = self.delivery.poll(on_delivered)
            time.sleep(min(left, wait) if self.delivery.watching else left)

    def send(self, rep: int, step: int, payload: memoryview) -> None:
        """Write one message (header, then ``payload``); returns once the kernel holds all of it."""
        self.sock.sendall(HEADER.pack(rep, step, len(payload)))
        self.sock.sendall(payload)
        self.delivery.wrote(HEADER.size + len(payload))

    def close(self) -> None:
        close_quietly(self.sock)


class RecvChannel:
    """Our end of the connection from a rank we receive from: clears to send out, messages in.

    The kernel stamps every segment it receives (``SO_TIMESTAMPNS``): a
    payload's last stamp against when the agent was done with it is the
    agent's own lag (:mod:`emulator.emulation.session.fidelity`).
    """

    timed = False

    def __init__(self, sock: socket.socket, key: ConnKey, stamped: bool = True):
        self.sock = sock
        self.key = key
        self.peer = key.peer
        self._header = bytearray(HEADER.size)
        if stamped:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

    def post(self, rep: int, step: int, at: float) -> None:
        """Tell the sender that our receive of ``step`` is posted, as of ``at`` (raises :class:`OSError`)."""
        self.sock.sendall(CLEAR_TO_SEND.pack(rep, step, at))

    def header(self) -> Header:
        """Block for the next message's header."""
        recv_exact(self.sock, memoryview(self._header))
        return Header(*HEADER.unpack(self._header))

    def payload_into(self, view: memoryview) -> float | None:
        """Read the message's payload into ``view``, acknowledging every segment at once (the sender's
        send completes on the last ACK); return when its last byte reached this host (monotonic; None: unknown)."""
        return recv_exact(self.sock, view, quickack=True)

    def close(self) -> None:
        close_quietly(self.sock)


def close_quietly(sock: socket.socket) -> None:
    """Close ``sock``; a socket already broken closes all the same."""
    try:
        sock.close()
    except OSError:
        pass


# ------------------------------------------------------------------ set-up
@dataclass(frozen=True)
class Route:
    """How to reach a rank we send to on one lane: its address, and the ports of the connection's 5-tuple."""

    key: ConnKey
    ip: str
    sport: int
    dport: int
    name: str  # for error messages: "rank 3 (h4 10.0.0.4)"


@dataclass(frozen=True)
class ConnectionPlan:
    """One rank's data connections: where it listens, whom it accepts, and the routes it connects along."""

    rank: int
    ip: str
    port: int
    receive_from: tuple[ConnKey, ...]
    send_to: tuple[Route, ...]
    rcvbuf: int
    link_bps: float


class _Closes(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=_Closes)


@dataclass
class Channels(Generic[S]):
    """A rank's open data connections, by peer rank and lane: their send ends of type ``S`` (over the fabric
    :class:`SendChannel`, over a server's interconnect :mod:`emulator.emulation.agents.interconnect`'s own) and
    their receive ends."""

    send: dict[ConnKey, S]
    receive: dict[ConnKey, RecvChannel]

    def close(self) -> None:
        for out in self.send.values():
            out.close()
        for into in self.receive.values():
            into.close()


def open_channels(plan: ConnectionPlan, timeout_s: float) -> Channels[SendChannel]:
    """Listen for ``plan.receive_from`` and connect along ``plan.send_to``, all within ``timeout_s``.

    The listening socket's receive buffer is ``plan.rcvbuf``, set before
    ``listen``: accepted sockets inherit it, and the window scale follows it
    (room for a whole message before its receive is posted, so a late
    receiver does not throttle its sender). Raises :class:`PeerError` naming
    the peer that could not be reached or never connected.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, plan.rcvbuf)
        listener.bind((plan.ip, plan.port))
        listener.listen(max(len(plan.receive_from), 1))
        listener.settimeout(timeout_s)
        accepted: dict[ConnKey, socket.socket] = {}
        accept_error: list[BaseException] = []
        acceptor = threading.Thread(target=accept_all, args=(listener, plan.receive_from, accepted, accept_error),
                                    daemon=True)
        acceptor.start()
        deadline = time.monotonic() + timeout_s
        send: dict[ConnKey, SendChannel] = {}
        for route in plan.send_to:
            channel = SendChannel(connect(plan.ip, route, deadline), route.key, plan.link_bps)
            channel.hello(plan.rank)
            send[route.key] = channel
        acceptor.join(max(deadline - time.monotonic(), 0.1))
    finally:
        listener.close()
    check_accepted(plan.receive_from, accepted, accept_error)
    return Channels(send, {key: RecvChannel(sock, key) for key, sock in accepted.items()})


def check_accepted(expected: Iterable[ConnKey], accepted: dict[ConnKey, socket.socket],
                   errors: list[BaseException], over: str = "") -> None:
    """Raise :class:`PeerError` for the first failure of :func:`accept_all`, or naming the peers of
    ``expected`` that never connected (``over``: what they should have connected over, for the message)."""
    if errors:
        raise PeerError(f"accepting connections{over}: {errors[0]}")
    missing = sorted(set(expected) - set(accepted))
    if missing:
        raise PeerError(f"{', '.join(key.describe() for key in missing)} never connected{over}")


def no_delay(conn: socket.socket) -> None:
    """A TCP connection sends every write at once (no Nagle)."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def accept_all(listener: socket.socket, expected: Iterable[ConnKey], accepted: dict[ConnKey, socket.socket],
               errors: list[BaseException], prepare: Callable[[socket.socket], None] = no_delay) -> None:
    """Accept one connection per key of ``expected`` into ``accepted``, each introduced by its :data:`HELLO` and
    then ``prepare``-d (the first failure: ``errors``)."""
    wanted = set(expected)
    try:
        while len(accepted) < len(wanted):
            conn, _ = listener.accept()
            conn.settimeout(None)
            buf = bytearray(HELLO.size)
            recv_exact(conn, memoryview(buf))
            key = ConnKey(*HELLO.unpack(buf))
            if key not in wanted or key in accepted:
                raise PeerError(f"unexpected connection from {key.describe()}")
            prepare(conn)
            accepted[key] = conn
    except BaseException as exc:  # reported by open_channels
        errors.append(exc)


def connect(ip: str, route: Route, deadline: float) -> socket.socket:
    """A connection from ``(ip, route.sport)`` to ``route``, retried until ``deadline`` (monotonic) while the
    peer is not listening yet. Raises :class:`PeerError` with the last attempt's error."""
    failures: list[OSError] = []

    def attempt() -> socket.socket | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((ip, route.sport))
        sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            sock.connect((route.ip, route.dport))
        except OSError as exc:  # refused (not listening yet), timed out, unreachable
            sock.close()
            failures.append(exc)
            return None
        sock.settimeout(None)
        return sock

    sock = wait_until(attempt, max(deadline - time.monotonic(), 0.0), CONNECT_RETRY_S)
    if sock is None:
        raise PeerError(f"cannot connect to {route.name}: {failures[-1]}")
    return sock
