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

Naming and numbering
    Hosts are ``h1``..``hN`` and switches ``s1``..``sS``, both 1-based.
    Host-bearing switches come first (BiGraph: upper then lower; fat-tree:
    edge switches pod by pod; leaf-spine: leaves), then the others (fat-tree
    aggregation then core; spines). Hosts are numbered switch by switch, so
    the hosts of ``s1`` are ``h1``..``hM``. A switch's ports are numbered from
    1: first its hosts (in host order), then its switch links in the order the
    builder adds them. A host has one interface, ``eth0``. Switch ``sI`` has
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

from emulator.errors import MISSING, FieldError, UserError

JSON_FORMAT_VERSION = 1
#: Frames of 32000 bytes: 21 times fewer packets through the single-threaded
#: userspace datapath than at 1500 bytes, 3.5 times fewer than 9000-byte jumbo
#: frames (measured: HDRM busbw 0.85-0.94 of the link against 0.74-0.75 at
#: 9000). The price: under time dilation a frame's serialisation stands for
#: 3.5x a real 9000-byte frame's (2.6 us against 0.7 us at 100 Gbit/s), which
#: matters for latency-bound runs, not bandwidth-bound ones. veth and the
#: userspace datapath carry it; ``mtu`` is a parameter wherever networks are built.
DEFAULT_MTU = 32000
MAX_LINK_MBPS = 1000.0
DEFAULT_LINK_MBPS = 10.0
MAX_HOSTS = 1024
MAX_SWITCHES = 512


@dataclass(frozen=True)
class Host:
    """An emulated endpoint (one accelerator with its own NIC)."""

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
    role: str  # upper, lower, edge, agg, core, leaf, spine, star
    pod: int | None = None  # fat-tree pod of edge and aggregation switches


@dataclass(frozen=True)
class Link:
    """An undirected link between ``a`` port ``a_port`` and ``b`` port ``b_port``.

    For host links ``a`` is the host (port 0 stands for its ``eth0``) and ``b``
    its switch.
    """

    a: str
    a_port: int
    b: str
    b_port: int
    bw_mbps: float
    kind: str  # "host" or "switch"

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
    def _links_by_pair(self) -> dict[frozenset[str], Link]:
        return {frozenset((lk.a, lk.b)): lk for lk in self.links}

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
        return self._links_by_pair.get(frozenset((a, b)))

    def link_at(self, node: str, port: int) -> Link | None:
        return self._links_by_port.get((node, port))

    def port_to(self, node: str, neighbor: str) -> int:
        """The port of ``node`` whose link leads to ``neighbor``."""
        link = self.link_between(node, neighbor)
        if link is None:
            raise KeyError(f"{node} has no link to {neighbor}")
        return link.port_of(node)

    def neighbors(self, node: str) -> list[str]:
        return sorted(self.graph.neighbors(node), key=node_sort_key)

    def hosts_of(self, switch: str) -> list[Host]:
        return [h for h in self.hosts if h.switch == switch]

    def host_switches(self) -> list[Switch]:
        """Switches that have hosts attached, in switch order."""
        bearing = {h.switch for h in self.hosts}
        return [s for s in self.switches if s.name in bearing]

    def switch_links(self) -> list[Link]:
        return [lk for lk in self.links if lk.kind == "switch"]

    # ------------------------------------------------------------------ graph
    @cached_property
    def graph(self) -> nx.Graph:
        """An undirected networkx graph with node and link attributes."""
        g = nx.Graph()
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
    def _switch_graph(self) -> nx.Graph:
        return self.graph.subgraph([s.name for s in self.switches])

    @cached_property
    def _switch_distances(self) -> dict[str, dict[str, int]]:
        return dict(nx.all_pairs_shortest_path_length(self._switch_graph))

    def switch_hops(self, src: str, dst: str) -> int:
        """Switches a packet crosses from host ``src`` to host ``dst`` on a shortest path."""
        a, b = self.host(src).switch, self.host(dst).switch
        return self._switch_distances[a][b] + 1

    def diameter_hops(self) -> int:
        """The largest :meth:`switch_hops` over all host pairs."""
        bearing = [s.name for s in self.host_switches()]
        return max(self._switch_distances[a][b] for a in bearing for b in bearing) + 1

    def bisection_bw_mbps(self) -> float:
        """Bisection bandwidth in Mbit/s (one direction).

        The smallest total rate of links that must be cut to split the hosts
        into two halves (``floor(N/2)`` and ``ceil(N/2)``), with switches free
        to fall on either side. Closed forms per kind, checked against an
        exhaustive min-cut search on small instances in the unit tests.
        """
        return _BISECTION[self.kind](self.params, self.host_bw, self.switch_bw)

    # ------------------------------------------------------------------- json
    def to_json(self) -> dict[str, Any]:
        """The networkx node-link form, with ``kind``, ``params`` and ``spec`` as graph data."""
        g = self.graph.copy()
        g.graph.update(format="eflops-emulator-topology", version=JSON_FORMAT_VERSION,
                       kind=self.kind, params=dict(self.params), spec=self.spec)
        return nx.node_link_data(g, edges="links")

    def summary(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kind": self.kind,
            "hosts": len(self.hosts),
            "switches": len(self.switches),
            "links": len(self.links),
            "host_links": sum(1 for lk in self.links if lk.kind == "host"),
            "switch_links": sum(1 for lk in self.links if lk.kind == "switch"),
            "diameter_hops": self.diameter_hops(),
            "bisection_bw_mbps": self.bisection_bw_mbps(),
            "host_bw_mbps": self.host_bw,
            "switch_bw_mbps": self.switch_bw,
        }


def tcp_goodput_factor(mtu: int = DEFAULT_MTU) -> float:
    """TCP payload per byte on the wire as HTB counts it (Ethernet header, IP, TCP with timestamps)."""
    return (mtu - 52) / (mtu + 14)


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


def _where(spec: object) -> str:
    return f"topology spec {spec!r}" if isinstance(spec, str) else "topology spec"


def _parse_int(where: str, key: str, raw: object, minimum: int) -> int:
    if isinstance(raw, bool):
        raise FieldError(where, key, f"an integer >= {minimum}", raw)
    if isinstance(raw, int):
        value = raw
    else:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise FieldError(where, key, f"an integer >= {minimum}", raw) from None
    if value < minimum:
        raise FieldError(where, key, f"an integer >= {minimum}", raw)
    return value


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


def parse_spec(spec: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Validate a spec string or mapping; return ``(kind, params)``.

    ``params`` holds every key of the kind, plus ``host_bw`` and ``switch_bw``
    resolved from ``bw``. Raises :class:`FieldError` naming the first bad field.
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
        if key not in keys and key not in _RATE_KEYS:
            allowed = ", ".join([*keys, *_RATE_KEYS])
            raise FieldError(where, key, f"a key of {kind} ({allowed})", f"unknown key {key}")
    params: dict[str, Any] = {}
    for key, minimum in keys.items():
        if key not in items:
            raise FieldError(where, key, f"an integer >= {minimum} (required for {kind})", MISSING)
        params[key] = _parse_int(where, key, items[key], minimum)
    if kind == "fattree" and params["k"] % 2:
        raise FieldError(where, "k", "an even integer >= 2", items["k"])
    bw = _parse_rate(where, "bw", items["bw"]) if "bw" in items else DEFAULT_LINK_MBPS
    params["bw"] = bw
    params["host_bw"] = _parse_rate(where, "host_bw", items["host_bw"]) if "host_bw" in items else bw
    params["switch_bw"] = _parse_rate(where, "switch_bw", items["switch_bw"]) if "switch_bw" in items else bw
    hosts, switches = _counts(kind, params)
    if hosts > MAX_HOSTS:
        raise FieldError(where, "hosts", f"at most {MAX_HOSTS} hosts in all", hosts)
    if switches > MAX_SWITCHES:
        raise FieldError(where, "switches", f"at most {MAX_SWITCHES} switches in all", switches)
    if kind != "star" and hosts < 2:
        raise FieldError(where, "hosts", "at least 2 hosts in all", hosts)
    return kind, params


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
    """The canonical spec string; rates are shown only where they differ from the default."""
    parts = [f"{key}={params[key]}" for key in _KIND_KEYS[kind]]
    bw = params.get("bw", DEFAULT_LINK_MBPS)
    if bw != DEFAULT_LINK_MBPS:
        parts.append(f"bw={bw:g}")
    for key in ("host_bw", "switch_bw"):
        if params.get(key, bw) != bw:
            parts.append(f"{key}={params[key]:g}")
    return f"{kind}:{','.join(parts)}"


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------

class _Builder:
    """Accumulates switches, hosts and links, numbering ports as it goes."""

    def __init__(self, host_bw: float, switch_bw: float):
        self.host_bw = host_bw
        self.switch_bw = switch_bw
        self.switches: list[Switch] = []
        self.hosts: list[Host] = []
        self.links: list[Link] = []
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

    def add_host(self, switch: str) -> str:
        index = len(self.hosts) + 1
        name = f"h{index}"
        port = self._port(switch)
        self.hosts.append(Host(name=name, index=index, switch=switch, switch_port=port,
                               ip=host_ip(index), mac=host_mac(index)))
        self.links.append(Link(name, 0, switch, port, self.host_bw, "host"))
        return name

    def connect(self, a: str, b: str) -> None:
        self.links.append(Link(a, self._port(a), b, self._port(b), self.switch_bw, "switch"))

    def build(self, kind: str, params: Mapping[str, Any]) -> Topology:
        return Topology(kind=kind, params=dict(params), hosts=tuple(self.hosts),
                        switches=tuple(self.switches), links=tuple(self.links))


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
            b.add_host(sw)
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
                b.add_host(edge)
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
            b.add_host(leaf)
    for leaf in leaves:
        for spine in spines:
            b.connect(leaf, spine)


def _build_star(b: _Builder, p: Mapping[str, Any]) -> None:
    sw = b.add_switch("star")
    for _ in range(p["hosts"]):
        b.add_host(sw)


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


def build(spec: str | Mapping[str, Any]) -> Topology:
    """Build the topology a spec describes (see the module docstring)."""
    kind, params = parse_spec(spec)
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


def load(source: str | Mapping[str, Any]) -> Topology:
    """A topology from a spec string, a spec mapping, or the path of a JSON export."""
    if isinstance(source, str) and (source.endswith(".json") or os.sep in source) and ":" not in source:
        try:
            with open(source, encoding="utf-8") as fh:
                data = json.load(fh)
        except OSError as exc:
            raise UserError(f"topology file {source!r}: cannot read it ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise UserError(f"topology file {source!r}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        return from_json(data, where=f"topology file {source!r}")
    return build(source)


def all_host_pairs(topo: Topology) -> Iterable[tuple[str, str]]:
    """Every ordered pair of distinct hosts."""
    names = [h.name for h in topo.hosts]
    return itertools.permutations(names, 2)
