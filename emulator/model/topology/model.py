"""The topology model: hosts, switches, links and the :class:`Topology` that holds them, plus the link model.

This module owns the built, immutable model: every node with its name,
number and addresses, every link with the ports at both ends and its rate,
and the questions asked of a whole topology (lookups by name and port, the
servers and their pinned NICs, the networkx graph, switch hops, diameter,
bisection, the JSON export and the summary). It also owns the link model
that turns rates into TCP goodput (MTU, frame overheads). The naming and
numbering scheme is in the package docstring (:mod:`emulator.model.topology`).

It imports from the package only what a topology reports about itself from
its spec's parameters: :func:`~emulator.model.topology.spec.format_spec` (its
canonical spec), :func:`~emulator.model.topology.bisection.bisection_mbps`, and
its kind's registration (:data:`~emulator.model.topology.kinds.KINDS`: rails,
rail-only).
The builders (:mod:`emulator.model.topology.builders`) make :class:`Topology`
objects; nothing here builds one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import networkx as nx

from emulator.base.errors import UserError
from emulator.model.topology.bisection import bisection_mbps
from emulator.model.topology.kinds import KINDS, NIC_ROLE
from emulator.model.topology.spec import format_spec

JSON_FORMAT_VERSION = 1
#: The MTU of networks built without a fabric profile, and that of the
#: default profile (:mod:`emulator.model.fabric`): a real 9000-byte jumbo frame, so
#: that under time dilation every frame's serialisation and store-and-forward
#: stand for a real frame's exactly. ``mtu`` is a parameter wherever networks are built.
DEFAULT_MTU = 9000
PCIE = "pcie"  # the role of a server's internal switch


@dataclass(frozen=True)
class Host:
    """An emulated endpoint: an accelerator (on a fabric switch, or on its server's PCIe switch)."""

    name: str
    index: int  # 1-based, the number in the name
    switch: str
    switch_port: int
    ip: str
    mac: str


@dataclass(frozen=True)
class Switch:
    """An OpenFlow switch; ``role`` says where it sits in its fabric."""

    name: str
    index: int  # 1-based
    dpid: int
    role: str  # upper, lower, edge, agg, core, leaf, spine, star; pcie for a server's switch
    pod: int | None = None  # fat-tree pod of edge and aggregation switches


@dataclass(frozen=True)
class Link:
    """An undirected link between ``a`` port ``a_port`` and ``b`` port ``b_port``.

    For host links ``a`` is the host (port 0 stands for its ``eth0``) and ``b``
    its switch; for NIC links ``a`` is the server's PCIe switch and ``b`` the
    fabric switch of the NIC's slot.
    """

    a: str
    a_port: int
    b: str
    b_port: int
    bw_mbps: float
    kind: str  # "host", "nic" or "switch"

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a

    def port_of(self, node: str) -> int:
        return self.a_port if node == self.a else self.b_port


@dataclass(frozen=True)
class Topology:
    """A whole fabric: its hosts, switches and links, plus the spec it came from."""

    kind: str
    params: Mapping[str, Any]
    hosts: tuple[Host, ...]
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    slots: tuple[tuple[str, int], ...] = ()  # the fabric's host slots (switch, port), in host order

    # ----------------------------------------------------------------- lookup
    @property
    def spec(self) -> str:
        return format_spec(self.kind, self.params)

    @property
    def host_bw(self) -> float:
        return float(self.params["host_bw"])

    @property
    def switch_bw(self) -> float:
        return float(self.params["switch_bw"])

    @cached_property
    def _hosts_by_name(self) -> dict[str, Host]:
        return {h.name: h for h in self.hosts}

    @cached_property
    def _switches_by_name(self) -> dict[str, Switch]:
        return {s.name: s for s in self.switches}

    @cached_property
    def _links_by_port(self) -> dict[tuple[str, int], Link]:
        out: dict[tuple[str, int], Link] = {}
        for link in self.links:
            out[(link.a, link.a_port)] = link
            out[(link.b, link.b_port)] = link
        return out

    @cached_property
    def _links_by_pair(self) -> dict[frozenset[str], list[Link]]:
        out: dict[frozenset[str], list[Link]] = {}
        for lk in self.links:
            out.setdefault(frozenset((lk.a, lk.b)), []).append(lk)
        return out

    def host(self, name: str) -> Host:
        try:
            return self._hosts_by_name[name]
        except KeyError:
            raise UserError(f"topology {self.spec}: no host named {name!r}") from None

    def switch(self, name: str) -> Switch:
        try:
            return self._switches_by_name[name]
        except KeyError:
            raise UserError(f"topology {self.spec}: no switch named {name!r}") from None

    def is_host(self, name: str) -> bool:
        return name in self._hosts_by_name

    def is_switch(self, name: str) -> bool:
        return name in self._switches_by_name

    def link_between(self, a: str, b: str) -> Link | None:
        """The link between ``a`` and ``b``; of parallel NIC links (a server's NICs on one fabric switch) the first."""
        links = self._links_by_pair.get(frozenset((a, b)))
        return links[0] if links else None

    def links_between(self, a: str, b: str) -> list[Link]:
        """Every link between ``a`` and ``b``: several only for NICs of one server on one fabric switch."""
        return list(self._links_by_pair.get(frozenset((a, b)), []))

    def link_at(self, node: str, port: int) -> Link | None:
        return self._links_by_port.get((node, port))

    def host_link(self, host: str) -> Link:
        """The one link of ``host`` (its port 0)."""
        link = self.link_at(self.host(host).name, 0)
        assert link is not None, host  # every host has exactly one link, on port 0
        return link

    def port_to(self, node: str, neighbor: str) -> int:
        """The port of ``node`` whose link leads to ``neighbor`` (see :meth:`link_between`)."""
        link = self.link_between(node, neighbor)
        if link is None:
            raise KeyError(f"{node} has no link to {neighbor}")
        return link.port_of(node)

    def neighbors(self, node: str) -> list[str]:
        return sorted(self.graph.neighbors(node), key=node_sort_key)

    def hosts_of(self, switch: str) -> list[Host]:
        """The hosts on ``switch`` (with servers: a PCIe switch's accelerators; none on fabric switches)."""
        return [h for h in self.hosts if h.switch == switch]

    def host_switches(self) -> list[Switch]:
        """Switches that have hosts attached, in switch order (with servers: the PCIe switches)."""
        bearing = {h.switch for h in self.hosts}
        return [s for s in self.switches if s.name in bearing]

    def switch_links(self) -> list[Link]:
        """Links between two fabric switches (NIC links are not among them)."""
        return [lk for lk in self.links if lk.kind == "switch"]

    def nic_links(self) -> list[Link]:
        """Links from a server's PCIe switch to the fabric, server by server, NIC by NIC."""
        return [lk for lk in self.links if lk.kind == "nic"]

    # ---------------------------------------------------------------- servers
    @property
    def has_servers(self) -> bool:
        return "servers" in self.params

    @cached_property
    def _fabric_names(self) -> frozenset[str]:
        return frozenset(s.name for s in self.switches if s.role != PCIE)

    def fabric_switches(self) -> list[Switch]:
        """Every switch but the servers' PCIe switches, in switch order."""
        return [s for s in self.switches if s.name in self._fabric_names]

    def is_fabric_switch(self, name: str) -> bool:
        return name in self._fabric_names

    def is_pcie_switch(self, name: str) -> bool:
        return self.is_switch(name) and name not in self._fabric_names

    def _server_params(self) -> tuple[int, int, int]:
        if not self.has_servers:
            raise UserError(f"topology {self.spec}: has no servers")
        return self.params["servers"], self.params["accels_per_server"], self.params["nics_per_server"]

    def server_of(self, host: str) -> int:
        """The 0-based server of accelerator ``host``."""
        _, a, _ = self._server_params()
        return (self.host(host).index - 1) // a

    def servers(self) -> list[list[str]]:
        """The accelerators of every server, server by server."""
        n, a, _ = self._server_params()
        return [[h.name for h in self.hosts[s * a:(s + 1) * a]] for s in range(n)]

    def pinned_nic(self, host: str) -> Link:
        """The NIC link accelerator ``host`` uses: local accelerator ``j`` of ``A`` takes NIC ``j·N // A``."""
        _, a, n = self._server_params()
        h = self.host(host)
        link = self.link_at(h.switch, a + 1 + (h.switch_port - 1) * n // a)
        assert link is not None and link.kind == "nic"
        return link

    @cached_property
    def _slot_index(self) -> dict[tuple[str, int], int]:
        return {slot: i for i, slot in enumerate(self.slots)}

    def nic_slot(self, host: str) -> tuple[str, int, int]:
        """``(fabric switch, 0-based slot position on it, 0-based global slot index)`` where ``host`` enters the fabric.

        With servers the slot of the host's pinned NIC; without, the host's
        own slot (its switch, ``switch_port - 1``, ``index - 1``).
        """
        if self.has_servers:
            nic = self.pinned_nic(host)
            switch, port = nic.b, nic.b_port
        else:
            h = self.host(host)
            switch, port = h.switch, h.switch_port
        return switch, port - 1, self._slot_index[(switch, port)]

    def access_path(self, host: str) -> list[str]:
        """The nodes from ``host`` to the fabric switch its traffic enters by (with servers: via its pinned NIC)."""
        h = self.host(host)
        if self.has_servers:
            return [host, h.switch, self.pinned_nic(host).b]
        return [host, h.switch]

    @property
    def rail_only(self) -> bool:
        """True on a rail-only fabric: no spines, traffic changes rails inside the sender's server."""
        return KINDS[self.kind].rail_only

    def egress_nic(self, src: str, dst: str) -> Link:
        """The NIC link by which ``src``'s traffic to ``dst`` (of another server) leaves ``src``'s server.

        ``src``'s pinned NIC, except on a rail-only fabric: there the server's
        NIC on the rail of ``dst``'s pinned NIC (the rail placement puts NIC
        ``k`` on rail ``k``), reached through the server's own switch.
        """
        if not self.rail_only:
            return self.pinned_nic(src)
        _, a, _ = self._server_params()
        rail = self.pinned_nic(dst).a_port - a - 1
        link = self.link_at(self.host(src).switch, a + 1 + rail)
        assert link is not None and link.kind == "nic"
        return link

    def egress_path(self, src: str, dst: str) -> list[str]:
        """The nodes from ``src`` to the fabric switch its traffic to ``dst`` (another server's) enters by."""
        if not self.rail_only:
            return self.access_path(src)
        return [src, self.host(src).switch, self.egress_nic(src, dst).b]

    @property
    def has_domain(self) -> bool:
        """Whether servers have an accelerator interconnect (``domain_bw``): transfers between two accelerators
        of one server cross it as timed transfers, not as packets through the server's switch."""
        return "domain_bw" in self.params

    def over_domain(self, a: str, b: str) -> bool:
        """True when a transfer from ``a`` to ``b`` crosses their server's accelerator interconnect."""
        return self.has_domain and self.same_server(a, b)

    def same_server(self, a: str, b: str) -> bool:
        """True for two accelerators of one server (always False without servers)."""
        return self.has_servers and self.server_of(a) == self.server_of(b)

    # ------------------------------------------------------------------ graph
    @cached_property
    def graph(self) -> nx.Graph:
        """An undirected networkx graph with node and link attributes.

        A ``MultiGraph`` for topologies with servers, whose NICs may give a
        PCIe switch parallel links to one fabric switch.
        """
        g = nx.MultiGraph() if self.has_servers else nx.Graph()
        for h in self.hosts:
            g.add_node(h.name, type="host", index=h.index, switch=h.switch,
                       switch_port=h.switch_port, ip=h.ip, mac=h.mac)
        for s in self.switches:
            g.add_node(s.name, type="switch", index=s.index, dpid=s.dpid, role=s.role, pod=s.pod)
        for lk in self.links:
            g.add_edge(lk.a, lk.b, a=lk.a, a_port=lk.a_port, b=lk.b, b_port=lk.b_port,
                       bw_mbps=lk.bw_mbps, kind=lk.kind)
        return g

    @cached_property
    def fabric_graph(self) -> nx.Graph:
        """The fabric switches and the links between them (no hosts, no PCIe switches), without attributes."""
        g = nx.Graph()
        g.add_nodes_from(s.name for s in self.fabric_switches())
        g.add_edges_from((lk.a, lk.b) for lk in self.switch_links())
        return g

    @cached_property
    def _fabric_distances(self) -> dict[str, dict[str, int]]:
        return dict(nx.all_pairs_shortest_path_length(self.fabric_graph))

    def switch_hops(self, src: str, dst: str) -> int:
        """Switches a packet crosses from host ``src`` to host ``dst`` on a shortest path.

        With servers, the path routing allows: inside a server its PCIe switch
        only, between servers both PCIe switches and a shortest fabric path
        between the slots of the two pinned NICs.
        """
        if self.same_server(src, dst):
            return 1
        a, b = self.egress_path(src, dst)[-1], self.nic_slot(dst)[0]
        return self._fabric_distances[a][b] + (3 if self.has_servers else 1)

    def diameter_hops(self) -> int:
        """The largest :meth:`switch_hops` over all host pairs."""
        dist = self._fabric_distances
        if not self.has_servers:
            bearing = [s.name for s in self.host_switches()]
            return max(dist[a][b] for a in bearing for b in bearing) + 1
        if self.params["servers"] == 1:
            return 1
        if self.rail_only:  # every pair of servers meets on the rail of the receiver's NIC
            return 3
        # Every NIC is some accelerator's pinned NIC (j·N // A takes every value).
        on: dict[str, set[int]] = {}
        for s, nic in enumerate(self.nic_links()):
            on.setdefault(nic.b, set()).add(s // self.params["nics_per_server"])
        return max(dist[a][b] for a in on for b in on if len(on[a] | on[b]) > 1) + 3

    def bisection_bw_mbps(self) -> float:
        """Bisection bandwidth in Mbit/s (one direction).

        Without servers: the smallest total rate of links that must be cut to
        split the hosts into two halves (``floor(N/2)`` and ``ceil(N/2)``),
        with switches free to fall on either side. Closed forms per kind,
        checked against an exhaustive min-cut search on small instances in
        the unit tests.

        With ``S >= 2`` servers: ``min(B_fabric, floor(S/2)·N·host_bw)``, the
        bare fabric's bisection (every host slot taken, as above) capped by
        what the NICs of half of the servers carry. This is the rate between
        two halves of the servers as far as fabric and NICs allow, not an
        exact min cut over accelerators (empty slots, the NIC placement and the
        odd server of an odd ``S`` are not looked at). With one server:
        ``floor(A/2)·pcie_bw``, the PCIe links of half its accelerators.
        """
        return bisection_mbps(self.kind, self.params)

    # ------------------------------------------------------------------- json
    def to_json(self) -> dict[str, Any]:
        """The networkx node-link form, with ``kind``, ``params`` and ``spec`` as graph data."""
        g = self.graph.copy()
        g.graph.update(format="eflops-emulator-topology", version=JSON_FORMAT_VERSION,
                       kind=self.kind, params=dict(self.params), spec=self.spec)
        return nx.node_link_data(g, edges="links")

    def summary(self) -> dict[str, Any]:
        """Counts, diameter and bisection; with servers also the server shape and the PCIe rate."""
        out = {
            "spec": self.spec,
            "kind": self.kind,
            "hosts": len(self.hosts),
            "switches": len(self.switches),
            "links": len(self.links),
            "host_links": sum(1 for lk in self.links if lk.kind == "host"),
            "nic_links": sum(1 for lk in self.links if lk.kind == "nic"),
            "switch_links": sum(1 for lk in self.links if lk.kind == "switch"),
            "diameter_hops": self.diameter_hops(),
            "bisection_bw_mbps": self.bisection_bw_mbps(),
            "host_bw_mbps": self.host_bw,
            "switch_bw_mbps": self.switch_bw,
        }
        if KINDS[self.kind].rails:
            planes = 2 if any(s.role == NIC_ROLE for s in self.switches) else 1
            out.update(rails=self.params["rails"], planes=planes, rail_only=self.rail_only)
            if planes == 2:
                out.update(nic_port_bw_mbps=self.host_bw / 2)
        if self.has_servers:
            out.update(servers=self.params["servers"], accels_per_server=self.params["accels_per_server"],
                       nics_per_server=self.params["nics_per_server"], pcie_bw_mbps=self.params["pcie_bw"],
                       nic_placement=self.params["nic_placement"], host_slots=len(self.slots))
            if self.has_domain:
                out.update(domain_bw_mbps=self.params["domain_bw"])
        return out


def tcp_goodput_factor(mtu: int = DEFAULT_MTU) -> float:
    """TCP payload per byte on the wire as HTB counts it (Ethernet header, IP, TCP with timestamps)."""
    return tcp_payload_bytes(mtu) / (mtu + 14)


def tcp_payload_bytes(mtu: int = DEFAULT_MTU) -> int:
    """TCP payload of a full frame (the MSS with timestamps: 20 bytes of IP, 32 of TCP)."""
    return mtu - 52


def last_segment_bytes(nbytes: int | float, mss: int) -> float:
    """The payload of the last frame of a message of ``nbytes`` cut into frames of ``mss`` bytes."""
    if nbytes <= 0:
        return 0.0
    return nbytes - mss * ((int(nbytes) - 1) // mss)


def node_sort_key(name: str) -> tuple[str, int]:
    """Sort ``h2`` before ``h10``."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1)


def switch_ports(topo: Topology) -> int:
    """The ports of every switch together: one per host link, two per link between switches."""
    switches = {s.name for s in topo.switches}
    return sum((link.a in switches) + (link.b in switches) for link in topo.links)


def all_host_pairs(topo: Topology) -> Iterable[tuple[str, str]]:
    """Every ordered pair of distinct hosts."""
    names = [h.name for h in topo.hosts]
    return itertools.permutations(names, 2)
