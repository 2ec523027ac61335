"""Routing: which path every flow takes, and the flow entries that make it so.

Pure logic, no os-ken import: the controller app (``controllers/``) and the
static installer in :mod:`emulator.network` both turn :func:`flow_table` into
OpenFlow messages, and the schedule checker calls :func:`route` to predict
which links every transfer uses. Whatever :func:`flow_table` installs forwards
every packet exactly along :func:`route` (checked by the unit tests with a fake
flow table).

How a path is built
    Hop by hop, from the source host towards the destination over links that
    are not ``failed``: at every switch the *candidates* are the neighbours one
    hop closer to the destination (shortest paths only; hosts are never
    transit). With one candidate there is no choice; with several, the policy
    chooses. Candidates are sorted by name (``s2`` before ``s10``).

Policies (see :data:`POLICIES`):

* ``shortest`` -- one deterministic shortest path per destination (the naive
  baseline): the first candidate, i.e. the lowest-numbered switch. Applies to
  every topology.
* ``dmodk`` -- destination-mod-k static routing for ``fattree`` and
  ``leafspine`` (the classic deterministic baseline). With ``d`` the
  destination's 0-based host number and ``r`` the fabric's up-radix (``k/2``
  for a fat-tree, the number of spines for a leaf-spine), a switch at stage
  ``t`` (edge/leaf 0, aggregation/spine 1, core 2) takes candidate
  ``(d // r**t) mod n`` of its ``n`` candidates: edge switches spread
  destinations over aggregation switches by ``d mod k/2``, aggregation
  switches over cores by ``(d // (k/2)) mod k/2``.
* ``bigraph`` -- topology-aware routing for ``bigraph`` only. Hosts in
  different groups take the unique direct path (their two switches and the
  upper-lower link between them). Hosts on different switches of the same
  group cross one switch of the other group: with ``a``, ``b`` the 0-based
  positions of the source's and destination's switch in their group, ``i``,
  ``j`` the 0-based positions of the two hosts on their switches, ``M``
  hosts per switch and ``n`` candidates, the source switch takes candidate
  ``(i + M*j + a + b) mod n``. For one pair of switches the ``M*M`` host
  pairs take consecutive values of ``i + M*j``, so they spread evenly over
  the other group (each middle switch carries ``floor`` or ``ceil`` of
  ``M*M/n`` of them), and ``a + b`` rotates the remainder between switch
  pairs. The same rule chooses at any other switch with several candidates
  (only after link failures).
* ``ecmp`` -- per-flow hashing as a datacenter switch does: a switch takes
  candidate ``H mod n`` where ``H`` is the first 8 bytes of BLAKE2b over
  ``"<seed>|<switch>|<src ip>|<dst ip>|<proto>|<sport>|<dport>"`` (the
  switch name is in the key so that consecutive switches do not polarise).
  Stable across processes and reproducible for a given ``--ecmp-seed``.
  Proactively installable flows hash their full 5-tuple: every agent
  connection (:func:`agent_flow`) in both directions. Any other traffic of a
  host pair (ping, iperf3, ...) hashes only ``<src ip>|<dst ip>`` (the
  fields with ``proto``, ``sport`` and ``dport`` empty) and so takes the
  pair's one fallback path. :func:`route` predicts both.

Entries (see :func:`flow_table`)
    ``PRIORITY_ARP`` forwards ARP by target address along the destination's
    path, so ARP never floods; ``PRIORITY_DEST`` matches the IPv4
    destination; ``PRIORITY_PAIR`` matches source and destination where a
    pair's path leaves the destination's default; ``PRIORITY_FLOW`` matches
    the whole 5-tuple where an agent connection leaves its pair's path. Pairs
    cut off by failed links get no entries.

Agent flows have fixed 5-tuples (:func:`agent_flow`), so a hash-based policy
predicts exactly the path the emulated TCP connection takes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from emulator.errors import FieldError, UserError
from emulator.topology import Topology, node_sort_key

POLICIES = ("bigraph", "dmodk", "ecmp", "shortest")

#: Topology kinds each policy applies to (``None``: every kind).
POLICY_KINDS: dict[str, tuple[str, ...] | None] = {
    "bigraph": ("bigraph",),
    "dmodk": ("fattree", "leafspine"),
    "ecmp": None,
    "shortest": None,
}

#: Every host agent listens here.
AGENT_LISTEN_PORT = 7000
#: An agent connecting to host ``hJ`` binds source port ``AGENT_SOURCE_PORT_BASE + J``.
AGENT_SOURCE_PORT_BASE = 20000

IPPROTO_ICMP = 1
IPPROTO_TCP = 6
ETH_TYPE_IP = 0x0800
ETH_TYPE_ARP = 0x0806

#: Priorities of installed entries (higher wins).
PRIORITY_ARP = 300
PRIORITY_FLOW = 200
PRIORITY_PAIR = 150
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


def exact_flows(topo: Topology, src: str, dst: str) -> tuple[Flow, Flow]:
    """The flows from ``src`` to ``dst`` that ``ecmp`` hashes by their full 5-tuple.

    The agent connection ``src`` opens to ``dst``, and the return direction
    of the one ``dst`` opens to ``src``.
    """
    back = agent_flow(topo, dst, src)
    return agent_flow(topo, src, dst), Flow(src, dst, back.proto, back.dport, back.sport)


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
            parts.append(f"{names[key]}={hex(int(value)) if key == 'eth_type' else value}")  # type: ignore[call-overload]
        return ",".join(parts) + f",actions=output:{self.out_port}"

    def key(self) -> tuple[str, int, tuple[tuple[str, object], ...]]:
        """What identifies the entry in its switch: switch, priority and match."""
        return (self.switch, self.priority, self.match)


def check_policy(topo: Topology, policy: str) -> None:
    """Raise :class:`UserError` unless ``policy`` is known and applies to ``topo``."""
    if policy not in POLICIES:
        raise FieldError("routing", "policy", f"one of {', '.join(POLICIES)}", policy)
    kinds = POLICY_KINDS[policy]
    if kinds is not None and topo.kind not in kinds:
        usable = ", ".join(p for p in POLICIES if topo.kind in (POLICY_KINDS[p] or (topo.kind,)))
        raise FieldError(f"routing for {topo.kind}", "policy",
                         f"one of {usable} ({policy} applies to {' and '.join(kinds)} only)", policy)


def _failed_set(failed: Iterable[Iterable[str]]) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(x) for x in failed)


def _usable_graph(topo: Topology, failed: frozenset[frozenset[str]]) -> nx.Graph:
    g = topo.graph
    if not failed:
        return g
    return nx.restricted_view(g, [], [tuple(link) for link in failed if len(link) == 2])


class _Router:
    """Shortest-path distances towards each destination under one set of failed links."""

    def __init__(self, topo: Topology, policy: str, seed: int, failed: Iterable[Iterable[str]]):
        check_policy(topo, policy)
        self.topo = topo
        self.policy = policy
        self.seed = int(seed)
        self.failed = _failed_set(failed)
        self.graph = _usable_graph(topo, self.failed)
        self._dist: dict[str, dict[str, int]] = {}
        self._cands: dict[tuple[str, str], list[str]] = {}
        if policy == "bigraph":
            self._group_pos = {}
            for role in ("upper", "lower"):
                for pos, sw in enumerate(s for s in topo.switches if s.role == role):
                    self._group_pos[sw.name] = pos
        if policy == "dmodk":
            self._radix = topo.params["k"] // 2 if topo.kind == "fattree" else topo.params["spines"]

    def dist(self, dst: str) -> dict[str, int]:
        if dst not in self._dist:
            self._dist[dst] = dict(nx.single_source_shortest_path_length(self.graph, dst))
        return self._dist[dst]

    def candidates(self, node: str, dst: str) -> list[str]:
        key = (node, dst)
        cands = self._cands.get(key)
        if cands is None:
            dist = self.dist(dst)
            here = dist.get(node)
            cands = [] if here is None else sorted(
                (n for n in self.graph.neighbors(node) if dist.get(n) == here - 1
                 and (n == dst or self.topo.is_switch(n))), key=node_sort_key)
            self._cands[key] = cands
        return cands

    # ------------------------------------------------------------- choices
    def dest_choice(self, node: str, cands: list[str], dst: str) -> str:
        """The next hop of the destination-only entry (``PRIORITY_DEST``)."""
        if len(cands) == 1 or self.policy != "dmodk":
            return cands[0]
        stage = {"edge": 0, "leaf": 0, "agg": 1, "spine": 1, "core": 2}.get(self.topo.switch(node).role, 0)
        d = self.topo.host(dst).index - 1
        return cands[(d // self._radix**stage) % len(cands)]

    def choice(self, node: str, cands: list[str], flow: Flow, exact: bool) -> str:
        """The next hop ``flow`` takes at ``node``; ``exact``: hash the whole 5-tuple (ecmp)."""
        if len(cands) == 1:
            return cands[0]
        if self.policy == "bigraph":
            src, dst = self.topo.host(flow.src), self.topo.host(flow.dst)
            m = self.topo.params["hosts_per_switch"]
            i, j = (src.switch_port - 1), (dst.switch_port - 1)
            a, b = self._group_pos[src.switch], self._group_pos[dst.switch]
            return cands[(i + m * j + a + b) % len(cands)]
        if self.policy == "ecmp":
            return cands[ecmp_hash(self.topo, self.seed, node, flow, exact) % len(cands)]
        return self.dest_choice(node, cands, flow.dst)

    def is_exact(self, flow: Flow) -> bool:
        """True for the flows of :func:`exact_flows` (checked without building them)."""
        if self.policy != "ecmp" or flow.proto != IPPROTO_TCP:
            return False
        if flow.dport == AGENT_LISTEN_PORT:
            return flow.sport == AGENT_SOURCE_PORT_BASE + self.topo.host(flow.dst).index
        return flow.sport == AGENT_LISTEN_PORT and flow.dport == AGENT_SOURCE_PORT_BASE + self.topo.host(flow.src).index

    def walk(self, flow: Flow) -> list[str]:
        """The node path of ``flow``; raises :class:`NoPath`."""
        self.topo.host(flow.src)
        self.topo.host(flow.dst)
        if flow.src == flow.dst:
            return [flow.src]
        if flow.src not in self.dist(flow.dst):
            raise NoPath(f"routing: {flow.src} -> {flow.dst}: no path (cut off by failed links)")
        exact = self.is_exact(flow)
        path = [flow.src]
        node = flow.src
        while node != flow.dst:
            node = self.choice(node, self.candidates(node, flow.dst), flow, exact)
            path.append(node)
        return path


def ecmp_hash(topo: Topology, seed: int, switch: str, flow: Flow, exact: bool) -> int:
    """The ``ecmp`` hash of ``flow`` at ``switch`` (see the module docstring)."""
    src, dst = topo.host(flow.src).ip, topo.host(flow.dst).ip
    tail = f"{flow.proto}|{flow.sport}|{flow.dport}" if exact else "||"
    key = f"{int(seed)}|{switch}|{src}|{dst}|{tail}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def route(topo: Topology, policy: str, flow: Flow, *, seed: int = 0,
          failed: Iterable[frozenset[str]] = ()) -> list[str]:
    """The node path ``[src, switch..., dst]`` that ``flow`` takes under ``policy``.

    ``failed`` holds links (as frozensets of their two node names) that are down;
    ``seed`` matters for ``ecmp`` only. Raises :class:`NoPath` when no path
    remains and :class:`UserError` for an unknown or inapplicable policy.
    """
    return _Router(topo, policy, seed, failed).walk(flow)


def path_links(path: list[str]) -> list[tuple[str, str]]:
    """The directed links ``(from, to)`` a path crosses."""
    return list(zip(path, path[1:], strict=False))


def switch_links_of(path: list[str]) -> list[tuple[str, str]]:
    """The directed switch-to-switch links of a path (host links left out)."""
    return path_links(path)[1:-1]


def cut_pairs(topo: Topology, failed: Iterable[frozenset[str]]) -> list[tuple[str, str]]:
    """Ordered host pairs with no path left when ``failed`` links are down."""
    g = _usable_graph(topo, _failed_set(failed))
    out: list[tuple[str, str]] = []
    for dst in topo.hosts:
        reach = nx.node_connected_component(g, dst.name)
        out.extend((src.name, dst.name) for src in topo.hosts if src.name != dst.name and src.name not in reach)
    return sorted(out, key=lambda p: (node_sort_key(p[0]), node_sort_key(p[1])))


def link_sharing(topo: Topology, policy: str, flows: Iterable[Flow], *, seed: int = 0,
                 failed: Iterable[frozenset[str]] = ()) -> dict[tuple[str, str], list[Flow]]:
    """Directed switch-to-switch links that two or more of ``flows`` cross, with those flows.

    Flows that are cut off are left out.
    """
    router = _Router(topo, policy, seed, failed)
    users: dict[tuple[str, str], list[Flow]] = {}
    for flow in flows:
        try:
            path = router.walk(flow)
        except NoPath:
            continue
        for link in switch_links_of(path):
            users.setdefault(link, []).append(flow)
    return {link: fl for link, fl in sorted(users.items(), key=lambda kv: (node_sort_key(kv[0][0]),
                                                                          node_sort_key(kv[0][1])))
            if len(fl) > 1}


def all_agent_flows(topo: Topology) -> list[Flow]:
    """The agent connection of every ordered host pair."""
    return [agent_flow(topo, s.name, d.name) for s in topo.hosts for d in topo.hosts if s.name != d.name]


def _ip_match(topo: Topology, flow: Flow, exact: bool) -> tuple[tuple[str, object], ...]:
    src, dst = topo.host(flow.src).ip, topo.host(flow.dst).ip
    if not exact:
        return (("eth_type", ETH_TYPE_IP), ("ipv4_src", src), ("ipv4_dst", dst))
    ports = (("tcp_src", flow.sport), ("tcp_dst", flow.dport)) if flow.proto == IPPROTO_TCP else ()
    return (("eth_type", ETH_TYPE_IP), ("ip_proto", flow.proto), ("ipv4_src", src), ("ipv4_dst", dst), *ports)


def flow_table(topo: Topology, policy: str, *, seed: int = 0,
               failed: Iterable[frozenset[str]] = ()) -> dict[str, list[FlowEntry]]:
    """Every switch's entries for all host pairs under ``policy`` (see the module docstring).

    Per (switch, destination): an ARP entry and an IPv4-destination entry
    along the destination's default next hop. Per pair, where its path leaves
    that default: a source+destination entry (``bigraph``, ``ecmp``). Per
    agent connection, where it leaves its pair's path: a 5-tuple entry
    (``ecmp``). Pairs cut off by ``failed`` links get no entry. Entries are in
    a deterministic order.
    """
    router = _Router(topo, policy, seed, failed)
    table: dict[str, list[FlowEntry]] = {s.name: [] for s in topo.switches}
    for dst_host in topo.hosts:
        dst = dst_host.name
        default: dict[str, str] = {}
        for sw in topo.switches:
            cands = router.candidates(sw.name, dst)
            if not cands:
                continue
            nxt = default[sw.name] = router.dest_choice(sw.name, cands, dst)
            port = topo.port_to(sw.name, nxt)
            table[sw.name].append(FlowEntry(sw.name, PRIORITY_ARP,
                                            (("eth_type", ETH_TYPE_ARP), ("arp_tpa", dst_host.ip)), port))
            table[sw.name].append(FlowEntry(sw.name, PRIORITY_DEST,
                                            (("eth_type", ETH_TYPE_IP), ("ipv4_dst", dst_host.ip)), port))
        if policy not in ("bigraph", "ecmp"):
            continue
        for src_host in topo.hosts:
            src = src_host.name
            if src == dst or src not in router.dist(dst):
                continue
            pair = Flow(src, dst, 0)
            pair_path = router.walk(pair)
            pair_next = dict(path_links(pair_path))
            for here, nxt in path_links(pair_path)[1:]:
                if nxt != default[here]:
                    table[here].append(FlowEntry(here, PRIORITY_PAIR, _ip_match(topo, pair, False),
                                                 topo.port_to(here, nxt)))
            if policy != "ecmp":
                continue
            for flow in exact_flows(topo, src, dst):
                for here, nxt in path_links(router.walk(flow))[1:]:
                    if nxt != pair_next.get(here, default[here]):
                        table[here].append(FlowEntry(here, PRIORITY_FLOW, _ip_match(topo, flow, True),
                                                     topo.port_to(here, nxt)))
    return table
