"""Mininet bring-up of a topology model: the edge where the model becomes packets.

:class:`EmulatedNetwork` turns a :class:`~emulator.topology.Topology` into a
Mininet network of Open vSwitch switches and shaped links, and tears it down.

Naming (all names in the root namespace carry the project prefix ``ef`` so
that ``emu clean`` finds exactly ours):

* model switch ``sI`` -> OVS bridge / Mininet switch ``efsI``, ports
  ``efsI-ethP`` with OpenFlow port number P (the model's port);
* model host ``hI`` -> Mininet host ``hI`` whose one interface is
  ``efhI-eth0``.

What bring-up does, in order: checks root and Open vSwitch, picks the
datapath (kernel where the openvswitch module exists, userspace otherwise),
creates hosts (recording their pids in the run state), switches and links
shaped with HTB (``TCLink``), starts the switches (OpenFlow 1.3, fail-mode
secure, the model's dpid), then configures every host: TX checksum offload
off on the userspace datapath (otherwise TCP carries nothing), IPv6 off,
``tcp_slow_start_after_idle`` off, static ARP for every other host. With no
controller it installs the routing policy's flow entries with ``ovs-ofctl``.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from emulator import routing
from emulator.errors import UserError
from emulator.naming import NAME_PREFIX, bridge_name, host_intf, switch_intf, switch_of_intf  # noqa: F401 (re-exported)
from emulator.runstate import RunState, kill_recorded, proc_netns, state_root
from emulator.system import Runner, choose_datapath, netem_available, require_ovs, require_root, require_tools, run
from emulator.topology import DEFAULT_MTU, Topology, tcp_goodput_factor  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)


def root_interfaces(topo: Topology) -> list[str]:
    """Every link end in the root namespace: the switch side of each link (both sides of switch and NIC links)."""
    return list(root_interface_rates(topo))


def root_interface_rates(topo: Topology) -> dict[str, float]:
    """Every root-namespace link end (see :func:`root_interfaces`) with its link's rate in Mbit/s."""
    rates = {switch_intf(lk.b, lk.b_port): lk.bw_mbps for lk in topo.links}
    rates.update((switch_intf(lk.a, lk.a_port), lk.bw_mbps) for lk in topo.links if lk.kind != "host")
    return rates


#: The burst of every shaping class (bytes). HTB lets a packet leave when the
#: class has any tokens left, so after an idle moment a link releases its
#: first packet at once and ``burst`` bytes more; a real link holds every
#: frame for its serialisation. A small burst keeps the difference to the one
#: packet, which the agents then add themselves (:attr:`emulator.latency.PathLatency.unshaped_s`).
#: Mininet's 15 kB let a 9000-byte frame and the next one through unshaped
#: (measured: a ping of 16000 bytes 0.32 ms round trip at 20 Mbit/s, 7.6 ms
#: with 100 bytes, 25.7 ms of serialisation on a real link); the rate is kept
#: (iperf3 19.83 of 20 Mbit/s either way).
SHAPER_BURST_BYTES = 100


def shaping_class_command(intf: str, rate_mbps: float) -> list[str]:
    """Set the shaping class of ``intf`` (Mininet ``TCLink``'s HTB 5:1) to ``rate_mbps`` with :data:`SHAPER_BURST_BYTES`."""
    burst = f"{SHAPER_BURST_BYTES}b"
    return ["tc", "class", "change", "dev", intf, "parent", "5:0", "classid", "5:1", "htb", "rate",
            f"{rate_mbps:g}Mbit", "burst", burst, "cburst", burst]


def _quiet_htb_quantum(record: logging.LogRecord) -> bool:
    """Drop tc's "quantum of class ... is big" warnings (links over 16 Mbit/s): with one class per link,
    HTB's quantum decides nothing."""
    return "quantum of class" not in record.getMessage()


#: Bytes a switch port queues before it drops (the HTB leaf's pfifo limit is
#: this in whole frames, at least 16): about 0.7 s at 10 Mbit/s.
DEFAULT_QUEUE_BYTES = 900_000
#: Every host's address is in this subnet (:func:`emulator.topology.host_ip`), one connected route.
HOST_SUBNET = "10.0.0.0/8"


#: PCIe is lossless (credit-based flow control): where accelerators of a
#: server converge on a shared NIC nothing is dropped, the senders wait. The
#: PCIe switch's ports approximate that with queues deeper than anything TCP
#: keeps in flight (a flow holds at most one message here).
PCIE_QUEUE_BYTES = 64 << 20


def queue_packets_for(mtu: int, queue_bytes: int = DEFAULT_QUEUE_BYTES) -> int:
    return max(16, queue_bytes // mtu)


def queue_limits(topo: Topology, mtu: int, queue_packets: int | None = None) -> dict[str, int]:
    """The pfifo limit (frames) of every root-namespace link end: PCIe switch ports deep, the others ``queue_packets``."""
    default = queue_packets or queue_packets_for(mtu)
    pcie = queue_packets_for(mtu, PCIE_QUEUE_BYTES)
    limits = {}
    for name in root_interfaces(topo):
        limits[name] = pcie if topo.is_pcie_switch(switch_of_intf(name)) else default
    return limits


#: Bytes one TCP flow may hold in its host's own queue (TCP small queues):
#: keeps a host's ACKs from waiting behind a deep queue of its own data.
DEFAULT_HOST_TSQ_BYTES = 65536


#: Socket buffers of the userspace datapath. ovs-vswitchd sends every packet of
#: every port through ONE non-blocking AF_PACKET socket; packets waiting in the
#: ports' HTB queues are charged to that socket, so at the kernel default
#: (208 KiB, about 20 jumbo frames for the whole switch) sends fail with EAGAIN
#: and OVS drops packets that no qdisc counter shows. Bring-up enlarges that
#: socket, and the receive sockets of our ports, in place.
PORT_SOCKET_BYTES = 64 * 1024 * 1024
OVS_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33
_SYS_PIDFD_GETFD = 438


def packet_sockets(proc_net_packet: str = "/proc/net/packet") -> dict[int, tuple[int, int]]:
    """Inode -> (protocol, interface index) of every AF_PACKET socket."""
    out = {}
    with open(proc_net_packet, encoding="ascii") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if len(f) >= 9:
                out[int(f[8])] = (int(f[3], 16), int(f[4]))
    return out


def enlarge_ovs_sockets(interfaces: Sequence[str], size: int = PORT_SOCKET_BYTES) -> dict[str, int]:
    """Give ovs-vswitchd's send socket and the receive sockets of ``interfaces`` ``size`` bytes of buffer.

    Duplicates the sockets out of ovs-vswitchd with ``pidfd_getfd`` (root,
    Linux >= 5.6) and sets ``SO_SNDBUFFORCE`` / ``SO_RCVBUFFORCE``: nothing is
    restarted. Returns how many sockets were changed, per kind.
    """
    import ctypes
    import socket

    with open(OVS_PIDFILE, encoding="ascii") as fh:
        pid = int(fh.read().strip())
    ifindex = {}
    for name in interfaces:
        try:
            with open(f"/sys/class/net/{name}/ifindex", encoding="ascii") as fh:
                ifindex[int(fh.read())] = name
        except OSError:
            continue
    sockets = packet_sockets()
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    done = {"send": 0, "receive": 0}
    try:
        for entry in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{entry}")
            except OSError:
                continue
            if not target.startswith("socket:["):
                continue
            info = sockets.get(int(target[8:-1]))
            if info is None:
                continue
            proto, index = info
            if proto == 0 and index == 0:
                kind, opt = "send", _SO_SNDBUFFORCE
            elif index in ifindex:
                kind, opt = "receive", _SO_RCVBUFFORCE
            else:
                continue
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(entry), 0)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "pidfd_getfd on ovs-vswitchd")
            try:
                sock = socket.socket(fileno=fd)
                sock.setsockopt(socket.SOL_SOCKET, opt, size)
                sock.detach()
            finally:
                os.close(fd)
            done[kind] += 1
    finally:
        os.close(pidfd)
    return done


def leaf_queue_command(intf: str, packets: int, parent: str = "5:1", handle: str = "10:",
                       delay_s: float = 0.0) -> list[str]:
    """Bound the queue under an HTB class (default Mininet's 5:1): a plain FIFO of ``packets``.

    With ``delay_s`` the FIFO is netem's, holding every packet that long
    (a switch's forwarding latency, where the kernel has netem).
    """
    cmd = ["tc", "qdisc", "replace", "dev", intf, "parent", parent, "handle", handle]
    if delay_s > 0:
        return [*cmd, "netem", "delay", f"{delay_s * 1e6:.0f}us", "limit", str(packets)]
    return [*cmd, "pfifo", "limit", str(packets)]


def switch_port_queue_commands(topo: Topology, mtu: int, queue_packets: int | None = None,
                               delay_s: float = 0.0) -> list[list[str]]:
    """The queue of every switch port (root-namespace link end): :func:`queue_limits` frames, ``delay_s`` each.

    A packet crossing ``s`` switches leaves ``s`` switch ports, so it is held
    ``s · delay_s`` in all: the switch latency of a fabric profile.
    """
    limits = queue_limits(topo, mtu, queue_packets)
    return [leaf_queue_command(name, limits[name], delay_s=delay_s) for name in root_interfaces(topo)]


#: IP packets shorter than this (ACKs, the agents' clear-to-send messages)
#: leave a host before its queued data frames. A power of two: the filter
#: matches the IP total length's high bits.
HOST_CONTROL_PACKET_BYTES = 256


def host_queue_commands(intf: str, packets: int) -> list[list[str]]:
    """A host NIC's queue under Mininet's HTB class 5:1: control packets first, then data frames (FIFO of ``packets``).

    A NIC serves its transmit queues (queue pairs) in turn, packet by packet,
    so a small control message waits for at most the frame on the wire, not
    for the data the host has queued. Emulated with a second HTB whose classes
    never limit (10 Gbit/s; the shaping is 5:1's) and differ only in
    priority; a ``u32`` filter sends IP packets under
    :data:`HOST_CONTROL_PACKET_BYTES` to the first.
    """
    short = 0xFFFF & ~(HOST_CONTROL_PACKET_BYTES - 1)  # total length & mask == 0 <=> shorter than the constant
    return [
        ["tc", "qdisc", "replace", "dev", intf, "parent", "5:1", "handle", "10:", "htb", "default", "2"],
        ["tc", "class", "add", "dev", intf, "parent", "10:", "classid", "10:1", "htb", "rate", "10gbit",
         "burst", "1mb", "cburst", "1mb", "prio", "0"],
        ["tc", "class", "add", "dev", intf, "parent", "10:", "classid", "10:2", "htb", "rate", "10gbit",
         "burst", "1mb", "cburst", "1mb", "prio", "1"],
        leaf_queue_command(intf, packets, parent="10:1", handle="11:"),
        leaf_queue_command(intf, packets, parent="10:2", handle="12:"),
        ["tc", "filter", "add", "dev", intf, "parent", "10:", "protocol", "ip", "prio", "1", "u32",
         "match", "u16", "0x0000", f"0x{short:04x}", "at", "2", "flowid", "10:1"],
    ]


def tc_batch(commands: Iterable[list[str]]) -> str:
    """``tc -batch`` text for ``tc`` argument lists (one process instead of one per command)."""
    return "".join(" ".join(cmd[1:]) + "\n" for cmd in commands)


#: Linux's own minimum retransmission timeout; a dilated network's queues can hold longer than it.
KERNEL_RTO_MIN_MS = 200


def tcp_rto_min_ms(rate_mbps: float, queue_bytes: int = DEFAULT_QUEUE_BYTES) -> int:
    """The hosts' minimum TCP retransmission timeout: the kernel's 200 ms plus the time to drain one full queue.

    The kernel's timers are not dilated: at 5 Mbit/s one 9000-byte frame
    takes 14 ms per link, so a window of frames queued behind each other
    outlasted the 200 ms minimum, TCP resent data nobody had lost and fell
    back to slow start (hdrm on 64 hosts at 5 Mbit/s: 120 retransmissions in
    three repetitions and no qdisc drop; with this minimum, none). Real
    losses show as qdisc drops and are repaired by fast retransmit.
    """
    return KERNEL_RTO_MIN_MS + math.ceil(queue_bytes * 8 / (rate_mbps * 1e3))


def host_setup_commands(topo: Topology, host: str, datapath: str, mtu: int = DEFAULT_MTU,
                        queue_packets: int | None = None,
                        tsq_bytes: int = DEFAULT_HOST_TSQ_BYTES) -> list[list[str]]:
    """Commands run inside ``host`` after the links are up (argument lists)."""
    intf = host_intf(host)
    # tcp_early_retrans=0 turns tail loss probes off: under time dilation a
    # 32000-byte frame takes 25.6 ms at 10 Mbit/s, so the probe timer (about
    # two round trips) fired while the tail was still queued and resent whole
    # frames nobody had lost (5 per HDRM run, each costing a frame time on
    # the link). Loss is still repaired by fast retransmit and the RTO.
    cmds = [
        ["ip", "link", "set", "dev", intf, "mtu", str(mtu)],
        ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
         "net.ipv4.tcp_slow_start_after_idle=0", f"net.ipv4.tcp_limit_output_bytes={tsq_bytes}",
         "net.ipv4.tcp_early_retrans=0"],
        ["ip", "route", "change", HOST_SUBNET, "dev", intf, "proto", "kernel", "scope", "link",
         "src", topo.host(host).ip, "rto_min", f"{tcp_rto_min_ms(topo.host_link(host).bw_mbps)}ms"],
    ]
    if datapath == "user":
        # Userspace OVS does not complete checksums or segment TSO frames:
        # without this, pings work but TCP carries nothing.
        cmds.append(["ethtool", "-K", intf, "tx", "off"])
    return cmds


def static_arp_batch(topo: Topology, host: str) -> str:
    """An ``ip -batch`` script giving ``host`` a permanent ARP entry for every other host."""
    intf = host_intf(host)
    return "".join(f"neigh replace {h.ip} lladdr {h.mac} dev {intf} nud permanent\n"
                   for h in topo.hosts if h.name != host)


def static_flow_files(topo: Topology, policy: str, seed: int = 0) -> dict[str, str]:
    """Per bridge, the ``ovs-ofctl add-flows`` file installing ``policy`` without a controller."""
    table = routing.flow_table(topo, policy, seed=seed)
    return {bridge_name(sw): "".join(entry.ofctl() + "\n" for entry in entries)
            for sw, entries in table.items()}


def tc_rates(runner: Runner, intf: str, netns_pid: int | None = None) -> list[float]:
    """The HTB class rates (Mbit/s) on ``intf``, read back with ``tc``."""
    cmd = ["tc", "class", "show", "dev", intf]
    if netns_pid is not None:
        cmd = ["mnexec", "-a", str(netns_pid), *cmd]
    res = runner(cmd)
    return parse_htb_rates(res.stdout)


def parse_htb_rates(text: str) -> list[float]:
    """Rates in Mbit/s of the shaping classes (Mininet's root HTB, handle 5:) in ``tc class show`` output.

    A host's inner priority classes (:func:`host_queue_commands`) never limit and are left out.
    """
    units = {"bit": 1e-6, "Kbit": 1e-3, "Mbit": 1.0, "Gbit": 1e3}
    rates = []
    for line in text.splitlines():
        words = line.split()
        if (len(words) >= 3 and words[0] == "class" and words[1] == "htb" and words[2].startswith("5:")
                and "rate" in words):
            raw = words[words.index("rate") + 1]
            for unit, scale in sorted(units.items(), key=lambda kv: -len(kv[0])):
                if raw.endswith(unit):
                    rates.append(float(raw[: -len(unit)]) * scale)
                    break
    return rates


class NetworkLock:
    """One emulated network at a time on a machine: two on two cores would measure each other.

    ``acquire`` waits for the network that is up, at most ``EF_NET_LOCK_WAIT``
    seconds (default 900), then raises :class:`UserError`. The kernel drops the
    lock when its holder dies, even by SIGKILL. Also a context manager.
    """

    def __init__(self) -> None:
        self.fd: int | None = None

    def __enter__(self) -> NetworkLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        os.makedirs(state_root(), exist_ok=True)
        fd = os.open(os.path.join(state_root(), "network.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        wait_s = float(os.environ.get("EF_NET_LOCK_WAIT", "900"))
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.fd = fd
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise UserError(f"another emulated network has been up for more than {wait_s:g} s on this "
                                    "machine; wait for it, or stop it (`emu clean --force`)") from None
                if not told:
                    log.warning("another emulated network is up on this machine: waiting for it to finish")
                    told = True
                time.sleep(0.5)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class EmulatedNetwork:
    """A live Mininet network built from a topology model.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with EmulatedNetwork(topo, routing="shortest") as en:
            en.host("h1").cmd("ping -c1", topo.host("h2").ip)

    Arguments:
        topo: the model.
        controller: ``(ip, port)`` of a running OpenFlow controller, or None to
            install ``routing``'s entries statically.
        routing: policy name for the static entries (ignored with a controller).
        seed: ECMP seed for the static entries.
        datapath: ``auto``, ``user`` or ``kernel``.
        label: names the run-state directory.
        mtu: of every interface (default :data:`DEFAULT_MTU`).
        queue_packets: the FIFO depth of every link end (default: :data:`DEFAULT_QUEUE_BYTES` in frames).
        tsq_bytes: per-flow host queue bound (default :data:`DEFAULT_HOST_TSQ_BYTES`).
        switch_delay_s: what every switch port holds each packet (netem; the kernel must have it).
    """

    def __init__(self, topo: Topology, *, controller: tuple[str, int] | None = None,
                 routing: str = "shortest", seed: int = 0, datapath: str = "auto",
                 label: str = "net", mtu: int = DEFAULT_MTU, queue_packets: int | None = None,
                 tsq_bytes: int = DEFAULT_HOST_TSQ_BYTES, switch_delay_s: float = 0.0, runner: Runner = run):
        self.topo = topo
        self.controller = controller
        self.routing = routing
        self.seed = seed
        self.requested_datapath = datapath
        self.datapath = ""
        self.label = label
        self.mtu = mtu
        self.queue_packets = queue_packets or queue_packets_for(mtu)
        self.tsq_bytes = tsq_bytes
        self.switch_delay_s = switch_delay_s
        self.runner = runner
        self.net: Any = None
        self.state: RunState | None = None
        self.bringup_s: float | None = None
        self._lock: NetworkLock | None = None
        self.socket_buffers: dict[str, int] = {}

    # ------------------------------------------------------------- lifecycle
    def __enter__(self) -> EmulatedNetwork:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check(self) -> None:
        """Every precondition, before anything is created."""
        require_root()
        require_tools(["mnexec", "ovs-vsctl", "ovs-ofctl", "tc", "ethtool", "ip"])
        require_ovs(self.runner)
        if self.controller is None:
            routing.check_policy(self.topo, self.routing)
        if self.switch_delay_s > 0 and not netem_available(self.runner):
            raise UserError("network: switch latency on the links needs the kernel's netem qdisc, which this "
                            "kernel lacks (the agents add the latency instead where it is missing)")
        self.datapath = choose_datapath(self.requested_datapath)

    def _check_no_leftovers(self) -> None:
        """Remove what killed runs left (we hold the network lock, so no live network owns it)."""
        from emulator.cleanup import clean

        done = [line for line in clean(runner=self.runner, network_lock_held=True) if not line.startswith(
            ("nothing", "left run"))]
        if done:
            log.warning("removed leftovers of a killed run: %s", "; ".join(done))
        busy = [b for b in map(bridge_name, (s.name for s in self.topo.switches)) if self._bridge_exists(b)]
        if busy:
            raise UserError(f"bridge {busy[0]} still exists after cleaning up: run `emu clean --force`")

    def _bridge_exists(self, name: str) -> bool:
        return self.runner(["ovs-vsctl", "--timeout=5", "br-exists", name]).returncode == 0

    def _acquire_lock(self) -> None:
        self._lock = NetworkLock()
        self._lock.acquire()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def start(self) -> None:
        self.check()
        self._acquire_lock()
        try:
            self._check_no_leftovers()
        except BaseException:
            self._release_lock()
            raise
        t0 = time.monotonic()
        self.state = RunState.create(self.label)
        try:
            self._build()
            self._configure_hosts()
            if self.datapath == "user":
                self._enlarge_datapath_sockets()
            if self.controller is None:
                self._install_static_flows()
        except BaseException:
            self.stop()
            raise
        self.bringup_s = time.monotonic() - t0
        log.info("network %s up in %.1f s (%s datapath)", self.topo.spec, self.bringup_s, self.datapath)

    def _build(self) -> None:
        from functools import partial

        from mininet.link import TCLink
        from mininet.log import lg, setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch, RemoteController

        setLogLevel(os.environ.get("EF_MININET_LOG", "output"))
        lg.addFilter(_quiet_htb_quantum)
        switch_cls = partial(OVSSwitch, datapath=self.datapath, protocols="OpenFlow13", failMode="secure",
                             reconnectms=1000)
        net = Mininet(topo=None, switch=switch_cls, link=TCLink, controller=None, build=False,
                      autoSetMacs=False, autoStaticArp=False, waitConnected=False)
        self.net = net
        assert self.state is not None
        for h in self.topo.hosts:
            node = net.addHost(h.name, ip=f"{h.ip}/{HOST_SUBNET.split('/')[1]}", mac=h.mac)
            self.state.record_process("host", node.pid, node=h.name, netns=proc_netns(node.pid))
        for s in self.topo.switches:
            net.addSwitch(bridge_name(s.name), dpid=f"{s.dpid:016x}")
        for lk in self.topo.links:
            if lk.kind == "host":
                net.addLink(lk.a, bridge_name(lk.b), port1=0, port2=lk.b_port,
                            intfName1=host_intf(lk.a), intfName2=switch_intf(lk.b, lk.b_port),
                            addr1=self.topo.host(lk.a).mac, bw=lk.bw_mbps)
            else:
                net.addLink(bridge_name(lk.a), bridge_name(lk.b), port1=lk.a_port, port2=lk.b_port,
                            intfName1=switch_intf(lk.a, lk.a_port), intfName2=switch_intf(lk.b, lk.b_port),
                            bw=lk.bw_mbps)
        if self.controller is not None:
            ip, port = self.controller
            net.addController(RemoteController("c0", ip=ip, port=port))
        net.build()
        net.start()

    def _configure_hosts(self) -> None:
        assert self.state is not None
        for h in self.topo.hosts:
            node = self.host(h.name)
            for cmd in host_setup_commands(self.topo, h.name, self.datapath, self.mtu, self.queue_packets,
                                           self.tsq_bytes):
                self._host_run(node, cmd)
            path = os.path.join(self.state.path, f"queues-{h.name}.batch")  # one tc process, not seven
            intf = host_intf(h.name)
            with open(path, "w", encoding="ascii") as fh:
                fh.write(tc_batch([shaping_class_command(intf, self.topo.host_link(h.name).bw_mbps),
                                   *host_queue_commands(intf, self.queue_packets or queue_packets_for(self.mtu))]))
            self._host_run(node, ["tc", "-batch", path])
            path = os.path.join(self.state.path, f"arp-{h.name}")
            with open(path, "w", encoding="ascii") as fh:
                fh.write(static_arp_batch(self.topo, h.name))
            self._host_run(node, ["ip", "-batch", path])
        # Root-namespace ends of the links: the MTU, and no IPv6 chatter into the fabric.
        names = root_interfaces(self.topo)
        batch = "".join(f"link set dev {n} mtu {self.mtu}\n" for n in names)
        path = os.path.join(self.state.path, "mtu.batch")
        with open(path, "w", encoding="ascii") as fh:
            fh.write(batch)
        res = self.runner(["ip", "-batch", path])
        if res.returncode != 0:
            raise UserError(f"network: cannot set MTU {self.mtu}: {res.stderr.strip()[:200]}")
        path = os.path.join(self.state.path, "queues.batch")
        with open(path, "w", encoding="ascii") as fh:
            shaping = [shaping_class_command(n, rate) for n, rate in root_interface_rates(self.topo).items()]
            fh.write(tc_batch([*shaping, *switch_port_queue_commands(self.topo, self.mtu, self.queue_packets,
                                                                     self.switch_delay_s)]))
        res = self.runner(["tc", "-batch", path])
        if res.returncode != 0:
            raise UserError(f"network: cannot set queue limits: {res.stderr.strip()[:200]}")
        cmd = ["ovs-vsctl", "--timeout=20"]
        for n in names:
            cmd += ["--", "set", "Interface", n, f"mtu_request={self.mtu}"]
        self.runner(cmd)
        settings = [f"net.ipv6.conf.{n}.disable_ipv6=1" for n in names]
        for i in range(0, len(settings), 200):
            self.runner(["sysctl", "-qw", *settings[i:i + 200]])

    def _enlarge_datapath_sockets(self) -> None:
        """See :data:`PORT_SOCKET_BYTES`. The send socket exists once ovs-vswitchd has sent a packet:
        a packet-out of a frame nobody listens to (EtherType 0x88b5, local experimental) makes sure."""
        first = self.topo.hosts[0]
        frame = first.mac.replace(":", "") + "020000000000" + "88b5" + "00" * 46
        self.runner(["ovs-ofctl", "-O", "OpenFlow13", "packet-out", bridge_name(first.switch),
                     f"in_port=controller,packet={frame},actions=output:{first.switch_port}"])
        names = root_interfaces(self.topo)
        try:
            self.socket_buffers = enlarge_ovs_sockets(names)
        except OSError as exc:
            self.socket_buffers = {}
            log.warning("could not enlarge Open vSwitch's socket buffers (%s): expect silent drops under load", exc)
        if not self.socket_buffers.get("send"):
            log.warning("Open vSwitch's send socket was not found: expect silent drops under load")

    def _host_run(self, node: Any, cmd: Sequence[str]) -> str:
        out = node.cmd(shlex.join(cmd) + "; echo __rc=$?")
        body, _, rc = out.rpartition("__rc=")
        if rc.strip() != "0":
            raise UserError(f"host {node.name}: `{shlex.join(cmd)}` failed: {body.strip()[-200:]}")
        return body

    def _install_static_flows(self) -> None:
        assert self.state is not None
        for bridge, text in static_flow_files(self.topo, self.routing, self.seed).items():
            path = os.path.join(self.state.path, f"flows-{bridge}")
            with open(path, "w", encoding="ascii") as fh:
                fh.write(text)
            res = self.runner(["ovs-ofctl", "-O", "OpenFlow13", "add-flows", bridge, path])
            if res.returncode != 0:
                raise RuntimeError(f"ovs-ofctl add-flows {bridge} failed: {res.stderr.strip()}")

    def stop(self) -> None:
        """Tear everything down; safe to call twice and after a failed start."""
        net, self.net = self.net, None
        if net is not None:
            try:
                net.stop()
            except Exception as exc:  # keep tearing down what remains
                log.warning("mininet stop: %s", exc)
        if self.state is not None:
            kill_recorded(self.state)
            remove_our_bridges(self.runner, [bridge_name(s.name) for s in self.topo.switches])
            self.state.remove()
            self.state = None
        self._release_lock()

    # -------------------------------------------------------------- accessors
    def host(self, name: str) -> Any:
        self.topo.host(name)
        return self.net.get(name)

    def switch(self, name: str) -> Any:
        self.topo.switch(name)
        return self.net.get(bridge_name(name))

    def hosts(self) -> list[Any]:
        return [self.net.get(h.name) for h in self.topo.hosts]

    def for_each_host(self, fn: Callable[[Any], None]) -> None:
        for node in self.hosts():
            fn(node)


def remove_our_bridges(runner: Runner, names: Sequence[str]) -> None:
    """Delete the named bridges (ours) and the root-namespace veths that carried their ports."""
    if names:
        cmd = ["ovs-vsctl", "--timeout=20"]
        for name in names:
            cmd += ["--", "--if-exists", "del-br", name]
        runner(cmd)
    for name in names:
        for intf in links_with_prefix(runner, f"{name}-eth"):
            runner(["ip", "link", "del", intf])


def links_with_prefix(runner: Runner, prefix: str) -> list[str]:
    res = runner(["ip", "-o", "link", "show"])
    out = []
    for line in res.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@", 1)[0]
            if name.startswith(prefix):
                out.append(name)
    return out
