"""Enlarging the socket buffers of a running ovs-vswitchd, from outside it.

The userspace datapath sends every packet of every port through ONE
non-blocking AF_PACKET socket; packets waiting in the ports' HTB queues are
charged to that socket, so at the kernel's default buffer (about 20 jumbo
frames for the whole switch) sends fail with EAGAIN and Open vSwitch drops
packets that no qdisc counter shows. Open vSwitch has no setting for it, so
:func:`enlarge_ovs_sockets` duplicates the sockets out of the daemon with
``pidfd_getfd`` (root, Linux >= 5.6) and sets ``SO_SNDBUFFORCE`` /
``SO_RCVBUFFORCE`` on them: nothing is restarted.

Which sockets: the send socket is the AF_PACKET socket bound to no protocol
and no interface; a receive socket is bound to one of our interfaces
(:func:`socket_kind`, pure, reading ``/proc/net/packet`` rows).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import sys
from collections.abc import Container, Iterator, Sequence

#: The buffer each of those sockets gets (bytes).
PORT_SOCKET_BYTES = 64 * 1024 * 1024
OVS_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
# Linux's values; the socket module does not export them.
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33
SYS_PIDFD_GETFD = 438


def vswitchd_pid(pidfiles: Sequence[str] = (OVS_PIDFILE, "/run/openvswitch/ovs-vswitchd.pid")) -> int | None:
    """The running ovs-vswitchd's pid, from its pidfile (None when there is none)."""
    for pidfile in pidfiles:
        try:
            with open(pidfile, encoding="ascii") as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if os.path.exists(f"/proc/{pid}"):
            return pid
    return None


def packet_sockets(proc_net_packet: str = "/proc/net/packet") -> dict[int, tuple[int, int]]:
    """Inode -> (protocol, interface index) of every AF_PACKET socket."""
    out = {}
    with open(proc_net_packet, encoding="ascii") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if len(f) >= 9:
                out[int(f[8])] = (int(f[3], 16), int(f[4]))
    return out


def socket_kind(protocol: int, ifindex: int, our_ifindexes: Container[int]) -> str | None:
    """``send`` for the datapath's one send socket, ``receive`` for a port of ours, None for the rest."""
    if protocol == 0 and ifindex == 0:
        return "send"
    return "receive" if ifindex in our_ifindexes else None


def interface_indexes(names: Sequence[str], sys_class_net: str = "/sys/class/net") -> dict[int, str]:
    """Interface index -> name of those ``names`` that exist."""
    out = {}
    for name in names:
        try:
            with open(os.path.join(sys_class_net, name, "ifindex"), encoding="ascii") as fh:
                out[int(fh.read())] = name
        except OSError:
            continue
    return out


def _socket_fds(pid: int) -> Iterator[tuple[int, int]]:
    """(fd number, socket inode) of every socket ``pid`` holds."""
    for entry in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:["):
            yield int(entry), int(target[8:-1])


def _set_buffer(libc: ctypes.CDLL, pidfd: int, fd: int, option: int, size: int) -> None:
    """Set ``option`` to ``size`` on the daemon's ``fd`` through a duplicate of it."""
    dup = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
    if dup < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd on ovs-vswitchd")
    try:
        sock = socket.socket(fileno=dup)
        sock.setsockopt(socket.SOL_SOCKET, option, size)
        sock.detach()
    finally:
        os.close(dup)


def enlarge_ovs_sockets(interfaces: Sequence[str], size: int = PORT_SOCKET_BYTES) -> dict[str, int]:
    """Give ovs-vswitchd's send socket and the receive sockets of ``interfaces`` ``size`` bytes of buffer.

    Returns how many sockets were changed, per kind (``send``, ``receive``).
    Raises :class:`OSError` when the daemon or a socket cannot be reached.
    """
    pid = vswitchd_pid()
    if pid is None:
        raise OSError(errno.ESRCH, f"no running ovs-vswitchd ({OVS_PIDFILE})")
    ours = interface_indexes(interfaces)
    sockets = packet_sockets()
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    done = {"send": 0, "receive": 0}
    try:
        for fd, inode in _socket_fds(pid):
            if inode not in sockets:
                continue
            kind = socket_kind(*sockets[inode], ours)
            if kind is None:
                continue
            _set_buffer(libc, pidfd, fd, SO_SNDBUFFORCE if kind == "send" else SO_RCVBUFFORCE, size)
            done[kind] += 1
    finally:
        os.close(pidfd)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m emulator.emulation.network.ovs_sockets INTERFACE...``: enlarge this server's Open vSwitch sockets
    (how a cluster's head does it on the other servers); prints ``send=N receive=M``."""
    names = list(sys.argv[1:] if argv is None else argv)
    try:
        done = enlarge_ovs_sockets(names)
    except OSError as exc:
        print(f"ovs_sockets: {exc}", file=sys.stderr)
        return 1
    print(" ".join(f"{kind}={count}" for kind, count in done.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
