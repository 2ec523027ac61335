"""The namespace servers of :mod:`tests.integration.cluster_servers`: ssh between them as the project logs in,
each its own Open vSwitch, jumbo VXLAN across the underlay, and nothing left once they are torn down."""

from __future__ import annotations

import os
import subprocess

import pytest

from emulator.base.naming import BRIDGE_RE, INTERFACE_RE
from emulator.emulation.cluster.remote_shell import ssh_argv

from .cluster_servers import NAMESPACES, NamespaceServers

pytestmark = pytest.mark.integration

VXLAN = "vxtest"
VXLAN_MTU = 9000
#: ICMP payload filling a VXLAN_MTU frame exactly (IPv4 20 + ICMP 8 bytes of headers).
PING_PAYLOAD = VXLAN_MTU - 28


def machine_bridges() -> set[str]:
    result = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True, check=True)
    return set(result.stdout.split())


def machine_interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def others_network(names: set[str]) -> set[str]:
    """What is not someone else's emulated network (who may be running one on this machine meanwhile)."""
    return {n for n in names if not (BRIDGE_RE.match(n) or INTERFACE_RE.match(n))}


def processes_in(namespaces: dict[str, int]) -> list[int]:
    """Processes in all of a server's namespaces at once (one alone may be a new namespace reusing the inode)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            mine = all(os.stat(f"/proc/{entry}/ns/{kind}").st_ino == inode for kind, inode in namespaces.items())
        except OSError:
            continue
        if mine:
            found.append(int(entry))
    return found


def check_ssh(servers: NamespaceServers) -> None:
    cluster = servers.cluster
    result = servers.run("a", ssh_argv(cluster.server("b"), ["hostname"], cluster.known_hosts), timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "b"


def check_own_open_vswitch(servers: NamespaceServers) -> None:
    made = servers.run("b", ["ovs-vsctl", "--timeout=10", "add-br", "eftest0", "--", "set", "bridge", "eftest0",
                             "datapath_type=netdev"])
    assert made.returncode == 0, made.stderr
    try:
        assert servers.run("b", ["ovs-vsctl", "list-br"]).stdout.split() == ["eftest0"]
        assert servers.run("a", ["ovs-vsctl", "list-br"]).stdout.split() == []
        assert "eftest0" not in machine_bridges()
        assert "b: bridge eftest0" in servers.leftovers()
    finally:
        servers.run("b", ["ovs-vsctl", "--timeout=10", "del-br", "eftest0"])
    assert servers.run("b", ["ovs-vsctl", "list-br"]).stdout.split() == []


def check_jumbo_vxlan(servers: NamespaceServers) -> None:
    ends = {"a": ("10.77.0.1", "10.77.0.2", "192.168.77.1"), "b": ("10.77.0.2", "10.77.0.1", "192.168.77.2")}
    try:
        for name, (local, remote, inner) in ends.items():
            for argv in (["ip", "link", "add", VXLAN, "type", "vxlan", "id", "42", "local", local, "remote", remote,
                          "dstport", "4789", "dev", "uplink0"],
                         ["ip", "link", "set", VXLAN, "mtu", str(VXLAN_MTU), "up"],
                         ["ip", "addr", "add", f"{inner}/24", "dev", VXLAN]):
                done = servers.run(name, argv)
                assert done.returncode == 0, f"{name}: {argv}: {done.stderr}"
        ping = servers.run("a", ["ping", "-c", "3", "-i", "0.2", "-W", "2", "-M", "do", "-s", str(PING_PAYLOAD),
                                 ends["b"][2]], timeout=20)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert " 0% packet loss" in ping.stdout
    finally:
        for name in ends:
            servers.run(name, ["ip", "link", "del", VXLAN])


def test_namespace_servers_reach_each_other_keep_apart_and_leave_nothing(tmp_path):
    bridges, interfaces = machine_bridges(), machine_interfaces()
    with NamespaceServers(str(tmp_path)) as servers:
        assert servers.cluster.names == ["a", "b"] and servers.cluster.head == "a"
        assert servers.cluster.underlay_mtu == 9100
        assert [servers.run(n, ["hostname"]).stdout.strip() for n in ("a", "b")] == ["a", "b"]
        namespaces = {n: servers.namespaces(n) for n in ("a", "b")}
        assert set(namespaces["a"]) == set(NAMESPACES)
        check_ssh(servers)
        check_own_open_vswitch(servers)
        check_jumbo_vxlan(servers)
        assert servers.leftovers() == []
    assert servers.remaining() == []
    assert all(processes_in(ns) == [] for ns in namespaces.values())
    assert others_network(machine_bridges() - bridges) == set()
    assert others_network(machine_interfaces() - interfaces) == set()
    servers.close()  # idempotent
