"""A server's accelerator interconnect (NVLink/NVSwitch-like): transfers timed by an arbiter, not packets.

A topology with ``domain_bw`` gives each server an interconnect: every
accelerator has a port into it and a port out of it at ``domain_bw`` per
direction, and the interconnect switches without blocking. Real ones run at
many times the NIC rate (NVLink 4: 450 GB/s per GPU and direction against a
400 Gbit/s NIC, nine times). Sending those bytes as packets through the
datapath would cost this machine nine times a NIC's load for every
accelerator, on the one thread that already carries the fabric. So these
transfers do not cross the datapath: they are *timed*, by the timing model's
own rule (rule 4 of :mod:`emulator.model.prediction.timing`, flows sharing
links max-min fairly), with the bytes carried by a Unix socket beside the
timing:

* one :class:`DomainArbiter` per replay (a thread of the replay's process)
  holds every server's ports (:func:`emulator.model.prediction.cost.domain_links`)
  in a :class:`~emulator.model.prediction.fluid.FluidLinks`;
* a sender whose transfer starts (its clear to send in, its message latency
  passed, as on the fabric) tells the arbiter (:data:`START`), writes the
  header and payload into the Unix socket to the receiver at once, and
  waits for the arbiter's :data:`DRAINED`: when its bytes would be through
  the ports, at the rate they would get beside the server's other
  transfers;
* the sender then writes a :data:`TRAILER` with that time, and the receiver
  completes on it.

The data still moves (the receiver checks it, as on the fabric), and each
transfer takes what the model says, neither more nor less: the arbiter
reports when a flow drained on the fluid clock, not when it woke up to
notice. What it cannot hide is its own lateness: a sender learns of a drain
when the arbiter's thread runs, and the next message on that channel starts
after that. Connections: one Unix socket per (sender, receiver, lane), made
as the fabric's TCP ones are (:data:`~emulator.emulation.agents.peer.HELLO`,
:data:`~emulator.emulation.agents.peer.CLEAR_TO_SEND`, :data:`~emulator.emulation.agents.peer.HEADER`);
every rank listens on :func:`rank_socket` and the arbiter on
:func:`arbiter_socket`, both in one directory of the run. Unix sockets cross
network namespaces, so it works between Mininet hosts; not between
machines, so a cluster run refuses a topology with an interconnect.
"""

from __future__ import annotations

import logging
import os
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from emulator.base.waiting import wait_until
from emulator.emulation.agents.peer import (
    CLEAR_TO_SEND,
    CONNECT_RETRY_S,
    HEADER,
    HELLO,
    Channels,
    ClearToSend,
    ConnKey,
    Delivered,
    PeerError,
    RecvChannel,
    accept_all,
    check_accepted,
    close_quietly,
    recv_exact,
)
from emulator.model.prediction.cost import domain_capacity, domain_links
from emulator.model.prediction.fluid import Drained, FluidLinks
from emulator.model.schedule.format import Op
from emulator.model.topology import Topology

#: sender -> arbiter: flow number (per connection), sending and receiving host index, bytes, start (monotonic)
START = struct.Struct("!QIIQd")
#: arbiter -> sender: flow number, when its last byte was through (monotonic)
DRAINED = struct.Struct("!Qd")
#: sender -> receiver after the payload: when its last byte was through (monotonic)
TRAILER = struct.Struct("!d")
#: The longest path a Unix socket may have (``sun_path`` holds 108 bytes with its NUL).
MAX_SOCKET_PATH = 107

log = logging.getLogger("emulator.emulation.agents.interconnect")
T = TypeVar("T")
OnDelivered = Callable[[Delivered], None]


def arbiter_socket(directory: str) -> str:
    return os.path.join(directory, "domain-arbiter.sock")


def rank_socket(directory: str, rank: int) -> str:
    return os.path.join(directory, f"domain-rank-{rank}.sock")


def check_directory(directory: str, ranks: int) -> None:
    """Raise :class:`ValueError` when the sockets of ``ranks`` ranks in ``directory`` would not fit ``sun_path``."""
    longest = max(len(arbiter_socket(directory)), len(rank_socket(directory, max(ranks - 1, 0))))
    if longest > MAX_SOCKET_PATH:
        raise ValueError(f"interconnect sockets in {directory!r} would have {longest}-byte paths, "
                         f"more than a Unix socket takes ({MAX_SOCKET_PATH}): use a shorter run directory")


# ------------------------------------------------------------------ arbiter
@dataclass
class _Client:
    """One sender channel's connection to the arbiter, and what it has sent but not yet been read."""

    sock: socket.socket
    pending: bytearray


class DomainArbiter:
    """Every server's interconnect ports, shared max-min as time passes (see the module docstring).

    :meth:`start` listens on :func:`arbiter_socket` and serves in a daemon
    thread until :meth:`close`. ``late_s`` is the most its thread woke late
    for a drain (seconds), ``flows`` how many transfers it timed. Should the
    thread fail, ``error`` says why and every sender's connection is closed,
    so their agents fail at once rather than wait for a drain.
    """

    def __init__(self, topo: Topology, directory: str, clock: Callable[[], float] = time.monotonic):
        if not topo.has_domain:
            raise ValueError(f"topology {topo.spec} has no accelerator interconnect (domain_bw)")
        self.topo = topo
        self.path = arbiter_socket(directory)
        self.clock = clock
        cap = domain_capacity(topo)
        ports = {link for server in topo.servers() for a in server for b in server if a != b
                 for link in domain_links(topo, a, b)}
        self.fluid = FluidLinks({link: cap for link in ports})
        self.hosts = {h.index: h.name for h in topo.hosts}
        self.late_s = 0.0
        self.flows = 0
        self.error: str | None = None
        self._selector = selectors.DefaultSelector()
        self._owner: dict[Hashable, tuple[_Client, int]] = {}  # flow -> its client, and its number there
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> DomainArbiter:
        if os.path.exists(self.path):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="domain-arbiter", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, close every connection and remove the socket file. Safe twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        self._listener = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def __enter__(self) -> DomainArbiter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                due = self.fluid.next_drain()
                wait = 0.05 if due is None else min(max(due - self.clock(), 0.0), 0.05)
                for key, _ in self._selector.select(wait):
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.data)
                now = self.clock()
                drained = self.fluid.advance(now)
                self.late_s = max([self.late_s, *(now - d.at for d in drained)])
                self._notify(drained)
        except Exception as exc:  # whatever it was, the senders must not wait for it
            self.error = f"interconnect arbiter failed: {type(exc).__name__}: {exc}"
            log.error("%s", self.error)
            for key in list(self._selector.get_map().values()):
                if key.data is not None:
                    self._selector.unregister(key.fileobj)
                    key.data.sock.close()

    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        client = _Client(sock, bytearray())
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(START.size * 64)
        except OSError:
            data = b""
        if not data:  # the sender is gone (its agent ended)
            self._selector.unregister(client.sock)
            client.sock.close()
            return
        client.pending += data
        while len(client.pending) >= START.size:
            number, src, dst, nbytes, at = START.unpack_from(client.pending)
            del client.pending[:START.size]
            flow = (id(client), number)
            self._owner[flow] = (client, number)
            self.flows += 1
            links = domain_links(self.topo, self.hosts[src], self.hosts[dst])
            # a start reported after the arbiter's clock moved on starts now: time never goes back
            self._notify(self.fluid.start(flow, links, nbytes, max(at, self.fluid.now)))

    def _notify(self, drained: Iterable[Drained]) -> None:
        for d in drained:
            client, number = self._owner.pop(d.flow)
            try:
                client.sock.sendall(DRAINED.pack(number, d.at))
            except OSError as exc:  # the sender is gone; its agent's failure says why
                log.warning("interconnect arbiter: flow %d of a sender that left: %s", number, exc)


# ------------------------------------------------------------------ channels
class _NoDelivery:
    """What a timed channel has instead of :class:`~emulator.emulation.agents.peer.DeliveryTracker`: nothing to watch,
    a send is complete when the arbiter says its bytes are through."""

    oldest: Op | None = None
    watching = False


class DomainSendChannel:
    """Our end of the interconnect connection to a rank of our server: clears to send in, timed transfers out."""

    timed = True

    def __init__(self, sock: socket.socket, key: ConnKey, arbiter: socket.socket, src: int, dst: int):
        self.sock = sock
        self.key = key
        self.peer = key.peer
        self.arbiter = arbiter
        self.src, self.dst = src, dst  # host indices, as the arbiter knows them
        self.delivery = _NoDelivery()
        self._flows = 0
        self._clear = bytearray(CLEAR_TO_SEND.size)
        self._drained = bytearray(DRAINED.size)

    def hello(self, rank: int) -> None:
        self.sock.sendall(HELLO.pack(rank, self.key.lane))

    # The waits take ``on_delivered`` as the fabric's channel does; nothing is ever delivered late here.
    def next(self, items: queue.Queue[T | None], on_delivered: OnDelivered) -> T | None:
        """The next item of ``items`` (None: stop)."""
        return items.get()

    def clear_to_send(self, on_delivered: OnDelivered) -> ClearToSend:
        recv_exact(self.sock, memoryview(self._clear))
        return ClearToSend(*CLEAR_TO_SEND.unpack(self._clear))

    def sleep_until(self, deadline: float, on_delivered: OnDelivered) -> None:
        time.sleep(max(0.0, deadline - time.monotonic()))

    def transfer(self, rep: int, step: int, payload: memoryview, start: float) -> float:
        """One message, started at ``start`` (monotonic): the arbiter times it, the socket carries it; returns
        when its last byte was through (monotonic, the arbiter's fluid clock)."""
        self._flows += 1
        self.arbiter.sendall(START.pack(self._flows, self.src, self.dst, len(payload), start))
        self.sock.sendall(HEADER.pack(rep, step, len(payload)))
        self.sock.sendall(payload)
        recv_exact(self.arbiter, memoryview(self._drained))
        number, drained = DRAINED.unpack(self._drained)
        if number != self._flows:
            raise PeerError(f"interconnect arbiter answered flow {number}, expected {self._flows}")
        self.sock.sendall(TRAILER.pack(drained))
        return float(drained)

    def close(self) -> None:
        close_quietly(self.sock)
        close_quietly(self.arbiter)


class DomainRecvChannel(RecvChannel):
    """Our end of the interconnect connection from a rank of our server: clears to send out, messages in, each
    followed by its :data:`TRAILER` (no kernel stamps: the arbiter's time is the arrival)."""

    timed = True

    def __init__(self, sock: socket.socket, key: ConnKey):
        super().__init__(sock, key, stamped=False)
        self._trailer = bytearray(TRAILER.size)

    def payload_into(self, view: memoryview) -> float | None:
        """The payload into ``view``, then its trailer: returns when its last byte was through (monotonic)."""
        recv_exact(self.sock, view)
        recv_exact(self.sock, memoryview(self._trailer))
        return float(TRAILER.unpack(self._trailer)[0])


# ------------------------------------------------------------------ set-up
@dataclass(frozen=True)
class DomainPlan:
    """One rank's interconnect connections: where its sockets are, whom it accepts, whom it sends to (with the
    host indices the arbiter knows them by)."""

    rank: int
    directory: str
    host_index: int
    receive_from: tuple[ConnKey, ...]
    send_to: tuple[tuple[ConnKey, int], ...]  # (key, the receiver's host index)


def open_domain_channels(plan: DomainPlan, timeout_s: float) -> Channels[DomainSendChannel]:
    """Listen on :func:`rank_socket` for ``plan.receive_from``, connect to each of ``plan.send_to`` and, per
    send channel, to the arbiter, all within ``timeout_s``. Raises :class:`PeerError` naming the peer."""
    path = rank_socket(plan.directory, plan.rank)
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(max(len(plan.receive_from), 1))
        listener.settimeout(timeout_s)
        accepted: dict[ConnKey, socket.socket] = {}
        errors: list[BaseException] = []
        acceptor = threading.Thread(target=accept_all, args=(listener, plan.receive_from, accepted, errors,
                                                             lambda conn: None), daemon=True)
        acceptor.start()
        deadline = time.monotonic() + timeout_s
        send: dict[ConnKey, DomainSendChannel] = {}
        for key, dst in plan.send_to:
            sock = _connect(rank_socket(plan.directory, key.peer), deadline, key.describe())
            arbiter = _connect(arbiter_socket(plan.directory), deadline, "the interconnect arbiter")
            channel = DomainSendChannel(sock, key, arbiter, plan.host_index, dst)
            channel.hello(plan.rank)
            send[key] = channel
        acceptor.join(max(deadline - time.monotonic(), 0.1))
    finally:
        listener.close()
        if os.path.exists(path):
            os.unlink(path)
    check_accepted(plan.receive_from, accepted, errors, " over the interconnect")
    return Channels(send, {key: DomainRecvChannel(sock, key) for key, sock in accepted.items()})


def _connect(path: str, deadline: float, name: str) -> socket.socket:
    """A Unix socket connected to ``path``, retried until ``deadline`` while nothing listens there yet."""
    failures: list[OSError] = []

    def attempt() -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            failures.append(exc)
            return None
        return sock

    sock = wait_until(attempt, max(deadline - time.monotonic(), 0.0), CONNECT_RETRY_S)
    if sock is None:
        raise PeerError(f"cannot connect to {name} over the interconnect ({path}): "
                        f"{failures[-1] if failures else 'timed out'}")
    return sock
