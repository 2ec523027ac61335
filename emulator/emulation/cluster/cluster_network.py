"""One emulated network over several servers, through Mininet Cluster Edition (``mininet/examples/cluster.py``).

:class:`ClusterNetwork` is :class:`~emulator.emulation.network.emulated_network.EmulatedNetwork`
with its nodes placed on a cluster's servers
(:func:`emulator.model.cluster_placement.place`). What differs from one machine:

* **Nodes.** Every node of the head is a local Mininet node; every other
  server's is a Cluster Edition remote node (its shell over ssh, its pid on
  its own server). Cluster Edition builds ssh command lines with a hard-wired
  ``sudo -E`` and ssh's defaults; our node classes build them with
  :func:`emulator.emulation.cluster.remote_shell.ssh_argv` instead (the cluster file's
  key, its own known hosts).
* **Links.** A link between two nodes of one server is a veth, as on one
  machine. A link between servers is a pair of kernel VXLAN devices (GRE,
  which Cluster Edition uses, is missing from kernels like this one), one per
  server, named like the veth end they stand for (``efsI-ethP``), so they are
  shaped, queued and cleaned like every other switch port. Each link has its
  own VNI (one network at a time on a cluster, under the cluster lock), the
  fabric's MTU, and no GRO (the userspace datapath must see frames as sent).
* **Root-namespace commands** (MTU, shaping and queues, socket buffers) run
  on the server that holds the interface, over ssh for all but the head. A
  batch goes to a remote ``tc``/``ip`` inline on its command line, in pieces
  a command line holds (:func:`inline_batches`), since the head's files are
  not on the other servers.
* **The lock** is the cluster's: the head's own
  :class:`~emulator.emulation.machine.network_lock.NetworkLock` and one held on every
  other server for as long as the network is up
  (:mod:`emulator.emulation.cluster.cluster_lock`).
* **Routes** come from the controller only, which listens on the head's
  underlay address.

Teardown deletes each server's bridges and links on that server, ends the
ssh sessions of the remote shells (which ends the shells), and runs the
project's own ``emu clean`` on every other server (never Mininet's ``mn -c``
or Cluster Edition's ``ClusterCleanup``).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from emulator.base.errors import UserError
from emulator.base.naming import bridge_name, switch_intf
from emulator.emulation.cluster import remote_shell
from emulator.emulation.cluster.cluster_lock import ClusterLock
from emulator.emulation.machine.cleanup import remove_our_bridges
from emulator.emulation.machine.started import proc_netns
from emulator.emulation.machine.system import Result, Runner, run
from emulator.emulation.network.emulated_network import EmulatedNetwork, host_address
from emulator.emulation.network.host_commands import failed_command, host_script
from emulator.emulation.network.tc_commands import root_interface_rates
from emulator.model.cluster_placement import Placement
from emulator.model.topology import Topology
from emulator.runs.cluster_file import Cluster, Server

log = logging.getLogger(__name__)

#: The VXLAN UDP port (IANA's).
VXLAN_PORT = 4789
#: Where a server's ovs-vswitchd writes its pid (Debian's).
VSWITCHD_PIDFILE = "/run/openvswitch/ovs-vswitchd.pid"
#: Seconds a server's ovs-vswitchd has to answer on its control socket.
VSWITCHD_ANSWER_S = 5
#: Seconds a server has to answer a health check.
HEALTH_TIMEOUT_S = 10.0
#: A broadcast frame of a local experimental EtherType (0x88b5) that no host takes up.
NOBODY_FRAME = "ff" * 6 + "020000000000" + "88b5" + "00" * 46
#: Bytes of one inline batch on a remote command line (Linux takes 128 KiB in one argument; quoting grows it).
INLINE_BATCH_BYTES = 48_000


def inline_batches(tool: Sequence[str], text: str, limit: int = INLINE_BATCH_BYTES) -> list[list[str]]:
    """Commands feeding ``text`` to ``tool -batch -`` from their own command line, in pieces of whole lines
    of at most ``limit`` bytes: ``sh -c 'printf %s "$1" | TOOL -batch -' sh PIECE``."""
    pieces: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        if current and len(current) + len(line) > limit:
            pieces.append(current)
            current = ""
        current += line
    if current:
        pieces.append(current)
    script = f'printf %s "$1" | {shlex.join(tool)} -batch -'
    return [["sh", "-c", script, "sh", piece] for piece in pieces]


def interfaces_by_server(topo: Topology, placement: Placement) -> dict[str, dict[str, float]]:
    """Every root-namespace link end with its rate, grouped by the server of the switch it belongs to."""
    owner = {switch_intf(lk.b, lk.b_port): lk.b for lk in topo.links}
    owner.update((switch_intf(lk.a, lk.a_port), lk.a) for lk in topo.links if lk.kind != "host")
    grouped: dict[str, dict[str, float]] = {s: {} for s in placement.servers}
    for name, rate in root_interface_rates(topo).items():
        grouped[placement.of[owner[name]]][name] = rate
    return grouped


class TunnelPlan:
    """What a cross-server link needs: each node's server, the servers' underlay addresses, the next VNI."""

    def __init__(self, cluster: Cluster, server_of: dict[str, str], mtu: int):
        self.cluster = cluster
        self.server_of = server_of  # Mininet node name -> server name
        self.mtu = mtu
        self._vni = 0

    def next_vni(self) -> int:
        self._vni += 1
        return self._vni

    def underlay(self, node_name: str) -> str:
        return self.cluster.server(self.server_of[node_name]).underlay


def vxlan_command(intf: str, vni: int, local: str, remote: str, mtu: int, *, address: str | None = None,
                  netns_pid: int | None = None) -> list[str]:
    """One shell line creating VXLAN device ``intf`` (in the root namespace) towards ``remote``, up, no GRO; with
    ``address`` its MAC, with ``netns_pid`` then moved into that process's network namespace (a host's: the
    device keeps its underlay socket where it was made)."""
    script = (f"ip link del {intf} 2>/dev/null || true; "
              f"ip link add {intf} mtu {mtu} type vxlan id {vni} local {local} remote {remote} "
              f"dstport {VXLAN_PORT} nolearning; ip link set {intf} up; ethtool -K {intf} gro off >/dev/null")
    if address:
        script += f"; ip link set {intf} address {address}"
    if netns_pid is not None:
        script += f"; ip link set {intf} netns {netns_pid}"
    return ["sh", "-ec", script]


def _cluster_classes(cluster: Cluster) -> tuple[Any, Any, Any]:
    """Cluster Edition's host, switch and link classes with our ssh command lines and VXLAN tunnels."""
    # imported here: Mininet is slow to import and only bring-up needs it
    from mininet.examples.cluster import RemoteHost, RemoteLink, RemoteOVSSwitch
    from mininet.link import Link
    from mininet.node import Node

    def ssh_popen(node: Any, cmd: Any, sudo: bool = True, tt: bool = True, **params: Any) -> Any:
        """RemoteMixin._popen with our ssh command line (the cluster file's key, no ``sudo``)."""
        del sudo  # we log in as the cluster file's user; remote_shell adds sudo -n for others
        argv = cmd.split() if isinstance(cmd, str) else list(cmd)
        if node.isRemote:
            argv = remote_shell.ssh_argv(cluster.server(node.ef_server), argv, cluster.known_hosts, tty=tt)
        params.update(preexec_fn=os.setpgrp)
        return Node._popen(node, argv, **params)

    class ClusterHost(RemoteHost):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, ef_server: str = "", **kwargs: Any):
            self.ef_server = ef_server
            super().__init__(name, **kwargs)

        _popen = ssh_popen

    class ClusterSwitch(RemoteOVSSwitch):  # type: ignore[misc, valid-type]
        def __init__(self, name: str, ef_server: str = "", **kwargs: Any):
            self.ef_server = ef_server
            super().__init__(name, **kwargs)

        _popen = ssh_popen

        def isOldOVS(self) -> bool:  # noqa: N802 (Mininet's name): Debian 12's is 3.1; distutils is going
            return False

    class VxlanLink(RemoteLink):  # type: ignore[misc, valid-type]
        tunnel: Any

        def __init__(self, node1: Any, node2: Any, plan: TunnelPlan | None = None, **kwargs: Any):
            assert plan is not None
            self.plan = plan
            super().__init__(node1, node2, **kwargs)

        def makeIntfPair(self, intfname1: str, intfname2: str, addr1: str | None = None,  # noqa: N802
                         addr2: str | None = None, node1: Any = None, node2: Any = None,
                         deleteIntfs: bool = True) -> Any:  # noqa: N803 (Mininet's signature)
            node1 = self.node1 if node1 is None else node1
            node2 = self.node2 if node2 is None else node2
            if self.plan.server_of[node1.name] == self.plan.server_of[node2.name]:
                return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2, deleteIntfs=deleteIntfs)
            vni = self.plan.next_vni()
            ends = ((node1, intfname1, addr1, node2), (node2, intfname2, addr2, node1))
            for node, intf, addr, peer in ends:
                cmd = vxlan_command(intf, vni, self.plan.underlay(node.name), self.plan.underlay(peer.name),
                                    self.plan.mtu, address=addr, netns_pid=node.pid if node.inNamespace else None)
                out = node.rcmd(cmd).strip()
                if out:
                    raise UserError(f"network: VXLAN tunnel {intf} on {self.plan.server_of[node.name]}: {out[:200]}")
            self.tunnel = vni
            return None

        def stop(self) -> None:  # our teardown deletes the tunnel ends with the bridges' links, per server
            self.tunnel = None

    return ClusterHost, ClusterSwitch, VxlanLink


class ClusterNetwork(EmulatedNetwork):
    """An :class:`EmulatedNetwork` spread over ``cluster``'s servers as ``placement`` says (routes from the
    controller, which must listen where every server reaches it: the head's underlay address)."""

    def __init__(self, topo: Topology, cluster: Cluster, placement: Placement, *, runner: Runner = run,
                 **options: Any):
        super().__init__(topo, runner=runner, **options)
        self.cluster = cluster
        self.placement = placement
        self.runners = remote_shell.runners(cluster, runner)
        self.cluster_lock: ClusterLock | None = None
        self.vswitchd_pids: dict[str, str] = {}  # another server's name -> its ovs-vswitchd's pid at bring-up
        cluster.check_mtu(self.mtu, "cluster")

    # ---------------------------------------------------------------- servers
    def server_of(self, node: str) -> Server:
        """The server model node ``node`` (``hN`` / ``sN``) runs on."""
        return self.cluster.server(self.placement.of[node])

    def is_remote(self, node: str) -> bool:
        return self.placement.of[node] != self.cluster.head

    def check(self) -> None:
        super().check()
        if self.controller is None:
            raise UserError("network: a cluster network takes its routes from a controller on the head")
        for server in self.cluster.others:
            res = self.runners[server.name](["ovs-vsctl", "--timeout=5", "show"])
            if res.returncode != 0:
                raise UserError(f"cluster {self.cluster.name}: server {server.name}: Open vSwitch does not answer "
                                f"(`emu cluster check` says more): {res.stderr.strip()[:160]}")

    def _acquire_lock(self) -> None:
        super()._acquire_lock()
        try:
            self.cluster_lock = ClusterLock(self.cluster).acquire()
        except BaseException:
            super()._release_lock()
            raise

    def _release_lock(self) -> None:
        lock, self.cluster_lock = self.cluster_lock, None
        if lock is not None:
            lock.release()
        super()._release_lock()

    def _check_no_leftovers(self) -> None:
        super()._check_no_leftovers()  # also ends what a killed head left of shared connections: then ours
        for name in remote_shell.open_shared(self.cluster):
            log.warning("server %s: no shared ssh connection: each command logs in alone (slower)", name)
        for server in self.cluster.others:
            ok, lines = clean_server(self.cluster, server, self.runners[server.name])
            if not ok:
                log.warning("%s", lines[0])

    # ---------------------------------------------------------------- build
    def _build(self) -> None:
        from mininet.examples.cluster import MininetCluster
        from mininet.log import setLogLevel
        from mininet.node import RemoteController

        setLogLevel(os.environ.get("EF_MININET_LOG", "output"))
        host_cls, switch_cls, link_cls = _cluster_classes(self.cluster)
        server_of = {**{h.name: self.placement.of[h.name] for h in self.topo.hosts},
                     **{bridge_name(s.name): self.placement.of[s.name] for s in self.topo.switches}}
        plan = TunnelPlan(self.cluster, server_of, self.mtu)
        switch = partial(switch_cls, datapath=self.datapath, protocols="OpenFlow13", failMode="secure",
                         reconnectms=1000)
        net = MininetCluster(topo=None, servers=["localhost", *(s.name for s in self.cluster.others)],
                             serverIP={s.name: s.ssh for s in self.cluster.others}, user=None, precheck=False,
                             host=host_cls, switch=switch, link=partial(link_cls, plan=plan), controller=None,
                             build=False, autoSetMacs=False, autoStaticArp=False, waitConnected=False)
        self.net = net
        assert self.state is not None
        for h in self.topo.hosts:
            node = net.addHost(h.name, ip=host_address(h.ip), mac=h.mac, **self._placed(h.name))
            self._record_node(h.name, node)
        for s in self.topo.switches:
            node = net.addSwitch(bridge_name(s.name), dpid=f"{s.dpid:016x}", **self._placed(s.name))
            if self.is_remote(s.name):
                self._record_node(s.name, node)
        self._add_links(net)
        ip, port = self.controller or ("", 0)
        net.addController(RemoteController("c0", ip=ip, port=port))
        net.build()
        net.start()

    def _placed(self, node: str) -> dict[str, Any]:
        """Cluster Edition's placement arguments of model node ``node`` (the head's nodes are local)."""
        if not self.is_remote(node):
            return {"server": "localhost", "ef_server": self.cluster.head}
        server = self.server_of(node)
        return {"server": server.name, "serverIP": server.ssh, "user": server.user, "ef_server": server.name}

    def _record_node(self, name: str, node: Any) -> None:
        """A local host's shell as on one machine; a remote node's ssh client (ending it ends the remote shell)."""
        assert self.state is not None
        if self.is_remote(name):
            self.state.record_process("ssh", node.shell.pid, node=name, server=self.placement.of[name])
        else:
            self.state.record_process("host", node.pid, node=name, netns=proc_netns(node.pid))

    # ------------------------------------------------------------ configure
    def _configure_host(self, name: str) -> None:
        """A remote host's set-up in one ssh running ``mnexec -a PID`` on its server (its shell is on a
        terminal, whose lines are too short for the inline batches); a head's host as on one machine."""
        if not self.is_remote(name):
            super()._configure_host(name)
            return
        commands = self._host_commands(name, self._batch_on(self.placement.of[name]))
        res = self.runners[self.placement.of[name]](["mnexec", "-a", str(self.host(name).pid), *host_script(commands)])
        if res.returncode != 0:
            tail = [line for line in (res.stderr + res.stdout).strip().splitlines() if not line.startswith("+ ")]
            raise UserError(f"host {name} on {self.placement.of[name]}: `{failed_command(res.stderr)}` failed: "
                            f"{' '.join(tail[-3:])[-200:]}")

    def _configure_root_interfaces(self) -> None:
        """Each server's link ends, on that server."""
        for server_name, rates in interfaces_by_server(self.topo, self.placement).items():
            if rates:
                self._configure_interfaces(self.runners[server_name], rates, self._batch_on(server_name))

    def _batch_on(self, server: str) -> Callable[[str, str, str], list[list[str]]]:
        """How a batch reaches ``tool -batch`` on ``server``: a file on the head, inline on the others."""
        if server == self.cluster.head:
            return self._file_batch
        return lambda tool, name, text: inline_batches([tool], text)

    def _enlarge_datapath_sockets(self) -> None:
        """On every server: the packet-out that makes Open vSwitch's send socket, then the enlargement
        (:mod:`emulator.emulation.network.ovs_sockets`, run by the project's interpreter on that server)."""
        grouped = interfaces_by_server(self.topo, self.placement)
        for server_name, rates in grouped.items():
            if not rates:
                continue
            port = next(iter(rates))  # efsI-ethP
            bridge, number = port.split("-eth")
            runner = self.runners[server_name]
            runner(["ovs-ofctl", "-O", "OpenFlow13", "packet-out", bridge,
                    f"in_port=controller,packet={NOBODY_FRAME},actions=output:{number}"])
            res = runner([sys.executable, "-m", "emulator.emulation.network.ovs_sockets", *rates])
            if res.returncode != 0:
                log.warning("server %s: could not enlarge Open vSwitch's socket buffers (%s): expect silent drops "
                            "under load", server_name, res.stderr.strip()[-160:])
            elif server_name == self.cluster.head:
                self.socket_buffers = {k: int(v) for k, v in (w.split("=") for w in res.stdout.split())}

    def start(self) -> None:
        super().start()
        for server in self.cluster.others:
            self.vswitchd_pids[server.name] = self._vswitchd(server)[1]

    def _vswitchd(self, server: Server) -> tuple[bool, str]:
        """Whether ``server`` answers over ssh, and the pid of its ovs-vswitchd if that answers on its control socket
        ("" when none does: a killed daemon may linger as a zombie, which ``kill -0`` would take for alive)."""
        res = remote_shell.remote_runner(self.cluster, server, remote_shell.run_with_timeout(HEALTH_TIMEOUT_S))(
            ["sh", "-c", f"ovs-appctl --timeout={VSWITCHD_ANSWER_S} -t ovs-vswitchd version >/dev/null 2>&1 && "
             f"cat {VSWITCHD_PIDFILE} || true"])
        return res.returncode == 0, res.stdout.strip()

    def interface_runner(self) -> Runner:
        """A :data:`~emulator.emulation.machine.system.Runner` for commands on one root-namespace link end (``... dev
        NAME ...``: a fault's ``ip link set``): each runs on the server of the switch the interface belongs to."""
        owner = {name: server for server, rates in interfaces_by_server(self.topo, self.placement).items()
                 for name in rates}

        def runner(command: Sequence[str]) -> Result:
            words = list(command)
            server = owner[words[words.index("dev") + 1]]
            return self.runners[server](words)
        return runner

    def lost(self) -> str | None:
        """Which server this network lost since bring-up, in one line (None while all are there): one that no
        longer answers over ssh, or whose Open vSwitch is gone or restarted (its bridges with it)."""
        for server in self.cluster.others:
            answers, pid = self._vswitchd(server)
            if not answers:
                return f"server {server.name} of cluster {self.cluster.name} is lost: it does not answer over ssh"
            if pid != self.vswitchd_pids.get(server.name):
                return (f"server {server.name} of cluster {self.cluster.name} is lost: its Open vSwitch is "
                        f"{'gone' if not pid else 'restarted'} (ovs-vswitchd pid "
                        f"{self.vswitchd_pids.get(server.name) or '?'} -> {pid or 'none'})")
        return None

    def _install_static_flows(self) -> None:
        raise UserError("network: a cluster network takes its routes from a controller on the head")

    # ------------------------------------------------------------- teardown
    def stop(self) -> None:
        if self.net is not None or self.state is not None:
            for server_name, switches in self._switches_by_server().items():
                if server_name != self.cluster.head:
                    remove_our_bridges(self.runners[server_name], switches)
        super().stop()
        for server in self.cluster.others:
            ok, lines = clean_server(self.cluster, server, self.runners[server.name])
            if not ok:
                log.warning("%s", lines[0])
        remote_shell.close_shared(self.cluster)

    def _switches_by_server(self) -> dict[str, list[str]]:
        grouped: dict[str, list[str]] = {s: [] for s in self.placement.servers}
        for s in self.topo.switches:
            grouped[self.placement.of[s.name]].append(bridge_name(s.name))
        return grouped


def clean_server(cluster: Cluster, server: Server, runner: Runner | None = None,
                 force: bool = False) -> tuple[bool, list[str]]:
    """The project's own ``emu clean`` on ``server`` (over ssh): whether it ran, and its report lines."""
    runner = runner or remote_shell.remote_runner(cluster, server)
    res: Result = runner([sys.executable, "-m", "emulator", "clean", *(["--force"] if force else [])])
    if res.returncode != 0:
        return False, [f"{server.name}: emu clean failed (status {res.returncode}): {res.stderr.strip()[-160:]}"]
    return True, [f"{server.name}: {line}" for line in res.stdout.strip().splitlines()]
