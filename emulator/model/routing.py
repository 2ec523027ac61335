"""Routing: which path every flow takes, and the flow entries that make it so.

Pure logic, no os-ken import: the controller app (``controllers/``) and the
static installer in :mod:`emulator.emulation.network.emulated_network` both turn :func:`flow_table` into
OpenFlow messages, and the schedule checker calls :func:`route` to predict
which links every transfer uses. Whatever :func:`flow_table` installs forwards
every packet exactly along :func:`route` (checked by the unit tests with a fake
flow table): under ``ecmp`` its reactive table together with the
:func:`learned_entries` the controller adds on a miss; the static table
leaves TCP flows other than the agents' on their pair's path (see below).

How a path is built
    A host enters the fabric at its *slot*: its own switch, or with servers
    (:mod:`emulator.model.topology`) the fabric switch of its pinned NIC, reached
    through its server's PCIe switch (:meth:`~emulator.model.topology.Topology.access_path`).
    Inside the fabric the path goes hop by hop, from the source's slot switch
    towards the destination's over fabric links that are not ``failed``: at
    every switch the *candidates* are the fabric neighbours one hop closer to
    the destination's slot switch (shortest paths only; hosts and PCIe
    switches are never transit). With one candidate there is no choice; with
    several, the policy chooses. Candidates are sorted by name (``s2`` before
    ``s10``). From the destination's slot switch the path leaves the fabric the
    way the destination's traffic enters it. So between servers a path is
    ``src, its PCIe switch, slot switch of src's NIC, ..., slot switch of
    dst's NIC, dst's PCIe switch, dst``; two accelerators of one server talk
    through their PCIe switch only. An accelerator uses its pinned NIC and no
    other, in both directions: when that NIC's link fails it is cut off from
    every other server. The exception is ``railonly``, which has no spines:
    there an accelerator's traffic to another server leaves by its server's
    NIC on the receiver's rail (:meth:`~emulator.model.topology.Topology.egress_nic`;
    the server's switch holds one destination entry per such receiver) and
    arrives by the receiver's pinned NIC. On ``dualplane`` a host's slot is
    its NIC's own switch: paths start and end there and never cross another
    (a NIC does not forward between planes; :meth:`_Reach.transit`).
    ``failed`` links are node pairs, so when a server has several NICs on
    one fabric switch their parallel links fail together.

The policies below read a host's *slot* where they read its switch, port or
number: for a host without servers that is its own switch, ``switch_port - 1``
and ``index - 1``; with servers the same of its pinned NIC's slot
(:meth:`~emulator.model.topology.Topology.nic_slot`).

Policies (see :data:`POLICIES`):

* ``shortest`` -- one deterministic shortest path per destination (the naive
  baseline): the first candidate, i.e. the lowest-numbered switch. Applies to
  every topology.
* ``dmodk`` -- destination-mod-k static routing for ``fattree`` and
  ``leafspine`` (the classic deterministic baseline). With ``d`` the
  destination's 0-based host number and ``r`` the fabric's up-radix (``k/2``
  for a fat-tree, the number of spines for a leaf-spine), a switch at stage
  ``t`` (edge/leaf 0, aggregation/spine 1, core 2) takes candidate
  ``(d // r**t) mod n`` of its ``n`` candidates (``d``: the global slot index): edge switches spread
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
  Every TCP flow with both ports nonzero hashes its full 5-tuple (each
  direction of a connection on its own, as a real fabric does): agent
  connections (:func:`agent_flow`), MPI, iperf3, any client. Everything else
  of a host pair (ICMP, UDP, ARP, ``Flow(src, dst, 0)``) hashes only
  ``<src ip>|<dst ip>`` (the fields with ``proto``, ``sport`` and ``dport``
  empty) and so takes the pair's one fallback path. :func:`route` predicts
  both: ``route(topo, "ecmp", Flow(src, dst, 6, sport, dport), seed=s)`` is
  the path of any TCP connection under the controller started with seed
  ``s``.

Entries (see :func:`flow_table`)
    ``PRIORITY_ARP`` forwards ARP by target address along the destination's
    path, so ARP never floods; ``PRIORITY_DEST`` matches the IPv4
    destination; ``PRIORITY_PAIR`` matches source and destination where a
    pair's path leaves the destination's default; ``PRIORITY_FLOW`` matches
    the whole 5-tuple of an agent connection where it leaves its pair's
    path. Pairs cut off by failed links get no entries. A PCIe switch holds
    ARP and destination entries for its own accelerators only, and per
    accelerator one ``PRIORITY_UPLINK`` entry matching nothing but its
    ``in_port``: every other packet from that accelerator (any protocol, ARP
    included) goes out of its pinned NIC. Packets arriving from a NIC for
    anything but the server's own accelerators match nothing and are
    dropped.

Reactive entries (``ecmp`` under the controller: ``flow_table(...,
reactive=True)``)
    Connections other than the agents' have 5-tuples nobody knows in
    advance, so the controller learns them. A *choice point* is a (fabric
    switch, destination) where the switch has more than one candidate
    towards the destination's slot switch. At every choice point one
    ``PRIORITY_TCP_MISS`` entry (between ``PRIORITY_FLOW`` and
    ``PRIORITY_PAIR``) sends IPv4 TCP packets to that destination to the
    controller (``out_port`` :data:`CONTROLLER_PORT`), and the agents' exact
    entries are installed at every choice point of their paths (not only
    where they leave the pair's path), so agent packets never miss. On a
    miss the controller installs :func:`learned_entries` of both directions
    of the connection (``PRIORITY_FLOW``, 5-tuple match, at every choice
    point of each direction's path, idle timeout :data:`LEARNED_IDLE_TIMEOUT`,
    cookie :data:`LEARNED_COOKIE`) and sends the packet on by
    :meth:`Learner.out_port`. ICMP, UDP and ARP never miss: they keep the
    pair path. The static installer (:mod:`emulator.emulation.network.emulated_network` without a
    controller) uses the proactive table, ``reactive=False``: there every
    TCP flow but the agents' takes the pair's fallback path, which
    :func:`route` does not predict for flows with both ports nonzero.

Agent flows have fixed 5-tuples (:func:`agent_flow`), so a hash-based policy
predicts exactly the path the emulated TCP connection takes; any other TCP
connection's path is predicted from its 5-tuple once its ports are known.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from emulator.base.errors import FieldError, UserError
from emulator.model.topology import KINDS, NIC_ROLE, Topology, all_host_pairs, node_sort_key

POLICIES = ("bigraph", "dmodk", "ecmp", "shortest")
#: The policies that apply to every kind; the others apply to the kinds whose registration names them.
EVERY_KIND_POLICIES = ("ecmp", "shortest")

#: Topology kinds each policy applies to (``None``: every kind), read from the kinds' registrations
#: (:data:`emulator.model.topology.kinds.KINDS`).
POLICY_KINDS: dict[str, tuple[str, ...] | None] = {
    policy: None if policy in EVERY_KIND_POLICIES else tuple(k.name for k in KINDS.values() if policy in k.policies)
    for policy in POLICIES
}

#: Every host agent listens here.
AGENT_LISTEN_PORT = 7000
#: An agent connecting to host ``hJ`` on lane ``L`` binds source port ``AGENT_SOURCE_PORT_BASE + L·n + J``
#: (``n`` hosts in the topology; lane 0 is ``BASE + J``).
AGENT_SOURCE_PORT_BASE = 20000
#: Agents' source ports stay below Linux's ephemeral range (32768..), which no other connection may then take.
MAX_AGENT_SOURCE_PORT = 32767

IPPROTO_ICMP = 1
IPPROTO_TCP = 6
ETH_TYPE_IP = 0x0800
ETH_TYPE_ARP = 0x0806

#: Priorities of installed entries (higher wins).
PRIORITY_ARP = 300
PRIORITY_FLOW = 200
PRIORITY_TCP_MISS = 175
PRIORITY_PAIR = 150
PRIORITY_DEST = 100
PRIORITY_UPLINK = 50

#: ``out_port`` of an entry that sends the packet to the controller (OpenFlow's ``OFPP_CONTROLLER``).
CONTROLLER_PORT = 0xFFFFFFFD
#: Seconds without a packet after which a switch drops a learned connection's entry (the next packet re-learns it).
LEARNED_IDLE_TIMEOUT = 120
#: The cookie of every learned entry: a reroute deletes them all by it.
LEARNED_COOKIE = 0xEF10_0000_0000_0001


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


def max_lanes(topo: Topology) -> int:
    """How many lanes (connections per ordered host pair) the agents' source ports leave room for."""
    return (MAX_AGENT_SOURCE_PORT - AGENT_SOURCE_PORT_BASE) // len(topo.hosts)


def agent_flow(topo: Topology, src: str, dst: str, lane: int = 0) -> Flow:
    """The 5-tuple of the TCP connection the agent on ``src`` opens to ``dst``'s agent on ``lane``."""
    if not 0 <= lane < max_lanes(topo):
        raise ValueError(f"lane {lane} outside 0..{max_lanes(topo) - 1} for {len(topo.hosts)} hosts")
    sport = AGENT_SOURCE_PORT_BASE + lane * len(topo.hosts) + topo.host(dst).index
    return Flow(src, dst, IPPROTO_TCP, sport, AGENT_LISTEN_PORT)


def agent_lane(topo: Topology, src: str, dst: str, sport: int) -> int | None:
    """The lane of the agent connection ``src`` opens to ``dst`` from ``sport`` (None: not an agent's port)."""
    offset = sport - AGENT_SOURCE_PORT_BASE - topo.host(dst).index
    lane, rest = divmod(offset, len(topo.hosts))
    return lane if rest == 0 and 0 <= lane < max_lanes(topo) else None


def exact_flows(topo: Topology, src: str, dst: str, lanes: int = 1) -> list[Flow]:
    """The agent flows from ``src`` to ``dst`` whose 5-tuple entries ``ecmp`` installs proactively.

    Per lane below ``lanes``: the agent connection ``src`` opens to ``dst``,
    and the return direction of the one ``dst`` opens to ``src``. (``ecmp``
    hashes every TCP flow by its 5-tuple; these are the ones known in advance.)
    """
    out = []
    for lane in range(lanes):
        back = agent_flow(topo, dst, src, lane)
        out += [agent_flow(topo, src, dst, lane), Flow(src, dst, back.proto, back.dport, back.sport)]
    return out


@dataclass(frozen=True)
class FlowEntry:
    """One OpenFlow 1.3 entry: ``match`` uses os-ken OXM field names.

    ``out_port`` :data:`CONTROLLER_PORT` sends the packet to the controller;
    ``idle_timeout`` (seconds, 0: none) and ``cookie`` are set on learned
    entries only.
    """

    switch: str
    priority: int
    match: tuple[tuple[str, object], ...]
    out_port: int
    idle_timeout: int = 0
    cookie: int = 0

    def match_dict(self) -> dict[str, object]:
        return dict(self.match)

    def ofctl(self) -> str:
        """The entry in ``ovs-ofctl add-flow`` syntax."""
        names = {"eth_type": "dl_type", "ipv4_src": "nw_src", "ipv4_dst": "nw_dst", "ip_proto": "nw_proto",
                 "tcp_src": "tp_src", "tcp_dst": "tp_dst", "arp_tpa": "arp_tpa", "in_port": "in_port"}
        parts = [f"cookie={hex(self.cookie)}"] if self.cookie else []
        parts += [f"idle_timeout={self.idle_timeout}"] if self.idle_timeout else []
        parts.append(f"priority={self.priority}")
        for key, value in self.match:
            parts.append(f"{names[key]}={hex(int(value)) if key == 'eth_type' else value}")  # type: ignore[call-overload]
        action = "controller" if self.out_port == CONTROLLER_PORT else f"output:{self.out_port}"
        return ",".join(parts) + f",actions={action}"

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


class _Reach:
    """Who reaches whom under one set of failed links: pinned access paths and fabric distances."""

    def __init__(self, topo: Topology, failed: Iterable[Iterable[str]]):
        self.topo = topo
        self.failed = _failed_set(failed)
        hidden = [tuple(link) for link in self.failed if len(link) == 2]
        self.fabric = nx.restricted_view(topo.fabric_graph, [], hidden) if hidden else topo.fabric_graph
        self._dist: dict[str, dict[str, int]] = {}
        self._access: dict[str, list[str] | None] = {}
        self.nic_switches = frozenset(s.name for s in topo.switches if s.role == NIC_ROLE)

    def up(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.failed

    def access(self, host: str) -> list[str] | None:
        """``host`` up to the fabric switch of its slot, or None when a link of that is down."""
        if host not in self._access:
            path = self.topo.access_path(host)
            self._access[host] = path if all(self.up(a, b) for a, b in path_links(path)) else None
        return self._access[host]

    def egress(self, src: str, dst: str) -> list[str] | None:
        """``src`` up to the fabric switch its traffic to ``dst`` enters by, or None when a link of that is down
        (the access path but on a rail-only fabric, :meth:`~emulator.model.topology.Topology.egress_path`)."""
        if not self.topo.rail_only:
            return self.access(src)
        path = self.topo.egress_path(src, dst)
        return path if all(self.up(a, b) for a, b in path_links(path)) else None

    def transit(self, node: str, target: str) -> bool:
        """Whether a path towards ``target`` may cross fabric switch ``node``: not a dual-plane NIC's switch
        (a NIC does not forward from one plane to the other)."""
        return node == target or node not in self.nic_switches

    def dist(self, target: str) -> dict[str, int]:
        """Fabric hops from every fabric switch that still reaches fabric switch ``target`` (crossing only
        switches that may be :meth:`transit`)."""
        if target not in self._dist:
            dist = {target: 0}
            frontier = [target]
            while frontier:
                ahead = []
                for node in frontier:
                    if not self.transit(node, target):
                        continue
                    for nxt in self.fabric.neighbors(node):
                        if nxt not in dist:
                            dist[nxt] = dist[node] + 1
                            ahead.append(nxt)
                frontier = ahead
            self._dist[target] = dist
        return self._dist[target]

    def reachable(self, src: str, dst: str) -> bool:
        if self.topo.same_server(src, dst):
            switch = self.topo.host(src).switch
            return self.up(src, switch) and self.up(dst, switch)
        a, b = self.egress(src, dst), self.access(dst)
        return a is not None and b is not None and a[-1] in self.dist(b[-1])


class _Router(_Reach):
    """Paths and next hops of one policy under one set of failed links."""

    def __init__(self, topo: Topology, policy: str, seed: int, failed: Iterable[Iterable[str]]):
        check_policy(topo, policy)
        super().__init__(topo, failed)
        self.policy = policy
        self.seed = int(seed)
        self._cands: dict[tuple[str, str], list[str]] = {}
        if policy == "bigraph":
            self._group_pos = {}
            for role in ("upper", "lower"):
                for pos, sw in enumerate(s for s in topo.switches if s.role == role):
                    self._group_pos[sw.name] = pos
        if policy == "dmodk":
            self._radix = topo.params["k"] // 2 if topo.kind == "fattree" else topo.params["spines"]

    def candidates(self, node: str, target: str) -> list[str]:
        """Fabric neighbours of fabric switch ``node`` one hop closer to fabric switch ``target``."""
        key = (node, target)
        cands = self._cands.get(key)
        if cands is None:
            dist = self.dist(target)
            here = dist.get(node)
            cands = [] if here is None else sorted(
                (n for n in self.fabric.neighbors(node) if dist.get(n) == here - 1 and self.transit(n, target)),
                key=node_sort_key)
            self._cands[key] = cands
        return cands

    def fabric_hops(self, path: list[str]) -> list[tuple[str, str]]:
        """The directed links of ``path`` leaving a fabric switch: where the policy's entries act."""
        return [(a, b) for a, b in path_links(path) if self.topo.is_fabric_switch(a)]

    # ------------------------------------------------------------- choices
    def dest_next(self, switch: str, dst: str) -> str | None:
        """The next hop of the destination entries (``PRIORITY_DEST``) at ``switch``; None: no entry."""
        host = self.topo.host(dst)
        if switch == host.switch:
            return dst if self.up(dst, switch) else None
        if self.topo.rail_only and self.topo.is_pcie_switch(switch):  # towards the NIC on dst's rail
            up = self.egress(server_sender(self.topo, switch), dst) if self.access(dst) is not None else None
            return None if up is None else up[-1]
        access = self.access(dst)
        if access is None or not self.topo.is_fabric_switch(switch):
            return None
        if switch == access[-1]:
            return access[-2]
        cands = self.candidates(switch, access[-1])
        return self.dest_choice(switch, cands, dst) if cands else None

    def dest_choice(self, node: str, cands: list[str], dst: str) -> str:
        """The destination-only choice among several fabric candidates."""
        if len(cands) == 1 or self.policy != "dmodk":
            return cands[0]
        stage = {"edge": 0, "leaf": 0, "agg": 1, "spine": 1, "core": 2}.get(self.topo.switch(node).role, 0)
        d = self.topo.nic_slot(dst)[2]
        return cands[(d // self._radix**stage) % len(cands)]

    def choice(self, node: str, cands: list[str], flow: Flow, exact: bool) -> str:
        """The next hop ``flow`` takes at ``node``; ``exact``: hash the whole 5-tuple (ecmp)."""
        if len(cands) == 1:
            return cands[0]
        if self.policy == "bigraph":
            src_switch, i, _ = self.topo.nic_slot(flow.src)
            dst_switch, j, _ = self.topo.nic_slot(flow.dst)
            m = self.topo.params["hosts_per_switch"]
            a, b = self._group_pos[src_switch], self._group_pos[dst_switch]
            return cands[(i + m * j + a + b) % len(cands)]
        if self.policy == "ecmp":
            return cands[ecmp_hash(self.topo, self.seed, node, flow, exact) % len(cands)]
        return self.dest_choice(node, cands, flow.dst)

    def is_exact(self, flow: Flow) -> bool:
        """True when ``ecmp`` hashes ``flow``'s whole 5-tuple: TCP with both ports nonzero."""
        return self.policy == "ecmp" and flow.proto == IPPROTO_TCP and flow.sport != 0 and flow.dport != 0

    def is_choice(self, switch: str, dst: str) -> bool:
        """True at a choice point: fabric ``switch`` has several candidates towards ``dst``'s slot switch."""
        access = self.access(dst)
        return (access is not None and self.topo.is_fabric_switch(switch)
                and len(self.candidates(switch, access[-1])) > 1)

    def flow_next(self, switch: str, flow: Flow) -> str | None:
        """The node a packet of ``flow`` at ``switch`` goes to next (None: no way on).

        On ``flow``'s path that is the next node of :meth:`walk`; off it (a
        packet in flight across a reroute) the switch's own choice for the flow.
        """
        if not self.reachable(flow.src, flow.dst):
            return None
        if switch == self.topo.host(flow.dst).switch:
            return flow.dst
        access = self.access(flow.dst)
        if access is None or not self.topo.is_fabric_switch(switch):
            return None
        if switch == access[-1]:
            return access[-2]
        cands = self.candidates(switch, access[-1])
        return self.choice(switch, cands, flow, self.is_exact(flow)) if cands else None

    def learned(self, flow: Flow) -> list[FlowEntry]:
        """The learned 5-tuple entries of ``flow`` (see :func:`learned_entries`)."""
        if not self.is_exact(flow) or flow.src == flow.dst or not self.reachable(flow.src, flow.dst):
            return []
        match = _ip_match(self.topo, flow, True)
        return [FlowEntry(here, PRIORITY_FLOW, match, hop_port(self.topo, here, nxt, flow.src, flow.dst),
                          LEARNED_IDLE_TIMEOUT, LEARNED_COOKIE)
                for here, nxt in self.fabric_hops(self.walk(flow)) if self.is_choice(here, flow.dst)]

    def walk(self, flow: Flow) -> list[str]:
        """The node path of ``flow``; raises :class:`NoPath`."""
        self.topo.host(flow.src)
        self.topo.host(flow.dst)
        if flow.src == flow.dst:
            return [flow.src]
        if not self.reachable(flow.src, flow.dst):
            raise NoPath(f"routing: {flow.src} -> {flow.dst}: no path (cut off by failed links)")
        if self.topo.same_server(flow.src, flow.dst):
            return [flow.src, self.topo.host(flow.src).switch, flow.dst]
        up, down = self.egress(flow.src, flow.dst), self.access(flow.dst)
        assert up is not None and down is not None
        exact = self.is_exact(flow)
        path = list(up)
        node = up[-1]
        while node != down[-1]:
            node = self.choice(node, self.candidates(node, down[-1]), flow, exact)
            path.append(node)
        return path + down[-2::-1]


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


def routes(topo: Topology, policy: str, flows: Iterable[Flow], *, seed: int = 0,
           failed: Iterable[frozenset[str]] = ()) -> list[list[str]]:
    """:func:`route` of every flow, in order, with one router: its fabric distances and candidates are
    computed once instead of once per flow (what makes routing thousands of flows fast)."""
    router = _Router(topo, policy, seed, failed)
    return [router.walk(flow) for flow in flows]


class Learner:
    """What the controller learns about TCP connections under one policy and one set of failed links.

    One router for every question, so fabric distances are computed once per
    reroute, not once per packet-in.
    """

    def __init__(self, topo: Topology, policy: str, *, seed: int = 0, failed: Iterable[frozenset[str]] = ()):
        self.topo = topo
        self._router = _Router(topo, policy, seed, failed)

    def entries(self, flow: Flow) -> list[FlowEntry]:
        """:func:`learned_entries` of ``flow``."""
        return self._router.learned(flow)

    def out_port(self, switch: str, flow: Flow) -> int | None:
        """The port a packet of ``flow`` leaves ``switch`` by (None: drop, e.g. the pair is cut off)."""
        nxt = self._router.flow_next(switch, flow)
        return None if nxt is None else hop_port(self.topo, switch, nxt, flow.src, flow.dst)


def learned_entries(topo: Topology, policy: str, flow: Flow, *, seed: int = 0,
                    failed: Iterable[frozenset[str]] = ()) -> list[FlowEntry]:
    """The entries that make one direction of a TCP connection take its :func:`route`.

    One ``PRIORITY_FLOW`` entry matching ``flow``'s 5-tuple at every choice
    point of its path (where the switch has several candidates), in path
    order, with :data:`LEARNED_IDLE_TIMEOUT` and :data:`LEARNED_COOKIE`.
    Empty unless ``policy`` hashes ``flow`` exactly (``ecmp``, TCP, both
    ports nonzero) and the pair has a path.
    """
    return Learner(topo, policy, seed=seed, failed=failed).entries(flow)


def path_links(path: list[str]) -> list[tuple[str, str]]:
    """The directed links ``(from, to)`` a path crosses."""
    return list(zip(path, path[1:], strict=False))


def hop_port(topo: Topology, node: str, nxt: str, src: str, dst: str) -> int:
    """The port ``node`` sends on towards ``nxt`` on a path from host ``src`` to host ``dst``.

    Tells parallel NIC links apart: leaving a PCIe switch a packet takes
    ``src``'s egress NIC towards ``dst`` (its pinned NIC but on a rail-only
    fabric), entering one ``dst``'s pinned NIC. A host sends on port 0.
    """
    if topo.is_host(node):
        return 0
    if topo.is_pcie_switch(node) and topo.is_switch(nxt):
        return topo.egress_nic(src, dst).a_port
    if topo.is_pcie_switch(nxt) and topo.is_switch(node):
        return topo.pinned_nic(dst).b_port
    return topo.port_to(node, nxt)


def server_sender(topo: Topology, pcie: str) -> str:
    """An accelerator of the server whose switch is ``pcie``: its traffic to any other server's accelerator
    leaves by the same NIC as that of every accelerator of the server (on a rail-only fabric)."""
    return topo.hosts_of(pcie)[0].name


def directed_links(topo: Topology, path: list[str]) -> list[tuple[str, int]]:
    """Each hop of ``path`` as ``(node, port it sends on)``: one directed physical link.

    Unlike :func:`path_links` this tells apart the parallel links of a
    server whose NICs share a fabric switch; ``topo.link_at(node, port)``
    gives the :class:`~emulator.model.topology.Link`.
    """
    return [(a, hop_port(topo, a, b, path[0], path[-1])) for a, b in path_links(path)]


def switch_links_of(path: list[str]) -> list[tuple[str, str]]:
    """The directed switch-to-switch links of a path (host links left out)."""
    return path_links(path)[1:-1]


def cut_pairs(topo: Topology, failed: Iterable[frozenset[str]]) -> list[tuple[str, str]]:
    """Ordered host pairs with no path left when ``failed`` links are down (pinned NICs only, with servers)."""
    reach = _Reach(topo, failed)
    if topo.rail_only or reach.nic_switches:  # the way out depends on the receiver, or some switches are no transit
        return [(s, d) for s, d in all_host_pairs(topo) if not reach.reachable(s, d)]
    component = {node: i for i, part in enumerate(nx.connected_components(reach.fabric)) for node in part}
    where = {}
    for h in topo.hosts:
        access = reach.access(h.name)
        where[h.name] = None if access is None else component[access[-1]]
    out: list[tuple[str, str]] = []
    for src in topo.hosts:
        for dst in topo.hosts:
            if src.name == dst.name:
                continue
            if topo.same_server(src.name, dst.name):
                ok = reach.up(src.name, src.switch) and reach.up(dst.name, dst.switch)
            else:
                ok = where[src.name] is not None and where[src.name] == where[dst.name]
            if not ok:
                out.append((src.name, dst.name))
    return out


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


def flow_table(topo: Topology, policy: str, *, seed: int = 0, failed: Iterable[frozenset[str]] = (),
               lanes: int = 1, reactive: bool = False) -> dict[str, list[FlowEntry]]:
    """Every switch's entries for all host pairs under ``policy`` (see the module docstring).

    Per (switch, destination): an ARP entry and an IPv4-destination entry
    along the destination's default next hop. Per pair, where its path leaves
    that default: a source+destination entry (``bigraph``, ``ecmp``). Per
    agent connection (``lanes`` per ordered pair), where it leaves its pair's
    path: a 5-tuple entry (``ecmp``). With servers, per accelerator an ``in_port`` entry on its PCIe
    switch towards its pinned NIC. Pairs cut off by ``failed`` links get no
    entry. Entries are in a deterministic order.

    ``reactive`` (``ecmp`` only, for a controller that learns connections):
    per choice point a ``PRIORITY_TCP_MISS`` entry sending TCP to the
    destination to the controller, and the agent connections' 5-tuple
    entries at every choice point of their paths. Without it (the static
    installer) TCP flows other than the agents' take their pair's path.
    """
    router = _Router(topo, policy, seed, failed)
    reactive = reactive and policy == "ecmp"
    table: dict[str, list[FlowEntry]] = {s.name: [] for s in topo.switches}
    if topo.has_servers:
        for h in topo.hosts:
            access = router.access(h.name)
            if access is not None:
                table[h.switch].append(FlowEntry(h.switch, PRIORITY_UPLINK, (("in_port", h.switch_port),),
                                                 topo.pinned_nic(h.name).a_port))
    for dst_host in topo.hosts:
        dst = dst_host.name
        default: dict[str, str] = {}
        for sw in topo.switches:
            nxt = router.dest_next(sw.name, dst)
            if nxt is None:
                continue
            default[sw.name] = nxt
            sender = server_sender(topo, sw.name) if topo.is_pcie_switch(sw.name) else dst
            port = hop_port(topo, sw.name, nxt, sender, dst)
            table[sw.name].append(FlowEntry(sw.name, PRIORITY_ARP,
                                            (("eth_type", ETH_TYPE_ARP), ("arp_tpa", dst_host.ip)), port))
            table[sw.name].append(FlowEntry(sw.name, PRIORITY_DEST,
                                            (("eth_type", ETH_TYPE_IP), ("ipv4_dst", dst_host.ip)), port))
            if reactive and router.is_choice(sw.name, dst):
                table[sw.name].append(FlowEntry(sw.name, PRIORITY_TCP_MISS,
                                                (("eth_type", ETH_TYPE_IP), ("ip_proto", IPPROTO_TCP),
                                                 ("ipv4_dst", dst_host.ip)), CONTROLLER_PORT))
        if policy not in ("bigraph", "ecmp"):
            continue
        for src_host in topo.hosts:
            src = src_host.name
            if src == dst or not router.reachable(src, dst):
                continue
            pair = Flow(src, dst, 0)
            hops = router.fabric_hops(router.walk(pair))
            pair_next = dict(hops)
            for here, nxt in hops:
                if nxt != default[here]:
                    table[here].append(FlowEntry(here, PRIORITY_PAIR, _ip_match(topo, pair, False),
                                                 hop_port(topo, here, nxt, src, dst)))
            if policy != "ecmp":
                continue
            for flow in exact_flows(topo, src, dst, lanes):
                for here, nxt in router.fabric_hops(router.walk(flow)):
                    if nxt != pair_next.get(here, default[here]) or (reactive and router.is_choice(here, dst)):
                        table[here].append(FlowEntry(here, PRIORITY_FLOW, _ip_match(topo, flow, True),
                                                     hop_port(topo, here, nxt, src, dst)))
    return table
