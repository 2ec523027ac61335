"""The control protocol between the orchestrator (``emu replay``) and its agents.

One stream socket: a Unix socket on one machine, or TCP to the head's
underlay address (``tcp:IP:PORT``) when agents run on a cluster's other
servers (:func:`connect`). Each side sends JSON objects, one per line, each
with a ``type`` from :class:`Msg`. An agent connects and says ``hello`` with
its rank, then ``ready`` when its peer connections are up. The orchestrator
answers with ``go`` (a repetition: ``rep``, ``start_at`` on the agent's
monotonic clock, which on one machine is the orchestrator's and on a
cluster's other servers is translated per server, ``watch_steps``) or ``quit``. During a repetition an agent
reports ``step`` for each watched step it enters, then ``done`` with its
operation times; ``error`` when it fails. :class:`ControlServer` turns a
connection that closes into a ``closed`` message of that rank.

This module owns the framing and the message types; what the messages mean
for a run is :mod:`emulator.emulation.agents.fleet`'s and :mod:`emulator.emulation.agents.agent`'s business.
"""

from __future__ import annotations

import enum
import json
import select
import socket
from collections.abc import Mapping
from typing import Any


class Msg(enum.StrEnum):
    HELLO = "hello"
    READY = "ready"
    GO = "go"
    QUIT = "quit"
    STEP = "step"
    DONE = "done"
    ERROR = "error"
    CLOSED = "closed"  # made by ControlServer, never sent


class ControlError(Exception):
    """The control connection broke, or a peer sent something that is not the protocol."""


def encode(kind: Msg, **fields: Any) -> bytes:
    return (json.dumps({"type": str(kind), **fields}) + "\n").encode()


def decode(line: bytes | str) -> dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError as exc:
        raise ControlError(f"not a control message: {line[:80]!r} ({exc})") from None
    if not isinstance(msg, dict) or msg.get("type") not in Msg.__members__.values():
        raise ControlError(f"not a control message: {line[:80]!r}")
    return msg


class LineBuffer:
    """Bytes in, complete messages out (a message may arrive in pieces, or several at once)."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        *lines, self._rest = (self._rest + chunk).split(b"\n")
        return [decode(line) for line in lines if line.strip()]


TCP_PREFIX = "tcp:"


def tcp_address(text: str) -> tuple[str, int]:
    """``tcp:IP:PORT`` as (IP, PORT)."""
    host, _, port = text.removeprefix(TCP_PREFIX).rpartition(":")
    return host, int(port)


FD_PREFIX = "fd:"


def connect(address: str) -> socket.socket:
    """A connected stream socket to the control address: ``tcp:IP:PORT``, a Unix socket's path, or ``fd:N``, a
    connection already open on descriptor N (:func:`preconnect`)."""
    if address.startswith(FD_PREFIX):
        return socket.socket(fileno=int(address.removeprefix(FD_PREFIX)))
    if address.startswith(TCP_PREFIX):
        sock = socket.create_connection(tcp_address(address), timeout=30)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    return sock


def preconnect(argv: list[str]) -> list[str]:
    """``argv`` with a TCP ``--control`` address replaced by ``fd:N``, a connection opened now.

    An agent joins its host's network namespace, which reaches only the
    emulated fabric; the head's underlay address, where the control server
    of a cluster listens, is reachable from the server's own namespace. The
    launcher connects there before the agent enters its host, and the socket
    keeps the namespace it was made in.
    """
    if "--control" not in argv:
        return argv
    i = argv.index("--control") + 1
    if i < len(argv) and argv[i].startswith(TCP_PREFIX):
        argv = [*argv[:i], f"{FD_PREFIX}{connect(argv[i]).detach()}", *argv[i + 1:]]
    return argv


class AgentChannel:
    """An agent's end: connect, send, and block for the orchestrator's next message."""

    def __init__(self, address: str):
        self.sock = connect(address)
        self.reader = self.sock.makefile("r", encoding="utf-8")

    def send(self, kind: Msg, **fields: Any) -> None:
        self.sock.sendall(encode(kind, **fields))

    def close(self) -> None:
        self.reader.close()  # the file object holds the socket open too
        self.sock.close()

    def receive(self) -> dict[str, Any]:
        line = self.reader.readline()
        if not line:
            raise ControlError("control connection closed")
        return decode(line)


class ControlServer:
    """The orchestrator's end: accepts agents, learns their ranks from ``hello``, and multiplexes them."""

    def __init__(self, path: str, expected: int, tcp_host: str | None = None):
        """Listen on the Unix socket ``path``, or with ``tcp_host`` on a free TCP port of that address instead
        (:attr:`address` says where agents connect)."""
        self.path = path
        if tcp_host is None:
            self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.server.bind(path)
            self.address = path
        else:
            self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.server.bind((tcp_host, 0))
            self.address = f"{TCP_PREFIX}{tcp_host}:{self.server.getsockname()[1]}"
        self.server.listen(expected)
        self.conns: dict[int, socket.socket] = {}
        self.buffers: dict[socket.socket, LineBuffer] = {}
        self.unknown: list[socket.socket] = []

    def close(self) -> None:
        for conn in [*self.conns.values(), *self.unknown]:
            conn.close()
        self.server.close()

    def send_all(self, kind: Msg, per_rank: Mapping[int, Mapping[str, Any]] | None = None, **fields: Any) -> None:
        """Send one message to every agent (``per_rank``: fields that differ by rank); :class:`ControlError`
        names the first rank that cannot take it."""
        data = encode(kind, **fields)
        for rank, conn in self.conns.items():
            try:
                conn.sendall(encode(kind, **{**fields, **per_rank[rank]}) if per_rank and rank in per_rank else data)
            except OSError as exc:
                raise ControlError(f"rank {rank}: control connection lost ({exc})") from None

    def poll(self, timeout: float) -> list[dict[str, Any]]:
        """Accept new agents and return the complete messages that arrive within ``timeout``."""
        socks = [self.server, *self.conns.values(), *self.unknown]
        readable, _, _ = select.select(socks, [], [], timeout)
        messages: list[dict[str, Any]] = []
        for sock in readable:
            if sock is self.server:
                conn, _ = self.server.accept()
                if conn.family == socket.AF_INET:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.unknown.append(conn)
            else:
                messages += self._read(sock)
        return messages

    def _read(self, sock: socket.socket) -> list[dict[str, Any]]:
        try:
            chunk = sock.recv(1 << 20)
        except ConnectionResetError:  # an agent killed with our messages unread: closed all the same
            chunk = b""
        rank = next((r for r, c in self.conns.items() if c is sock), None)
        if not chunk:
            if rank is not None:
                del self.conns[rank]
            else:
                self.unknown.remove(sock)
            sock.close()
            return [{"type": str(Msg.CLOSED), "rank": rank}] if rank is not None else []
        messages = self.buffers.setdefault(sock, LineBuffer()).feed(chunk)
        for msg in messages:
            if msg["type"] == Msg.HELLO and sock in self.unknown:
                self.unknown.remove(sock)
                self.conns[int(msg["rank"])] = sock
        return messages
