"""Mininet bring-up of a topology model: the edge where the model becomes packets.

:class:`EmulatedNetwork` turns a :class:`~emulator.model.topology.Topology` into a
Mininet network of Open vSwitch switches and shaped links, and tears it down.

Naming (all names in the root namespace carry the project prefix ``ef`` so
that ``emu clean`` finds exactly ours):

* model switch ``sI`` -> OVS bridge / Mininet switch ``efsI``, ports
  ``efsI-ethP`` with OpenFlow port number P (the model's port);
* model host ``hI`` -> Mininet host ``hI`` whose one interface is
  ``efhI-eth0``

(:mod:`emulator.base.naming` owns the scheme).

What bring-up does, in order: checks root and Open vSwitch, picks the
datapath (kernel where the openvswitch module exists, userspace otherwise),
creates hosts (recording their pids in the run state), switches and plain
links (Mininet ``Link``: the shaping comes later, in batches), starts the
switches (OpenFlow 1.3, fail-mode secure, the model's dpid; all in one
``ovs-vsctl``), then configures every host in one round trip to its shell:
TX checksum offload off on the userspace datapath (otherwise TCP carries
nothing), IPv6 off, ``tcp_slow_start_after_idle`` off, static ARP for every
other host (:mod:`emulator.emulation.network.host_commands`), the shaping and queues of
its link end (:mod:`emulator.emulation.network.tc_commands`, one ``tc -batch``); then
the root namespace's link ends in one more. On the userspace datapath it
enlarges Open vSwitch's packet socket buffers
(:mod:`emulator.emulation.network.ovs_sockets`). With no controller it installs the
routing policy's flow entries with ``ovs-ofctl``, on every bridge at once.
Teardown deletes the bridges in one ``ovs-vsctl`` and their links in one
``ip -batch``. What each part cost, at up to 256 hosts: ``docs/fidelity.md``
(2026-12-02, evening).

One network at a time per machine (:class:`~emulator.emulation.machine.network_lock.NetworkLock`);
before building, what killed runs left is removed (:func:`emulator.emulation.machine.cleanup.clean`).
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from emulator.base.errors import UserError
from emulator.base.naming import HOST_SUBNET, bridge_name, host_intf, switch_intf
from emulator.emulation.machine.cleanup import clean, remove_our_bridges
from emulator.emulation.machine.network_lock import NetworkLock
from emulator.emulation.machine.started import StartedRecord, kill_recorded, proc_netns
from emulator.emulation.machine.system import (
    Runner,
    choose_datapath,
    netem_available,
    require_ovs,
    require_root,
    require_tools,
    run,
)
from emulator.emulation.network.host_commands import (
    DEFAULT_HOST_TSQ_BYTES,
    failed_command,
    host_script,
    host_setup_commands,
    static_arp_batch,
    static_flow_files,
)
from emulator.emulation.network.ovs_sockets import enlarge_ovs_sockets
from emulator.emulation.network.tc_commands import (
    host_queue_commands,
    queue_packets_for,
    root_interface_rates,
    root_interfaces,
    shaping_tree_commands,
    switch_port_queue_commands,
    tc_batch,
)
from emulator.model import routing
from emulator.model.topology import DEFAULT_MTU, Topology

log = logging.getLogger(__name__)

#: How long :func:`warn_unless_listening` waits for the controller's port.
CONTROLLER_PROBE_S = 2.0


def warn_unless_listening(ip: str, port: int, connect: Callable[..., Any] = socket.create_connection) -> bool:
    """Whether the OpenFlow controller at ``ip:port`` accepts a connection; a warning when it does not.

    Mininet's ``RemoteController`` probes with ``telnet`` in a shell and reads
    the answer as text: when the controller's OpenFlow hello came back first,
    the bytes were not UTF-8 and bring-up failed (``UnicodeDecodeError``, a
    clean-clone ``make test`` on 2026-12-08). A socket opened and closed here
    asks the same without reading anything.
    """
    try:
        connect((ip, port), timeout=CONTROLLER_PROBE_S).close()
        return True
    except OSError as exc:
        log.warning("no OpenFlow controller answers at %s:%d yet (%s); the switches keep trying", ip, port, exc)
        return False


def host_address(ip: str) -> str:
    """A host's address with the prefix length of the hosts' one subnet (Mininet's ``ip`` argument)."""
    return f"{ip}/{HOST_SUBNET.split('/')[1]}"

#: ``ovs-ofctl add-flows`` processes at once (one per bridge, up to this many).
FLOW_INSTALL_PARALLEL = 64


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
        queue_packets: the FIFO depth of every link end (default:
        :data:`emulator.emulation.network.tc_commands.DEFAULT_QUEUE_BYTES`
            in frames).
        tsq_bytes: per-flow host queue bound (default
        :data:`emulator.emulation.network.host_commands.DEFAULT_HOST_TSQ_BYTES`).
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
        self.state: StartedRecord | None = None
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
        self.state = StartedRecord.create(self.label)
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
        # Mininet is imported here, not at the top: it is slow to import and only bring-up needs it.
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch, RemoteController

        setLogLevel(os.environ.get("EF_MININET_LOG", "output"))
        # batch: every bridge and port in one ovs-vsctl at start (Mininet's batchStartup), not one per switch
        # (a fat-tree k=8's 80 switches: 44.4 s up -> 22.7 s)
        switch_cls = partial(OVSSwitch, datapath=self.datapath, protocols="OpenFlow13", failMode="secure",
                             reconnectms=1000, batch=True)
        net = Mininet(topo=None, switch=switch_cls, link=Link, controller=None, build=False,
                      autoSetMacs=False, autoStaticArp=False, waitConnected=False)
        self.net = net
        assert self.state is not None
        for h in self.topo.hosts:
            node = net.addHost(h.name, ip=host_address(h.ip), mac=h.mac)
            self.state.record_process("host", node.pid, node=h.name, netns=proc_netns(node.pid))
        for s in self.topo.switches:
            net.addSwitch(bridge_name(s.name), dpid=f"{s.dpid:016x}")
        self._add_links(net)
        if self.controller is not None:
            ip, port = self.controller

            class ProbedController(RemoteController):  # type: ignore[misc, valid-type]
                def checkListening(self) -> None:
                    warn_unless_listening(self.ip, self.port)

            net.addController(ProbedController("c0", ip=ip, port=port))
        net.build()
        net.start()

    def _add_links(self, net: Any) -> None:
        """Every link of the model, its ends named and numbered as the model's ports."""
        for lk in self.topo.links:
            if lk.kind == "host":
                net.addLink(lk.a, bridge_name(lk.b), port1=0, port2=lk.b_port,
                            intfName1=host_intf(lk.a), intfName2=switch_intf(lk.b, lk.b_port),
                            addr1=self.topo.host(lk.a).mac)
            else:
                net.addLink(bridge_name(lk.a), bridge_name(lk.b), port1=lk.a_port, port2=lk.b_port,
                            intfName1=switch_intf(lk.a, lk.a_port), intfName2=switch_intf(lk.b, lk.b_port))

    def _write_batch(self, name: str, text: str) -> str:
        """Write an input file of ``tc -batch``, ``ip -batch`` or ``ovs-ofctl add-flows`` into the run-state
        directory (kept there until the network stops); return its path."""
        assert self.state is not None
        path = os.path.join(self.state.path, name)
        with open(path, "w", encoding="ascii") as fh:
            fh.write(text)
        return path

    def _configure_hosts(self) -> None:
        """Every host's set-up (:meth:`_configure_host`); then the root-namespace link ends."""
        for h in self.topo.hosts:
            self._configure_host(h.name)
        self._configure_root_interfaces()

    def _configure_host(self, name: str) -> None:
        """A host's set-up in one round trip to its shell (:meth:`_host_commands`)."""
        self._host_run(self.host(name), self._host_commands(name, self._file_batch))

    def _host_commands(self, name: str, batch: Callable[[str, str, str], list[list[str]]]) -> list[list[str]]:
        """A host's set-up, its shaping and queues and its static ARP; ``batch(tool, file name, text)`` gives the
        commands that feed a batch to ``tool``."""
        intf = host_intf(name)
        queues = tc_batch([*shaping_tree_commands(intf, self.topo.host_link(name).bw_mbps),
                           *host_queue_commands(intf, self.queue_packets)])
        return [*host_setup_commands(self.topo, name, self.datapath, self.mtu, self.tsq_bytes),
                *batch("tc", f"queues-{name}.batch", queues),
                *batch("ip", f"arp-{name}", static_arp_batch(self.topo, name))]

    def _configure_root_interfaces(self) -> None:
        self._configure_interfaces(self.runner, root_interface_rates(self.topo), self._file_batch)

    def _file_batch(self, tool: str, name: str, text: str) -> list[list[str]]:
        """``tool -batch`` of ``text``, from a file of the run-state directory."""
        return [[tool, "-batch", self._write_batch(name, text)]]

    def _configure_interfaces(self, runner: Runner, rates: dict[str, float],
                              batch: Callable[[str, str, str], list[list[str]]]) -> None:
        """Root-namespace link ends (``rates``: name -> Mbit/s): the MTU, shaping and queues, and no IPv6 chatter
        into the fabric; ``batch(tool, file name, text)`` gives the commands that feed a batch to ``tool``."""
        names = list(rates)
        for cmd in batch("ip", "mtu.batch", "".join(f"link set dev {n} mtu {self.mtu}\n" for n in names)):
            res = runner(cmd)
            if res.returncode != 0:
                raise UserError(f"network: cannot set MTU {self.mtu}: {res.stderr.strip()[:200]}")
        shaping = [cmd for n, rate in rates.items() for cmd in shaping_tree_commands(n, rate)]
        queues = [cmd for cmd in switch_port_queue_commands(self.topo, self.mtu, self.queue_packets,
                                                            self.switch_delay_s) if cmd[cmd.index("dev") + 1] in rates]
        for cmd in batch("tc", "queues.batch", tc_batch([*shaping, *queues])):
            res = runner(cmd)
            if res.returncode != 0:
                raise UserError(f"network: cannot set queue limits: {res.stderr.strip()[:200]}")
        cmd = ["ovs-vsctl", "--timeout=20"]
        for n in names:
            cmd += ["--", "set", "Interface", n, f"mtu_request={self.mtu}"]
        runner(cmd)
        settings = [f"net.ipv6.conf.{n}.disable_ipv6=1" for n in names]
        for i in range(0, len(settings), 200):
            runner(["sysctl", "-qw", *settings[i:i + 200]])

    def _enlarge_datapath_sockets(self) -> None:
        """See :mod:`emulator.emulation.network.ovs_sockets`. The send socket exists once ovs-vswitchd has sent a
        packet:
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

    @staticmethod
    def _host_run(node: Any, commands: Sequence[Sequence[str]]) -> None:
        """Run ``commands`` in ``node``'s shell (:func:`host_script`); the first that fails is named."""
        out = node.cmd(shlex.join(host_script(commands)) + "; echo __rc=$?")
        body, _, rc = out.rpartition("__rc=")
        if rc.strip() != "0":
            tail = [line for line in body.strip().splitlines() if not line.startswith("+ ")][-3:]
            raise UserError(f"host {node.name}: `{failed_command(body)}` failed: {' '.join(tail)[-200:]}")

    def _install_static_flows(self) -> None:
        """Every bridge's entries from its ``ovs-ofctl add-flows`` file, all bridges at once.

        ovs-vswitchd handles a bounded number of OpenFlow messages per
        connection in each pass of its main loop, and on the userspace datapath
        that loop also polls every port: one bridge after another, a BiGraph
        16/16/8 (32 bridges of 1412 entries, 1024 ports) took 231 s; in parallel
        each pass serves every bridge's connection.
        """
        files = {bridge: self._write_batch(f"flows-{bridge}", text)
                 for bridge, text in static_flow_files(self.topo, self.routing, self.seed).items()}
        with ThreadPoolExecutor(max_workers=min(len(files), FLOW_INSTALL_PARALLEL) or 1) as pool:
            results = dict(zip(files, pool.map(
                lambda bridge: self.runner(["ovs-ofctl", "-O", "OpenFlow13", "add-flows", bridge, files[bridge]]),
                files), strict=True))
        for bridge, res in results.items():
            if res.returncode != 0:
                raise RuntimeError(f"ovs-ofctl add-flows {bridge} failed: {res.stderr.strip()}")

    def stop(self) -> None:
        """Tear everything down; safe to call twice and after a failed start."""
        net, self.net = self.net, None
        if net is not None or self.state is not None:
            # Bridges and links first, in two commands, once: Mininet would delete each link end through a
            # shell (1024 round trips, 14 s, for a 256-host BiGraph) and then every bridge again.
            remove_our_bridges(self.runner, [bridge_name(s.name) for s in self.topo.switches])
        if net is not None:
            net.links = []
            try:
                net.stop()
            except Exception as exc:  # keep tearing down what remains
                log.warning("mininet stop: %s", exc)
            self._end_controller_shells(net)
        if self.state is not None:
            kill_recorded(self.state)
            self.state.remove()
            self.state = None
        self._release_lock()

    @staticmethod
    def _end_controller_shells(net: Any) -> None:
        """End the shell of every Mininet controller node, which ``Mininet.stop`` leaves running.

        A ``RemoteController`` is a Mininet node with a bash shell on a pty in
        the root namespace, and its ``stop`` does nothing: every network left
        one bash and two descriptors in the process that built it (the soak
        test counted one more per bring-up), and a zombie under a subreaper
        once that process exited. ``Node.terminate`` hangs the shell up,
        closes its pty and reaps it.
        """
        for node in getattr(net, "controllers", []):
            try:
                node.terminate()
            except Exception as exc:  # keep tearing down what remains
                log.warning("mininet controller %s: %s", getattr(node, "name", "?"), exc)

    # -------------------------------------------------------------- accessors
    def host(self, name: str) -> Any:
        self.topo.host(name)
        return self.net.get(name)

    def set_sysctls(self, hosts: Sequence[str], settings: Sequence[tuple[str, str]]) -> None:
        """``sysctl -w`` of ``settings`` (name, value) in each of ``hosts``; :class:`UserError` naming the first
        that fails."""
        for name in hosts:
            self._host_run(self.host(name), [["sysctl", "-qw", *(f"{k}={v}" for k, v in settings)]])

    def switch(self, name: str) -> Any:
        self.topo.switch(name)
        return self.net.get(bridge_name(name))

    def hosts(self) -> list[Any]:
        return [self.net.get(h.name) for h in self.topo.hosts]

    def for_each_host(self, fn: Callable[[Any], None]) -> None:
        for node in self.hosts():
            fn(node)
