"""Routing: which path every flow takes, and the flow entries that make it so.

Pure logic, no os-ken import: the controller app (``controllers/``) and the
static installer in :mod:`emulator.network` both turn :func:`flow_table` into
OpenFlow messages, and the schedule checker calls :func:`route` to predict
which links every transfer uses.

Policies (see :data:`POLICIES`):

* ``shortest`` -- one deterministic shortest path per destination (the naive
  baseline): among equal-cost next hops, the lowest-numbered neighbour.

Agent flows have fixed 5-tuples (:func:`agent_flow`), so a hash-based policy
predicts exactly the path the emulated TCP connection takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import networkx as nx

from emulator.errors import UserError
from emulator.topology import Topology, node_sort_key

POLICIES = ("shortest",)

#: Every host agent listens here.
AGENT_LISTEN_PORT = 7000
#: An agent connecting to host ``hJ`` binds source port ``AGENT_SOURCE_PORT_BASE + J``.
AGENT_SOURCE_PORT_BASE = 20000

IPPROTO_TCP = 6

#: Priorities of installed entries (higher wins).
PRIORITY_ARP = 300
PRIORITY_FLOW = 200
PRIORITY_DEST = 100


class NoPath(UserError):
    """The flow's endpoints are cut off from each other (e.g. after link failures)."""


@dataclass(frozen=True)
class Flow:
    """A transport flow between two hosts (ports 0 = any)."""

    src: str
    dst: str
    proto: int = IPPROTO_TCP
    sport: int = 0
    dport: int = 0


def agent_flow(topo: Topology, src: str, dst: str) -> Flow:
    """The 5-tuple of the TCP connection the agent on ``src`` opens to ``dst``'s agent."""
    return Flow(src, dst, IPPROTO_TCP, AGENT_SOURCE_PORT_BASE + topo.host(dst).index, AGENT_LISTEN_PORT)


@dataclass(frozen=True)
class FlowEntry:
    """One OpenFlow 1.3 entry: ``match`` uses os-ken OXM field names."""

    switch: str
    priority: int
    match: tuple[tuple[str, object], ...]
    out_port: int

    def match_dict(self) -> dict[str, object]:
        return dict(self.match)

    def ofctl(self) -> str:
        """The entry in ``ovs-ofctl add-flow`` syntax."""
        names = {"eth_type": "dl_type", "ipv4_src": "nw_src", "ipv4_dst": "nw_dst", "ip_proto": "nw_proto",
                 "tcp_src": "tp_src", "tcp_dst": "tp_dst", "arp_tpa": "arp_tpa", "in_port": "in_port"}
        parts = [f"priority={self.priority}"]
        for key, value in self.match:
            parts.append(f"{names[key]}={hex(value) if key == 'eth_type' else value}")
        return ",".join(parts) + f",actions=output:{self.out_port}"


def check_policy(topo: Topology, policy: str) -> None:
    """Raise :class:`UserError` unless ``policy`` is known and applies to ``topo``."""
    if policy not in POLICIES:
        raise UserError(f"routing: field 'policy': expected one of {', '.join(POLICIES)}, got {policy!r}")


def _usable_graph(topo: Topology, failed: Iterable[frozenset[str]]) -> nx.Graph:
    g = topo.graph
    dead = {frozenset(x) for x in failed}
    if not dead:
        return g
    return nx.restricted_view(g, [], [tuple(link) for link in dead])


def route(topo: Topology, policy: str, flow: Flow, *, seed: int = 0,
          failed: Iterable[frozenset[str]] = ()) -> list[str]:
    """The node path ``[src, switch..., dst]`` that ``flow`` takes under ``policy``.

    ``failed`` holds links (as frozensets of their two node names) that are down.
    Raises :class:`NoPath` when no path remains.
    """
    check_policy(topo, policy)
    g = _usable_graph(topo, failed)
    try:
        dist = nx.single_source_shortest_path_length(g, flow.dst)
    except nx.NodeNotFound:
        raise NoPath(f"routing: {flow.src} -> {flow.dst}: no path") from None
    if flow.src not in dist:
        raise NoPath(f"routing: {flow.src} -> {flow.dst}: no path")
    path = [flow.src]
    node = flow.src
    while node != flow.dst:
        candidates = [n for n in g.neighbors(node) if dist.get(n) == dist[node] - 1
                      and (n == flow.dst or topo.is_switch(n))]
        node = min(candidates, key=node_sort_key)
        path.append(node)
    return path


def path_links(path: list[str]) -> list[tuple[str, str]]:
    """The directed links ``(from, to)`` a path crosses."""
    return list(zip(path, path[1:]))


@dataclass
class _Table:
    entries: dict[str, list[FlowEntry]] = field(default_factory=dict)


def flow_table(topo: Topology, policy: str, *, seed: int = 0,
               failed: Iterable[frozenset[str]] = ()) -> dict[str, list[FlowEntry]]:
    """Every switch's entries for all host pairs under ``policy``.

    Destination-based: one entry per (switch, destination host), matching IPv4
    destination. Pairs cut off by ``failed`` links get no entry.
    """
    check_policy(topo, policy)
    failed = list(failed)
    table: dict[str, list[FlowEntry]] = {s.name: [] for s in topo.switches}
    installed: set[tuple[str, str]] = set()
    for dst in topo.hosts:
        for src in topo.hosts:
            if src.name == dst.name:
                continue
            try:
                path = route(topo, policy, Flow(src.name, dst.name), seed=seed, failed=failed)
            except NoPath:
                continue
            for here, nxt in path_links(path)[1:]:
                if (here, dst.name) in installed:
                    continue
                installed.add((here, dst.name))
                table[here].append(FlowEntry(here, PRIORITY_DEST,
                                             (("eth_type", 0x0800), ("ipv4_dst", dst.ip)),
                                             topo.port_to(here, nxt)))
    return table
