"""Topology models: BiGraph, k-ary fat-tree, leaf-spine and star, as pure data.

This module owns the network *model*: which hosts and switches exist, which
ports every link uses, each switch's datapath id, each host's IP and MAC, and
each link's rate. It imports neither Mininet nor os-ken and needs no root; the
Mininet network is built from a :class:`Topology` at the edge
(:mod:`emulator.network`), and the controller and the schedule checker read the
same model from its JSON export (networkx node-link format).

Spec strings
    ``KIND:key=value,...`` (or a mapping ``{"kind": KIND, key: value}`` from
    YAML). Kinds and their keys:

    * ``bigraph:upper=U,lower=L,hosts_per_switch=M``
    * ``fattree:k=K`` (K even)
    * ``leafspine:leaves=A,spines=B,hosts_per_leaf=C``
    * ``star:hosts=N``

    Every kind also takes ``bw`` (Mbit/s of every link, default 10),
    ``host_bw`` and ``switch_bw`` (host-to-switch and switch-to-switch rates,
    default ``bw``). Rates must lie in (0, 1000]: Mininet's HTB shaping ignores
    anything above 1000 Mbit/s.

Servers (every kind, all keys optional)
    ``servers=S,accels_per_server=A,nics_per_server=N[,pcie_bw=R][,nic_placement=P]``.
    A topology has servers iff ``servers`` is given; ``accels_per_server`` and
    ``nics_per_server`` are then required (integers >= 1, ``N <= A``), and
    any server key without ``servers`` is an error. The fabric's own keys
    define its host *slots* (the hosts it would have without servers, in host
    order); the ``S·N`` NICs take ``S·N`` of them and the others stay empty.
    ``pcie_bw`` (default ``host_bw``) is the rate of the accelerator links
    inside a server; NIC links run at ``host_bw``. ``nic_placement``:

    * ``packed`` (default) -- NIC ``k`` of server ``s`` takes slot ``s·N + k``:
      a server's NICs fill consecutive slots, on one switch as far as possible.
    * ``spread`` -- NIC number ``g = s·N + k`` goes to host-bearing switch
      ``g mod W`` (``W`` of them), on that switch's lowest free slot: a
      server's NICs round-robin over the switches.
    * ``hdrm`` -- BiGraph only, and only where the HDRM placement exists
      (:func:`hdrm_problem`): NIC ``g`` takes the slot HDRM gives rank ``g``
      (:func:`hdrm_slot_order`). Ranks ``2i`` and ``2i+1`` always sit in
      opposite groups, so a server with an even ``N`` has half its NICs in
      the upper and half in the lower group: this is how a server's NICs
      attach to both groups.

    Model: an accelerator is a host; accelerators are ``h1..h(S·A)``, server
    by server. Fabric switches keep exactly the names, roles and ports they
    have without servers; server ``s`` adds switch ``s(F+1+s)`` (``F`` fabric
    switches) with role ``pcie``, whose ports are its ``A`` accelerators
    (``host`` links at ``pcie_bw``) then its ``N`` NICs (``nic`` links to the
    fabric switch port of the NIC's slot). Accelerator ``j`` (0-based in its
    server) is pinned to NIC ``j·N // A`` (:meth:`Topology.pinned_nic`) and
    uses no other; a PCIe switch is never transit for other servers' traffic.
    ``N = 1`` is the traditional shared-NIC server, ``N = A`` the EFLOPS
    server with one NIC per accelerator.

Naming and numbering
    Hosts are ``h1``..``hN`` and switches ``s1``..``sS``, both 1-based.
    Host-bearing switches come first (BiGraph: upper then lower; fat-tree:
    edge switches pod by pod; leaf-spine: leaves), then the others (fat-tree
    aggregation then core; spines), then the PCIe switches of servers. Hosts
    are numbered switch by switch, so the hosts of ``s1`` are ``h1``..``hM``. A
    switch's ports are numbered from 1: first its hosts (in host order) or
    host slots, then its switch links in the order the builder adds them. A host has one interface, ``eth0``. Switch ``sI`` has
    datapath id ``I``. Host ``hI`` has IP ``10.a.b.c`` with ``I = a*65536 +
    b*256 + c`` (prefix /8) and MAC ``02:00:00:xx:xx:xx`` (locally
    administered) holding ``I``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import networkx as nx

from emulator.errors import MISSING, FieldError, UserError, int_field

JSON_FORMAT_VERSION = 1
#: The MTU of networks built without a fabric profile, and that of the
#: default profile (:mod:`emulator.fabric`): a real 9000-byte jumbo frame, so
#: that under time dilation every frame's serialisation and store-and-forward
#: stand for a real frame's exactly. ``mtu`` is a parameter wherever networks are built.
DEFAULT_MTU = 9000
MAX_LINK_MBPS = 1000.0
DEFAULT_LINK_MBPS = 10.0
MAX_HOSTS = 1024
MAX_SWITCHES = 512
PCIE = "pcie"  # the role of a server's internal switch
NIC_PLACEMENTS = ("packed", "spread", "hdrm")


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
        a, b = self.nic_slot(src)[0], self.nic_slot(dst)[0]
        return self._fabric_distances[a][b] + (3 if self.has_servers else 1)

    def diameter_hops(self) -> int:
        """The largest :meth:`switch_hops` over all host pairs."""
        dist = self._fabric_distances
        if not self.has_servers:
            bearing = [s.name for s in self.host_switches()]
            return max(dist[a][b] for a in bearing for b in bearing) + 1
        if self.params["servers"] == 1:
            return 1
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
        fabric = _BISECTION[self.kind](self.params, self.host_bw, self.switch_bw)
        if not self.has_servers:
            return fabric
        servers, accels, nics = self._server_params()
        if servers == 1:
            return (accels // 2) * float(self.params["pcie_bw"])
        return min(fabric, (servers // 2) * nics * self.host_bw)

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
        if self.has_servers:
            out.update(servers=self.params["servers"], accels_per_server=self.params["accels_per_server"],
                       nics_per_server=self.params["nics_per_server"], pcie_bw_mbps=self.params["pcie_bw"],
                       nic_placement=self.params["nic_placement"], host_slots=len(self.slots))
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


# ---------------------------------------------------------------------------
# Spec parsing
# ---------------------------------------------------------------------------

#: kind -> required integer keys with their lower bounds
_KIND_KEYS: dict[str, dict[str, int]] = {
    "bigraph": {"upper": 1, "lower": 1, "hosts_per_switch": 1},
    "fattree": {"k": 2},
    "leafspine": {"leaves": 1, "spines": 1, "hosts_per_leaf": 1},
    "star": {"hosts": 1},
}
_RATE_KEYS = ("bw", "host_bw", "switch_bw")
_SERVER_KEYS = ("servers", "accels_per_server", "nics_per_server", "pcie_bw", "nic_placement")


def _where(spec: object) -> str:
    return f"topology spec {spec!r}" if isinstance(spec, str) else "topology spec"


def _parse_rate(where: str, key: str, raw: object) -> float:
    expected = f"a rate in Mbit/s in (0, {MAX_LINK_MBPS:g}] (Mininet ignores more)"
    if isinstance(raw, bool):
        raise FieldError(where, key, expected, raw)
    try:
        value = float(raw) if isinstance(raw, (int, float)) else float(str(raw).strip())
    except ValueError:
        raise FieldError(where, key, expected, raw) from None
    if not math.isfinite(value) or value <= 0 or value > MAX_LINK_MBPS:
        raise FieldError(where, key, expected, raw)
    return value


def split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``KIND:k=v,...`` into its kind and raw key/value strings."""
    where = _where(spec)
    text = spec.strip()
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if not kind:
        raise FieldError(where, "kind", f"one of {', '.join(_KIND_KEYS)} before ':'", spec)
    raw: dict[str, str] = {}
    if sep and rest.strip():
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key or not value.strip():
                raise FieldError(where, "parameters", "key=value pairs separated by ','", item.strip())
            if key in raw:
                raise FieldError(where, key, "each key once", f"{key} given twice")
            raw[key] = value.strip()
    return kind, raw


def fabric_keys(kind: str) -> tuple[str, ...]:
    """The integer keys that shape a fabric of ``kind`` (no rates, no server keys)."""
    return tuple(_KIND_KEYS[kind])


def parse_spec(spec: str | Mapping[str, Any], default_mbps: float | None = None) -> tuple[str, dict[str, Any]]:
    """Validate a spec string or mapping; return ``(kind, params)``.

    ``params`` holds every key of the kind, plus ``host_bw`` and ``switch_bw``
    resolved from ``bw``; with servers also every server key, defaults
    resolved. ``bw`` defaults to ``default_mbps`` (a fabric profile's
    emulated rate), else :data:`DEFAULT_LINK_MBPS`. Raises
    :class:`FieldError` naming the first bad field.
    """
    where = _where(spec)
    if isinstance(spec, str):
        kind, raw = split_spec(spec)
        items: dict[str, Any] = dict(raw)
    elif isinstance(spec, Mapping):
        items = dict(spec)
        kind = items.pop("kind", None)
        if not isinstance(kind, str):
            raise FieldError(where, "kind", f"one of {', '.join(_KIND_KEYS)}", kind)
    else:
        raise FieldError(where, "topology", "a string KIND:key=value,... or a mapping", spec)
    if kind not in _KIND_KEYS:
        raise FieldError(where, "kind", f"one of {', '.join(_KIND_KEYS)}", kind)
    keys = _KIND_KEYS[kind]
    for key in items:
        if key not in keys and key not in _RATE_KEYS and key not in _SERVER_KEYS:
            allowed = ", ".join([*keys, *_RATE_KEYS, *_SERVER_KEYS])
            raise FieldError(where, key, f"a key of {kind} ({allowed})", f"unknown key {key}")
    params: dict[str, Any] = {}
    for key, minimum in keys.items():
        if key not in items:
            raise FieldError(where, key, f"an integer >= {minimum} (required for {kind})", MISSING)
        params[key] = int_field(where, key, items[key], minimum, text=True)
    if kind == "fattree" and params["k"] % 2:
        raise FieldError(where, "k", "an even integer >= 2", items["k"])
    bw = _parse_rate(where, "bw", items["bw"]) if "bw" in items else (default_mbps or DEFAULT_LINK_MBPS)
    params["bw"] = bw
    params["host_bw"] = _parse_rate(where, "host_bw", items["host_bw"]) if "host_bw" in items else bw
    params["switch_bw"] = _parse_rate(where, "switch_bw", items["switch_bw"]) if "switch_bw" in items else bw
    hosts, switches = _counts(kind, params)
    what = "host slots in the fabric" if "servers" in items else "hosts in all"
    if hosts > MAX_HOSTS:
        raise FieldError(where, "hosts", f"at most {MAX_HOSTS} {what}", hosts)
    if switches > MAX_SWITCHES:
        raise FieldError(where, "switches", f"at most {MAX_SWITCHES} switches in all", switches)
    if kind != "star" and hosts < 2:
        raise FieldError(where, "hosts", f"at least 2 {what}", hosts)
    if "servers" in items:
        params.update(_parse_servers(where, kind, params, items, hosts, switches))
    else:
        for key in _SERVER_KEYS:
            if key in items:
                raise FieldError(where, key, "servers=S alongside it (server keys describe servers)",
                                 f"{key} without servers")
    return kind, params


def _parse_servers(where: str, kind: str, params: Mapping[str, Any], items: Mapping[str, Any], slots: int,
                   fabric_switches: int) -> dict[str, Any]:
    """The server keys of a spec (see the module docstring), checked against the fabric's ``slots``."""
    servers = int_field(where, "servers", items["servers"], 1, text=True)
    counts = {}
    for key in ("accels_per_server", "nics_per_server"):
        if key not in items:
            raise FieldError(where, key, "an integer >= 1 (required with servers)", MISSING)
        counts[key] = int_field(where, key, items[key], 1, text=True)
    accels, nics = counts["accels_per_server"], counts["nics_per_server"]
    if nics > accels:
        raise FieldError(where, "nics_per_server", f"an integer in 1..{accels} (at most one NIC per accelerator)",
                         items["nics_per_server"])
    pcie = _parse_rate(where, "pcie_bw", items["pcie_bw"]) if "pcie_bw" in items else params["host_bw"]
    raw = items.get("nic_placement", "packed")
    placement = raw.strip() if isinstance(raw, str) else raw
    if placement not in NIC_PLACEMENTS:
        raise FieldError(where, "nic_placement", f"one of {', '.join(NIC_PLACEMENTS)}", raw)
    if placement == "hdrm":
        problem = ("a bigraph" if kind != "bigraph" else
                   hdrm_problem(params["upper"], params["lower"], params["hosts_per_switch"]))
        if problem:
            raise FieldError(where, "nic_placement", f"packed or spread (hdrm needs {problem})", raw)
    if servers * nics > slots:
        raise FieldError(where, "servers", f"at most {slots // nics} servers of {nics} NICs "
                         f"(the fabric has {slots} host slots)", items["servers"])
    if servers * accels > MAX_HOSTS:
        raise FieldError(where, "servers", f"at most {MAX_HOSTS} accelerators in all (servers x accels_per_server)",
                         items["servers"])
    if fabric_switches + servers > MAX_SWITCHES:
        raise FieldError(where, "servers", f"at most {MAX_SWITCHES} switches in all, one PCIe switch per server "
                         f"included ({fabric_switches} in the fabric)", items["servers"])
    if kind != "star" and servers * accels < 2:
        raise FieldError(where, "servers", "at least 2 accelerators in all (servers x accels_per_server)",
                         items["servers"])
    return {"servers": servers, "accels_per_server": accels, "nics_per_server": nics, "pcie_bw": pcie,
            "nic_placement": placement}


def hdrm_problem(upper: int, lower: int, hosts_per_switch: int) -> str | None:
    """Why a BiGraph has no contention-free HDRM placement (what it would need), or None if it has one."""
    m = hosts_per_switch
    if upper != lower:
        return ("a bigraph with upper = lower (halving-doubling partners alternate groups, so each group must hold "
                "half the ranks)")
    if m > upper:
        return (f"at most {upper} hosts per switch for a contention-free hdrm (a step has {2 * upper * m} flows "
                f"but only {2 * upper * lower} directed upper-lower links)")
    p = 2 * upper * m
    if p & (p - 1):
        return f"a bigraph whose (upper+lower)*hosts_per_switch is a power of two for hdrm (here {p})"
    return None


def hdrm_slot_order(upper: int, hosts_per_switch: int) -> list[int]:
    """The 0-based BiGraph host slots of HDRM ranks ``0..p-1`` (``p = 2·U·M``); see :func:`hdrm_problem`.

    Requirements: ``U = L``, ``M <= U`` (M hosts per switch), ``p`` a power of
    two (so ``U = 2^u``, ``M = 2^m``, ``p = 2^k`` with ``k = u + m + 1``).
    Slot ``i·M + q`` is port ``q + 1`` of switch ``s(i+1)`` (upper switches
    first, then lower).

    Construction (a linear code over GF(2)): write rank ``r`` in bits
    ``r_0..r_{k-1}``. Rank ``r`` goes to the upper group iff ``popcount(r)`` is
    even; partners ``r, r ^ 2^s`` differ in one bit, so every pair spans both
    groups and takes the single direct upper-lower link. For an even rank the
    upper switch is ``A(r) = bits 1..u`` and the port ``bits u+1..u+m``; for an
    odd rank the lower switch is ``B(r) = bits m+1..m+u`` and the port ``bits
    1..m``. On even ranks, bits ``1..k-1`` determine ``r`` (bit 0 is their
    parity) and ``A`` and ``B`` together cover all of them because ``m <= u``,
    so ``r -> (A(r), B(r))`` is injective there. In step ``s`` the pair of even
    ``r`` uses the link ``(A(r), B(r ^ 2^s)) = (A(r), B(r) ^ B(2^s))``: also
    injective in ``r``. Hence no two pairs share an upper-lower switch pair,
    in either direction, in any step. Each switch receives exactly ``M`` ranks.
    """
    m = hosts_per_switch
    u, mb = upper.bit_length() - 1, m.bit_length() - 1
    out = []
    for r in range(2 * upper * m):
        if bin(r).count("1") % 2 == 0:
            switch, port = (r >> 1) & (upper - 1), (r >> (u + 1)) & (m - 1)
        else:
            switch, port = upper + ((r >> (mb + 1)) & (upper - 1)), (r >> 1) & (m - 1)
        out.append(switch * m + port)
    return out


def _counts(kind: str, p: Mapping[str, Any]) -> tuple[int, int]:
    if kind == "bigraph":
        return (p["upper"] + p["lower"]) * p["hosts_per_switch"], p["upper"] + p["lower"]
    if kind == "fattree":
        k = p["k"]
        return k**3 // 4, 5 * k * k // 4
    if kind == "leafspine":
        return p["leaves"] * p["hosts_per_leaf"], p["leaves"] + p["spines"]
    return p["hosts"], 1


def format_spec(kind: str, params: Mapping[str, Any]) -> str:
    """The canonical spec string; rates and the NIC placement are shown only where they differ from the default."""
    parts = [f"{key}={params[key]}" for key in _KIND_KEYS[kind]]
    bw = params.get("bw", DEFAULT_LINK_MBPS)
    if bw != DEFAULT_LINK_MBPS:
        parts.append(f"bw={bw:g}")
    for key in ("host_bw", "switch_bw"):
        if params.get(key, bw) != bw:
            parts.append(f"{key}={params[key]:g}")
    if "servers" in params:
        parts += [f"{key}={params[key]}" for key in ("servers", "accels_per_server", "nics_per_server")]
        if params["pcie_bw"] != params.get("host_bw", bw):
            parts.append(f"pcie_bw={params['pcie_bw']:g}")
        if params["nic_placement"] != "packed":
            parts.append(f"nic_placement={params['nic_placement']}")
    return f"{kind}:{','.join(parts)}"


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------

class _Builder:
    """Accumulates switches, host slots and links, numbering ports as it goes.

    The fabric builders reserve host slots (:meth:`add_slot`); :meth:`build`
    then puts a host on every slot, or the servers' NICs on some of them.
    """

    def __init__(self, host_bw: float, switch_bw: float):
        self.host_bw = host_bw
        self.switch_bw = switch_bw
        self.switches: list[Switch] = []
        self.slots: list[tuple[str, int]] = []
        self.hosts: list[Host] = []
        self.host_links: list[Link] = []
        self.switch_links: list[Link] = []
        self._next_port: dict[str, int] = {}

    def add_switch(self, role: str, pod: int | None = None) -> str:
        index = len(self.switches) + 1
        name = f"s{index}"
        self.switches.append(Switch(name=name, index=index, dpid=index, role=role, pod=pod))
        self._next_port[name] = 1
        return name

    def _port(self, switch: str) -> int:
        port = self._next_port[switch]
        self._next_port[switch] = port + 1
        return port

    def add_slot(self, switch: str) -> None:
        self.slots.append((switch, self._port(switch)))

    def _add_host(self, switch: str, port: int, bw: float) -> None:
        index = len(self.hosts) + 1
        name = f"h{index}"
        self.hosts.append(Host(name=name, index=index, switch=switch, switch_port=port,
                               ip=host_ip(index), mac=host_mac(index)))
        self.host_links.append(Link(name, 0, switch, port, bw, "host"))

    def connect(self, a: str, b: str) -> None:
        self.switch_links.append(Link(a, self._port(a), b, self._port(b), self.switch_bw, "switch"))

    def build(self, kind: str, params: Mapping[str, Any]) -> Topology:
        nic_links: list[Link] = []
        if "servers" not in params:
            for switch, port in self.slots:
                self._add_host(switch, port, self.host_bw)
        else:
            accels, nics = params["accels_per_server"], params["nics_per_server"]
            taken = _nic_slots(kind, params, self.slots)
            for s in range(params["servers"]):
                pcie = self.add_switch(PCIE)
                for _ in range(accels):
                    self._add_host(pcie, self._port(pcie), params["pcie_bw"])
                for switch, port in taken[s * nics:(s + 1) * nics]:
                    nic_links.append(Link(pcie, self._port(pcie), switch, port, self.host_bw, "nic"))
        return Topology(kind=kind, params=dict(params), hosts=tuple(self.hosts), switches=tuple(self.switches),
                        links=(*self.host_links, *nic_links, *self.switch_links), slots=tuple(self.slots))


def _nic_slots(kind: str, params: Mapping[str, Any], slots: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The slots of NICs ``0..S·N-1`` (NIC ``k`` of server ``s`` is ``s·N + k``) under ``nic_placement``."""
    count = params["servers"] * params["nics_per_server"]
    placement = params["nic_placement"]
    if placement == "packed":
        return slots[:count]
    if placement == "hdrm":
        return [slots[i] for i in hdrm_slot_order(params["upper"], params["hosts_per_switch"])[:count]]
    per_switch: dict[str, list[tuple[str, int]]] = {}
    for slot in slots:
        per_switch.setdefault(slot[0], []).append(slot)
    # Every kind has the same number of slots on every host-bearing switch, so none runs out first.
    columns = list(per_switch.values())
    return [columns[g % len(columns)][g // len(columns)] for g in range(count)]


def host_ip(index: int) -> str:
    return f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"


def host_mac(index: int) -> str:
    return f"02:00:00:{(index >> 16) & 255:02x}:{(index >> 8) & 255:02x}:{index & 255:02x}"


def _build_bigraph(b: _Builder, p: Mapping[str, Any]) -> None:
    upper = [b.add_switch("upper") for _ in range(p["upper"])]
    lower = [b.add_switch("lower") for _ in range(p["lower"])]
    # Hosts first on every switch so that ports 1..M are host ports.
    for sw in upper + lower:
        for _ in range(p["hosts_per_switch"]):
            b.add_slot(sw)
    for u in upper:
        for lo in lower:
            b.connect(u, lo)


def _build_fattree(b: _Builder, p: Mapping[str, Any]) -> None:
    k = p["k"]
    half = k // 2
    edges = [[b.add_switch("edge", pod) for _ in range(half)] for pod in range(k)]
    aggs = [[b.add_switch("agg", pod) for _ in range(half)] for pod in range(k)]
    cores = [b.add_switch("core") for _ in range(half * half)]
    for pod in range(k):
        for edge in edges[pod]:
            for _ in range(half):
                b.add_slot(edge)
    for pod in range(k):
        for edge in edges[pod]:
            for agg in aggs[pod]:
                b.connect(edge, agg)
    # Core switch i*half + j links to aggregation switch i of every pod.
    for pod in range(k):
        for i, agg in enumerate(aggs[pod]):
            for j in range(half):
                b.connect(agg, cores[i * half + j])


def _build_leafspine(b: _Builder, p: Mapping[str, Any]) -> None:
    leaves = [b.add_switch("leaf") for _ in range(p["leaves"])]
    spines = [b.add_switch("spine") for _ in range(p["spines"])]
    for leaf in leaves:
        for _ in range(p["hosts_per_leaf"]):
            b.add_slot(leaf)
    for leaf in leaves:
        for spine in spines:
            b.connect(leaf, spine)


def _build_star(b: _Builder, p: Mapping[str, Any]) -> None:
    sw = b.add_switch("star")
    for _ in range(p["hosts"]):
        b.add_slot(sw)


_BUILDERS = {
    "bigraph": _build_bigraph,
    "fattree": _build_fattree,
    "leafspine": _build_leafspine,
    "star": _build_star,
}


# Bisection (see Topology.bisection_bw_mbps). A cut assigns every switch to a
# side; hosts whose switch is on the wrong side for the balance cost their host
# link. BiGraph and leaf-spine are symmetric within each switch group, so only
# how many switches of each group sit on one side matters: enumerating those
# counts is exact. The unit tests compare every form with a search over all
# switch assignments.
def _balance_cost(side_hosts: int, n: int, hbw: float) -> float:
    """Host links cut to move hosts until one side holds floor(N/2) or ceil(N/2)."""
    return min(abs(side_hosts - n // 2), abs(side_hosts - (n + 1) // 2)) * hbw


def _bisect_two_groups(g1: int, g2: int, hosts1: int, hosts2: int, hbw: float, sbw: float) -> float:
    """Complete bipartite switch graph g1 x g2 with hosts1/hosts2 hosts per switch."""
    n = g1 * hosts1 + g2 * hosts2
    return min((a * (g2 - c) + (g1 - a) * c) * sbw + _balance_cost(a * hosts1 + c * hosts2, n, hbw)
               for a in range(g1 + 1) for c in range(g2 + 1))


def _bisect_bigraph(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    m = p["hosts_per_switch"]
    return _bisect_two_groups(p["upper"], p["lower"], m, m, hbw, sbw)


def _bisect_leafspine(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    return _bisect_two_groups(p["leaves"], p["spines"], p["hosts_per_leaf"], 0, hbw, sbw)


def _bisect_fattree(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    # Full bisection: cut the hosts' links, or half the pods' k/2 * (k/2)^2
    # aggregation-core links (k**3 / 8 in all).
    k = p["k"]
    return min((k**3 // 4 // 2) * hbw, (k**3 // 8) * sbw)


def _bisect_star(p: Mapping[str, Any], hbw: float, sbw: float) -> float:
    return (p["hosts"] // 2) * hbw


_BISECTION = {
    "bigraph": _bisect_bigraph,
    "fattree": _bisect_fattree,
    "leafspine": _bisect_leafspine,
    "star": _bisect_star,
}


def build(spec: str | Mapping[str, Any], default_mbps: float | None = None) -> Topology:
    """Build the topology a spec describes (see the module docstring; ``default_mbps`` as for :func:`parse_spec`)."""
    kind, params = parse_spec(spec, default_mbps)
    builder = _Builder(params["host_bw"], params["switch_bw"])
    _BUILDERS[kind](builder, params)
    return builder.build(kind, params)


def from_json(data: Mapping[str, Any], where: str = "topology file") -> Topology:
    """Rebuild a :class:`Topology` from :meth:`Topology.to_json` output.

    The model is rebuilt from its spec and then compared with the file, so a
    file that was edited by hand into something inconsistent is rejected.
    """
    if not isinstance(data, Mapping):
        raise FieldError(where, "topology", "a JSON object (networkx node-link data)", type(data).__name__)
    graph = data.get("graph")
    if not isinstance(graph, Mapping) or graph.get("format") != "eflops-emulator-topology":
        raise FieldError(where, "graph.format", "'eflops-emulator-topology'",
                         graph.get("format") if isinstance(graph, Mapping) else graph)
    if graph.get("version") != JSON_FORMAT_VERSION:
        raise FieldError(where, "graph.version", str(JSON_FORMAT_VERSION), graph.get("version"))
    kind, params = graph.get("kind"), graph.get("params")
    if not isinstance(params, Mapping):
        raise FieldError(where, "graph.params", "a mapping of spec keys", params)
    topo = build({"kind": kind, **params})
    expected = topo.to_json()
    for key in ("nodes", "links"):
        mine = sorted(json.dumps(x, sort_keys=True) for x in expected[key])
        theirs = data.get(key)
        if not isinstance(theirs, list) or sorted(json.dumps(x, sort_keys=True) for x in theirs) != mine:
            raise FieldError(where, key, f"the {key} of {topo.spec}", "a different list")
    return topo


def load(source: str | Mapping[str, Any], default_mbps: float | None = None) -> Topology:
    """A topology from a spec string, a spec mapping (links of ``default_mbps`` where it sets no rate,
    see :func:`parse_spec`), or the path of a JSON export (its own rates)."""
    if isinstance(source, str) and (source.endswith(".json") or os.sep in source) and ":" not in source:
        try:
            with open(source, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise UserError(f"topology file {source!r}: cannot read it ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"topology file {source!r}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except (ValueError, UnicodeDecodeError) as exc:  # a NUL in the path; a file that is not text
            raise UserError(f"topology file {source!r}: cannot read it ({exc})") from None
        return from_json(data, where=f"topology file {source!r}")
    return build(source, default_mbps)


def all_host_pairs(topo: Topology) -> Iterable[tuple[str, str]]:
    """Every ordered pair of distinct hosts."""
    names = [h.name for h in topo.hosts]
    return itertools.permutations(names, 2)
