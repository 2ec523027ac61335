"""Routing policies, checked with a tiny fake flow table: "a packet from h3 to h12 leaves s5 on port p"."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.base.errors import UserError
from emulator.model import routing, topology
from emulator.model.routing import Flow, FlowEntry

BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"
FATTREE = "fattree:k=4"
LEAFSPINE = "leafspine:leaves=4,spines=2,hosts_per_leaf=4"
RAIL = "rail:rails=4,hosts_per_rail=3,spines=2"
DUALPLANE = "dualplane:rails=3,hosts_per_rail=2,spines=2"
CASES = [(BIGRAPH, "bigraph"), (BIGRAPH, "ecmp"), (BIGRAPH, "shortest"),
         (FATTREE, "ecmp"), (FATTREE, "dmodk"), (FATTREE, "shortest"),
         (LEAFSPINE, "ecmp"), (LEAFSPINE, "dmodk"), (LEAFSPINE, "shortest"),
         ("star:hosts=4", "shortest"), ("star:hosts=4", "ecmp"),
         (RAIL, "ecmp"), (RAIL, "dmodk"), (RAIL, "shortest"), (DUALPLANE, "ecmp"), (DUALPLANE, "shortest")]
# Servers: N = A (parallel NIC links on one switch), N = 1, 1 < N < A, every NIC placement.
SERVERS_NA = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=2,accels_per_server=4,nics_per_server=4"
SERVERS_N1 = "leafspine:leaves=2,spines=2,hosts_per_leaf=2,servers=4,accels_per_server=2,nics_per_server=1"
SERVERS_FAT = "fattree:k=4,servers=4,accels_per_server=4,nics_per_server=2,nic_placement=spread"
SERVERS_HDRM = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=4,accels_per_server=2,nics_per_server=2,nic_placement=hdrm"
SERVERS_STAR = "star:hosts=4,servers=2,accels_per_server=3,nics_per_server=2"
# Rails: one NIC per rail per server (the rail placement); rail-only forwards between rails inside a server.
SERVERS_RAIL = "rail:rails=4,hosts_per_rail=3,spines=2,servers=3,accels_per_server=4,nics_per_server=4"
SERVERS_DUALPLANE = "dualplane:rails=2,hosts_per_rail=3,spines=1,servers=2,accels_per_server=4,nics_per_server=2"
SERVERS_RAILONLY = "railonly:rails=4,hosts_per_rail=3,servers=3,accels_per_server=4,nics_per_server=4"
SERVER_CASES = [(SERVERS_NA, "bigraph"), (SERVERS_NA, "ecmp"), (SERVERS_NA, "shortest"),
                (SERVERS_N1, "dmodk"), (SERVERS_N1, "ecmp"),
                (SERVERS_FAT, "ecmp"), (SERVERS_FAT, "dmodk"), (SERVERS_FAT, "shortest"),
                (SERVERS_HDRM, "bigraph"), (SERVERS_STAR, "ecmp"), (SERVERS_STAR, "shortest"),
                (SERVERS_RAIL, "dmodk"), (SERVERS_RAIL, "ecmp"), (SERVERS_DUALPLANE, "ecmp"),
                (SERVERS_RAILONLY, "shortest"), (SERVERS_RAILONLY, "ecmp")]


class FakeFlowTable:
    """Forwards a packet through flow entries the way an OpenFlow 1.3 switch would.

    ``table`` per switch: a list of entries, or a dict by :meth:`FlowEntry.key`
    (then shared, not copied, so a caller's later changes show). An entry to
    :data:`routing.CONTROLLER_PORT` is a packet-in: ``controller(switch,
    packet)`` answers the port the packet leaves by (None: drop) and may add
    entries with :meth:`add`; every packet-in is recorded in ``packet_ins``.
    """

    def __init__(self, topo: topology.Topology, table: Mapping[str, Iterable[FlowEntry] | dict[tuple, FlowEntry]],
                 controller: Callable[[str, dict[str, object]], int | None] | None = None):
        self.topo = topo
        self.table = {sw: es if isinstance(es, dict) else {e.key(): e for e in es} for sw, es in table.items()}
        self.controller = controller
        self.packet_ins: list[tuple[str, dict[str, object]]] = []

    def add(self, entry: FlowEntry) -> None:
        """An OFPFC_ADD: replaces the entry with the same priority and match."""
        self.table.setdefault(entry.switch, {})[entry.key()] = entry

    def delete_cookie(self, cookie: int) -> None:
        """An OFPFC_DELETE by cookie on every switch."""
        for entries in self.table.values():
            for key in [k for k, e in entries.items() if e.cookie == cookie]:
                del entries[key]

    def packet(self, flow: Flow, eth_type: int = routing.ETH_TYPE_IP) -> dict[str, object]:
        src, dst = self.topo.host(flow.src), self.topo.host(flow.dst)
        if eth_type == routing.ETH_TYPE_ARP:
            return {"eth_type": eth_type, "arp_spa": src.ip, "arp_tpa": dst.ip}
        pkt: dict[str, object] = {"eth_type": eth_type, "ipv4_src": src.ip, "ipv4_dst": dst.ip,
                                  "ip_proto": flow.proto}
        if flow.proto == routing.IPPROTO_TCP:
            pkt.update(tcp_src=flow.sport, tcp_dst=flow.dport)
        return pkt

    def lookup(self, switch: str, pkt: dict[str, object], in_port: int) -> FlowEntry | None:
        fields = dict(pkt, in_port=in_port)
        best = None
        for entry in self.table.get(switch, {}).values():
            if all(fields.get(k) == v for k, v in entry.match):
                if best is not None and best.priority == entry.priority:
                    raise AssertionError(f"{switch}: overlapping entries {best} and {entry}")
                if best is None or entry.priority > best.priority:
                    best = entry
        return best

    def out_port(self, switch: str, flow: Flow, in_port: int = 0) -> int | None:
        entry = self.lookup(switch, self.packet(flow), in_port)
        return None if entry is None else entry.out_port

    def trace(self, flow: Flow, eth_type: int = routing.ETH_TYPE_IP) -> list[str]:
        """The nodes a packet of ``flow`` visits; stops at a host or a drop."""
        return self.trace_hops(flow, eth_type)[0]

    def trace_hops(self, flow: Flow, eth_type: int = routing.ETH_TYPE_IP) -> tuple[list[str], list[tuple[str, int]]]:
        """The nodes a packet visits and each hop as (node, port it leaves by)."""
        pkt = self.packet(flow, eth_type)
        host = self.topo.host(flow.src)
        path = [host.name, host.switch]
        hops = [(host.name, 0)]
        node, in_port = host.switch, host.switch_port
        while True:
            entry = self.lookup(node, pkt, in_port)
            port = None if entry is None else entry.out_port
            if port == routing.CONTROLLER_PORT:
                self.packet_ins.append((node, pkt))
                port = None if self.controller is None else self.controller(node, pkt)
            if port is None:
                return path + ["DROP"], hops
            link = self.topo.link_at(node, port)
            assert link is not None, f"{node} port {port} has no link"
            hops.append((node, port))
            nxt = link.other(node)
            path.append(nxt)
            if self.topo.is_host(nxt):
                return path, hops
            in_port = link.port_of(nxt)
            node = nxt
            assert len(path) < 20, f"loop: {path}"


def learning_fake(topo: topology.Topology, policy: str, *, seed: int = 0, failed: Iterable[frozenset[str]] = (),
                  table: dict[str, list[FlowEntry]] | None = None) -> FakeFlowTable:
    """The reactive table (or a copy of ``table``) and, on a TCP packet-in, what the controller app does
    (with routing alone): add the learned entries of both directions, send the packet on by
    :meth:`routing.Learner.out_port`."""
    learner = routing.Learner(topo, policy, seed=seed, failed=failed)
    by_ip = {h.ip: h.name for h in topo.hosts}

    def packet_in(switch: str, pkt: dict[str, object]) -> int | None:
        src, dst = by_ip[str(pkt["ipv4_src"])], by_ip[str(pkt["ipv4_dst"])]
        sport, dport = int(pkt["tcp_src"]), int(pkt["tcp_dst"])  # type: ignore[call-overload]
        for flow in (Flow(src, dst, routing.IPPROTO_TCP, sport, dport), Flow(dst, src, routing.IPPROTO_TCP, dport, sport)):
            for entry in learner.entries(flow):
                fake.add(entry)
        return learner.out_port(switch, Flow(src, dst, routing.IPPROTO_TCP, sport, dport))

    if table is None:
        table = routing.flow_table(topo, policy, seed=seed, failed=failed, reactive=True)
    fake = FakeFlowTable(topo, table, packet_in)
    return fake


def reverse(flow: Flow) -> Flow:
    return Flow(flow.dst, flow.src, flow.proto, flow.dport, flow.sport)


def _flows(topo: topology.Topology, src: str, dst: str) -> list[Flow]:
    return [Flow(src, dst, routing.IPPROTO_ICMP), Flow(src, dst, routing.IPPROTO_TCP, 45678, 5201),
            *routing.exact_flows(topo, src, dst)]


def _static_route(topo: topology.Topology, policy: str, flow: Flow, **kw) -> list[str]:
    """Where the proactive table (no controller) sends ``flow``: under ``ecmp`` a TCP flow
    other than the agents' takes its pair's path, not its :func:`routing.route`."""
    agent = flow in routing.exact_flows(topo, flow.src, flow.dst)
    if policy == "ecmp" and flow.proto == routing.IPPROTO_TCP and not agent:
        flow = Flow(flow.src, flow.dst, 0)
    return routing.route(topo, policy, flow, **kw)


@pytest.mark.parametrize("spec,policy", CASES + SERVER_CASES)
def test_flow_table_forwards_every_packet_along_route(spec, policy):
    topo = topology.load(spec)
    fake = FakeFlowTable(topo, routing.flow_table(topo, policy, seed=3))
    for src, dst in topology.all_host_pairs(topo):
        for flow in _flows(topo, src, dst):
            path = _static_route(topo, policy, flow, seed=3)
            # Ports too: a server's parallel NIC links to one switch are told apart.
            assert fake.trace_hops(flow) == (path, routing.directed_links(topo, path)), (flow, policy)
            assert len(path) - 2 == topo.switch_hops(src, dst)  # shortest paths only
        assert fake.trace(Flow(src, dst), routing.ETH_TYPE_ARP)[-1] == dst
    assert not fake.packet_ins


@pytest.mark.parametrize("spec,policy", CASES + SERVER_CASES)
def test_reactive_table_and_learned_entries_forward_every_packet_along_route(spec, policy):
    topo = topology.load(spec)
    fake = learning_fake(topo, policy, seed=3)
    if policy != "ecmp":
        assert routing.flow_table(topo, policy, seed=3, reactive=True) == routing.flow_table(topo, policy, seed=3)
    for src, dst in topology.all_host_pairs(topo):
        agents = routing.exact_flows(topo, src, dst)
        for flow in _flows(topo, src, dst):
            misses = len(fake.packet_ins)
            path = routing.route(topo, policy, flow, seed=3)
            assert fake.trace_hops(flow) == (path, routing.directed_links(topo, path)), (flow, policy)
            if flow in agents or flow.proto != routing.IPPROTO_TCP:
                assert len(fake.packet_ins) == misses, f"{flow} reached the controller"  # agents, ICMP never miss
            # The reverse direction was learned with the forward one: no further packet-in.
            misses = len(fake.packet_ins)
            back = routing.route(topo, policy, reverse(flow), seed=3)
            assert fake.trace_hops(reverse(flow)) == (back, routing.directed_links(topo, back))
            assert len(fake.packet_ins) == misses
            # ... and a second packet of the connection is switched without the controller.
            assert fake.trace(flow) == path and len(fake.packet_ins) == misses
        assert fake.trace(Flow(src, dst), routing.ETH_TYPE_ARP)[-1] == dst
        assert routing.route(topo, policy, Flow(src, dst, routing.IPPROTO_ICMP), seed=3) == \
            routing.route(topo, policy, Flow(src, dst, 0), seed=3)  # ICMP: the pair path
    # The other TCP flow (port 45678) was learned wherever a path has a choice (ecmp off a star).
    learned = [e for es in fake.table.values() for e in es.values() if e.cookie == routing.LEARNED_COOKIE]
    assert bool(fake.packet_ins) == bool(learned)
    assert bool(learned) == (policy == "ecmp" and topo.kind != "star") or (spec, policy) in SERVER_CASES


_TABLES: dict[tuple[str, int], dict[str, list[FlowEntry]]] = {}


@settings(max_examples=300, deadline=None)
@given(spec=st.sampled_from([LEAFSPINE, FATTREE, BIGRAPH, SERVERS_FAT, SERVERS_NA]), seed=st.sampled_from([0, 1, 9]),
       src=st.integers(0, 63), dst=st.integers(0, 63), sport=st.integers(1, 65535), dport=st.integers(1, 65535))
def test_any_tcp_connection_is_forwarded_along_route(spec, seed, src, dst, sport, dport):
    topo = topology.load(spec)
    a, b = topo.hosts[src % len(topo.hosts)].name, topo.hosts[dst % len(topo.hosts)].name
    if a == b:
        return
    if (spec, seed) not in _TABLES:
        _TABLES[(spec, seed)] = routing.flow_table(topo, "ecmp", seed=seed, reactive=True)
    fake = learning_fake(topo, "ecmp", seed=seed, table=_TABLES[(spec, seed)])
    flow = Flow(a, b, routing.IPPROTO_TCP, sport, dport)
    for f in (flow, reverse(flow), flow):
        path = routing.route(topo, "ecmp", f, seed=seed)
        assert fake.trace_hops(f) == (path, routing.directed_links(topo, path))
    # One packet-in (the first packet to reach a choice point) learns both directions; none with no choice.
    learned = [e for es in fake.table.values() for e in es.values() if e.cookie == routing.LEARNED_COOKIE]
    assert len(fake.packet_ins) == (1 if learned else 0)
    assert all(e.priority == routing.PRIORITY_FLOW and e.idle_timeout == routing.LEARNED_IDLE_TIMEOUT
               for e in learned)
    assert {e.switch for e in learned} <= {here for here, _ in routing.path_links(routing.route(
        topo, "ecmp", flow, seed=seed)) + routing.path_links(routing.route(topo, "ecmp", reverse(flow), seed=seed))}


def test_connections_of_one_pair_spread_over_the_spines():
    topo = topology.load(LEAFSPINE)
    src, dst = "h1", "h16"
    spines: dict[str, list[int]] = {}
    for sport in range(40000, 40064):
        spines.setdefault(routing.route(topo, "ecmp", Flow(src, dst, 6, sport, 5201), seed=5)[2], []).append(sport)
    assert set(spines) == {"s5", "s6"}  # some source ports hash onto each spine
    fake = learning_fake(topo, "ecmp", seed=5)
    measured = {spine: {fake.trace(Flow(src, dst, 6, ports[0], 5201))[2]} for spine, ports in spines.items()}
    assert measured == {spine: {spine} for spine in spines}
    # Non-TCP of the pair keeps one path whatever its "ports".
    assert len({fake.trace(Flow(src, dst, routing.IPPROTO_ICMP, p, 0))[2] for p in range(40000, 40064)}) == 1


def test_seed_decides_every_tcp_path():
    topo = topology.load(FATTREE)
    flows = [Flow(s, d, 6, 33000 + i, 5000 + i % 7) for i, (s, d) in
             enumerate(itertools.islice(topology.all_host_pairs(topo), 0, 240, 3))]
    one = [routing.route(topo, "ecmp", f, seed=1) for f in flows]
    assert one == [routing.route(topo, "ecmp", f, seed=1) for f in flows]
    fake = learning_fake(topo, "ecmp", seed=1)
    assert one == [fake.trace(f) for f in flows]
    two = [routing.route(topo, "ecmp", f, seed=2) for f in flows]
    assert sum(a != b for a, b in zip(one, two, strict=True)) > len(flows) // 4
    fake = learning_fake(topo, "ecmp", seed=2)
    assert two == [fake.trace(f) for f in flows]


def test_learned_entries_sit_at_choice_points_only():
    topo = topology.load(FATTREE)
    flow = Flow("h1", "h16", 6, 40000, 5201)  # pod 0 to pod 3: choices at the edge and the aggregation switch
    path = routing.route(topo, "ecmp", flow, seed=1)
    entries = routing.learned_entries(topo, "ecmp", flow, seed=1)
    assert [e.switch for e in entries] == path[1:3]
    assert all(e.match_dict() == {"eth_type": routing.ETH_TYPE_IP, "ip_proto": 6, "ipv4_src": "10.0.0.1",
                                  "ipv4_dst": "10.0.0.16", "tcp_src": 40000, "tcp_dst": 5201} for e in entries)
    assert [e.out_port for e in entries] == [topo.port_to(a, b) for a, b in routing.path_links(path)[1:3]]
    # Nothing to learn: same edge switch, non-TCP, port 0, another policy, a cut-off pair.
    assert routing.learned_entries(topo, "ecmp", Flow("h1", "h2", 6, 40000, 5201), seed=1) == []
    assert routing.learned_entries(topo, "ecmp", Flow("h1", "h16", routing.IPPROTO_ICMP), seed=1) == []
    assert routing.learned_entries(topo, "ecmp", Flow("h1", "h16", 6, 0, 5201), seed=1) == []
    assert routing.learned_entries(topo, "dmodk", flow) == []
    assert routing.learned_entries(topo, "ecmp", flow, seed=1, failed=[frozenset(("h1", "s1"))]) == []
    assert routing.Learner(topo, "ecmp", seed=1, failed=[frozenset(("h1", "s1"))]).out_port("s1", flow) is None


@pytest.mark.parametrize("spec,policy", [(SERVERS_NA, "ecmp"), (SERVERS_N1, "dmodk"), (SERVERS_FAT, "shortest"),
                                         (SERVERS_HDRM, "bigraph")])
def test_failed_links_on_server_topologies(spec, policy):
    topo = topology.load(spec)
    far = next(h.name for h in topo.hosts if not topo.same_server("h1", h.name)
               and topo.nic_slot(h.name)[0] != topo.nic_slot("h1")[0])
    fabric_link = frozenset(routing.switch_links_of(routing.route(topo, policy, Flow("h1", far)))[1])
    nic = topo.pinned_nic("h2")
    dead_nic = frozenset((nic.a, nic.b))
    for failed in ([fabric_link], [dead_nic]):
        fake = FakeFlowTable(topo, routing.flow_table(topo, policy, seed=1, failed=failed))
        cut = set(routing.cut_pairs(topo, failed))
        for src, dst in topology.all_host_pairs(topo):
            for f in _flows(topo, src, dst):
                if (src, dst) in cut:
                    assert fake.trace(f)[-1] == "DROP"
                    with pytest.raises(routing.NoPath):
                        routing.route(topo, policy, f, seed=1, failed=failed)
                    continue
                path = routing.route(topo, policy, f, seed=1, failed=failed)
                assert not {frozenset(x) for x in routing.path_links(path)} & set(failed)
                assert fake.trace_hops(f) == (path, routing.directed_links(topo, path))
    # The fabric stays connected without one link; a dead NIC cuts off exactly its accelerators,
    # from every other server in both directions, while they still reach their own server. Failures
    # are node pairs, so parallel NIC links of one server to one switch fail together.
    assert routing.cut_pairs(topo, [fabric_link]) == []
    pinned = {h.name for h in topo.hosts if frozenset((topo.pinned_nic(h.name).a, topo.pinned_nic(h.name).b)) == dead_nic}
    expected = {(a, b) for a, b in topology.all_host_pairs(topo)
                if (a in pinned or b in pinned) and not topo.same_server(a, b)}
    assert set(routing.cut_pairs(topo, [dead_nic])) == expected and expected


def test_fake_table_answers_out_port():
    topo = topology.load(BIGRAPH)
    fake = FakeFlowTable(topo, routing.flow_table(topo, "bigraph"))
    # h3 is on s2 (upper), h12 on s6 (lower): the unique direct link s2 -> s6.
    assert fake.out_port("s2", Flow("h3", "h12")) == topo.port_to("s2", "s6")
    assert fake.out_port("s6", Flow("h3", "h12")) == topo.host("h12").switch_port


def test_bigraph_rule():
    topo = topology.load(BIGRAPH)
    group = {s.name: s.role for s in topo.switches}
    middles: Counter[tuple[str, str, str]] = Counter()
    for src, dst in topology.all_host_pairs(topo):
        path = routing.route(topo, "bigraph", Flow(src, dst))
        a, b = topo.host(src).switch, topo.host(dst).switch
        if a == b:
            assert path == [src, a, dst]
        elif group[a] != group[b]:
            assert path == [src, a, b, dst]
        else:
            assert len(path) == 5 and group[path[2]] != group[a]
            middles[(a, b, path[2])] += 1
    # Each same-group switch pair spreads its 4 host pairs over the 4 other-group switches.
    per_pair = Counter((a, b) for a, b, _ in middles)
    assert set(per_pair.values()) == {4}
    assert set(middles.values()) == {1}
    # ... and the first and last hop of the same-group traffic are loaded evenly.
    first = Counter((a, m) for (a, b, m), n in middles.items() for _ in range(n))
    assert len(set(first.values())) == 1


def test_bigraph_rule_formula():
    topo = topology.load(BIGRAPH)
    # h3: second switch of the upper group (a=1), first port (i=0); h6: a=2, j=1; M=2:
    # candidate (0 + 2*1 + 1 + 2) mod 4 = 1 -> second lower switch, s6.
    assert routing.route(topo, "bigraph", Flow("h3", "h6")) == ["h3", "s2", "s6", "s3", "h6"]


def test_dmodk_fattree_spreads_by_destination():
    topo = topology.load(FATTREE)
    # h1 is on edge s1 in pod 0; destinations in other pods.
    for dst in topo.hosts[4:]:
        d = dst.index - 1
        path = routing.route(topo, "dmodk", Flow("h1", dst.name))
        aggs = [n for n in topo.neighbors("s1") if topo.is_switch(n)]
        assert path[2] == aggs[d % 2]
        cores = [n for n in topo.neighbors(path[2]) if topo.switch(n).role == "core"]
        assert path[3] == cores[(d // 2) % 2]


def test_dmodk_leafspine():
    topo = topology.load(LEAFSPINE)
    for dst in topo.hosts[4:]:
        assert routing.route(topo, "dmodk", Flow("h1", dst.name))[2] == ["s5", "s6"][(dst.index - 1) % 2]


def test_shortest_takes_lowest_numbered():
    topo = topology.load(LEAFSPINE)
    assert all(routing.route(topo, "shortest", Flow("h1", d.name))[2] == "s5" for d in topo.hosts[4:])


def test_ecmp_reproducible_and_seed_dependent():
    topo = topology.load(FATTREE)
    flows = routing.all_agent_flows(topo)
    one = [routing.route(topo, "ecmp", f, seed=1) for f in flows]
    assert one == [routing.route(topo, "ecmp", f, seed=1) for f in flows]
    two = [routing.route(topo, "ecmp", f, seed=2) for f in flows]
    assert sum(a != b for a, b in zip(one, two, strict=True)) > len(flows) // 4
    # Both choice points of the fat-tree are used by the agent flows.
    assert len({p[2] for p in one if p[0] == "h1" and len(p) == 7}) == 2


def test_ecmp_hash_stable_across_processes():
    code = ("from emulator.model import routing, topology; t = topology.load('fattree:k=4'); "
            "print([routing.route(t, 'ecmp', f, seed=7) for f in routing.all_agent_flows(t)][:40])")
    outs = set()
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))).stdout)
    assert len(outs) == 1
    topo = topology.load(FATTREE)
    assert outs.pop().strip() == str([routing.route(topo, "ecmp", f, seed=7)
                                      for f in routing.all_agent_flows(topo)][:40])


def test_ecmp_hashes_tcp_by_5_tuple_and_the_rest_by_pair():
    topo = topology.load(LEAFSPINE)
    differ = 0
    for src, dst in itertools.islice(topology.all_host_pairs(topo), 0, 240, 7):
        pair = routing.route(topo, "ecmp", Flow(src, dst, 0), seed=5)
        assert routing.route(topo, "ecmp", Flow(src, dst, routing.IPPROTO_ICMP), seed=5) == pair
        assert routing.route(topo, "ecmp", Flow(src, dst, 17, 40000, 5201), seed=5) == pair  # UDP
        assert routing.route(topo, "ecmp", Flow(src, dst, 6, 0, 5201), seed=5) == pair  # no source port
        differ += routing.route(topo, "ecmp", Flow(src, dst, 6, 40000, 5201), seed=5) != pair
    assert differ > 0


@pytest.mark.parametrize("spec,policy", [(BIGRAPH, "bigraph"), (FATTREE, "ecmp"), (FATTREE, "dmodk"),
                                         (LEAFSPINE, "shortest")])
def test_failed_link_is_avoided(spec, policy):
    topo = topology.load(spec)
    flow = routing.agent_flow(topo, "h1", topo.hosts[-1].name)
    before = routing.route(topo, policy, flow)
    link = frozenset(routing.switch_links_of(before)[0])
    after = routing.route(topo, policy, flow, failed=[link])
    assert link not in {frozenset(x) for x in routing.path_links(after)}
    fake = FakeFlowTable(topo, routing.flow_table(topo, policy, failed=[link]))
    learning = learning_fake(topo, policy, failed=[link])
    for src, dst in topology.all_host_pairs(topo):
        for f in _flows(topo, src, dst):
            assert fake.trace(f) == _static_route(topo, policy, f, failed=[link])
            assert learning.trace(f) == routing.route(topo, policy, f, failed=[link])
    assert routing.cut_pairs(topo, [link]) == []


def test_cut_off_pairs():
    topo = topology.load(LEAFSPINE)
    dead = [frozenset(("h1", "s1"))]
    cut = routing.cut_pairs(topo, dead)
    assert len(cut) == 2 * 15 and ("h1", "h2") in cut and ("h16", "h1") in cut
    with pytest.raises(routing.NoPath):
        routing.route(topo, "ecmp", Flow("h2", "h1"), failed=dead)
    table = routing.flow_table(topo, "ecmp", failed=dead)
    assert FakeFlowTable(topo, table).trace(Flow("h2", "h1"))[-1] == "DROP"
    # Both uplinks of leaf s1 down: its hosts are cut off from the other leaves only.
    dead = [frozenset(("s1", "s5")), frozenset(("s1", "s6"))]
    cut = routing.cut_pairs(topo, dead)
    assert len(cut) == 2 * 4 * 12 and ("h1", "h2") not in cut


@pytest.mark.parametrize("policy,spec", [("nonsense", FATTREE), ("bigraph", FATTREE), ("dmodk", BIGRAPH),
                                         ("dmodk", "star:hosts=3")])
def test_bad_policy_is_one_clear_line(policy, spec):
    topo = topology.load(spec)
    with pytest.raises(UserError) as info:
        routing.check_policy(topo, policy)
    msg = str(info.value)
    assert "\n" not in msg and "field 'policy'" in msg and repr(policy) in msg and "expected" in msg
    with pytest.raises(UserError):
        routing.flow_table(topo, policy)


def test_ofctl_strings():
    topo = topology.load(LEAFSPINE)
    entries = [e for es in routing.flow_table(topo, "ecmp", seed=1).values() for e in es]
    texts = {e.priority: e.ofctl() for e in entries}
    assert texts[routing.PRIORITY_ARP].startswith("priority=300,dl_type=0x806,arp_tpa=10.0.0.")
    assert texts[routing.PRIORITY_DEST].startswith("priority=100,dl_type=0x800,nw_dst=10.0.0.")
    assert "nw_src=10.0.0." in texts[routing.PRIORITY_PAIR]
    flow = texts[routing.PRIORITY_FLOW]
    assert "nw_proto=6" in flow and "tp_src=" in flow and "tp_dst=" in flow and ",actions=output:" in flow
    assert len({e.key() for e in entries}) == len(entries)
    assert routing.PRIORITY_TCP_MISS not in texts  # the static installer never sends packets to a controller
    reactive = [e for es in routing.flow_table(topo, "ecmp", seed=1, reactive=True).values() for e in es]
    miss = next(e for e in reactive if e.priority == routing.PRIORITY_TCP_MISS)
    assert miss.ofctl().startswith("priority=175,dl_type=0x800,nw_proto=6,nw_dst=10.0.0.")
    assert miss.ofctl().endswith(",actions=controller")
    assert routing.PRIORITY_FLOW > routing.PRIORITY_TCP_MISS > routing.PRIORITY_PAIR
    (learned, *_) = routing.learned_entries(topo, "ecmp", Flow("h1", "h16", 6, 40000, 5201), seed=1)
    assert learned.ofctl().startswith(f"cookie={hex(routing.LEARNED_COOKIE)},idle_timeout=120,priority=200,")


def test_link_sharing_lists_colliding_flows():
    topo = topology.load(LEAFSPINE)
    flows = [routing.agent_flow(topo, f"h{i}", f"h{i + 4}") for i in (1, 2, 3, 4)]
    shared = routing.link_sharing(topo, "ecmp", flows, seed=0)
    # Four flows from leaf s1 onto two spines: some uplink carries at least two of them.
    assert shared and all(len(v) >= 2 for v in shared.values())
    assert all(topo.is_switch(a) and topo.is_switch(b) for a, b in shared)


ONE_OF_EACH_KIND = {"bigraph": BIGRAPH, "fattree": FATTREE, "leafspine": LEAFSPINE, "rail": RAIL,
                    "dualplane": DUALPLANE, "railonly": SERVERS_RAILONLY, "star": "star:hosts=4"}


def test_every_policy_fits_the_kinds_it_names_and_only_those():
    assert set(ONE_OF_EACH_KIND) == set(topology.KINDS)
    assert routing.policy_kinds("bigraph") == ("bigraph",)
    assert routing.policy_kinds("dmodk") == ("fattree", "leafspine", "rail")  # the kinds registered with Clos stages
    assert routing.policy_kinds("ecmp") is None and routing.policy_kinds("shortest") is None
    for name in routing.POLICIES:
        for kind in topology.KINDS.values():
            topo = topology.build(ONE_OF_EACH_KIND[kind.name])
            fits = kind.name in (routing.policy_kinds(name) or (kind.name,))
            if fits:
                assert routing.check_policy(topo, name) is routing.POLICIES[name]
            else:
                with pytest.raises(UserError, match=f"routing for {kind.name}: field 'policy'"):
                    routing.check_policy(topo, name)
