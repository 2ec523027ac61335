"""Routing policies, checked with a tiny fake flow table: "a packet from h3 to h12 leaves s5 on port p"."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter

import pytest

from emulator import routing, topology
from emulator.errors import UserError
from emulator.routing import Flow, FlowEntry

BIGRAPH = "bigraph:upper=4,lower=4,hosts_per_switch=2"
FATTREE = "fattree:k=4"
LEAFSPINE = "leafspine:leaves=4,spines=2,hosts_per_leaf=4"
CASES = [(BIGRAPH, "bigraph"), (BIGRAPH, "ecmp"), (BIGRAPH, "shortest"),
         (FATTREE, "ecmp"), (FATTREE, "dmodk"), (FATTREE, "shortest"),
         (LEAFSPINE, "ecmp"), (LEAFSPINE, "dmodk"), (LEAFSPINE, "shortest"),
         ("star:hosts=4", "shortest"), ("star:hosts=4", "ecmp")]
# Servers: N = A (parallel NIC links on one switch), N = 1, 1 < N < A, every NIC placement.
SERVERS_NA = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=2,accels_per_server=4,nics_per_server=4"
SERVERS_N1 = "leafspine:leaves=2,spines=2,hosts_per_leaf=2,servers=4,accels_per_server=2,nics_per_server=1"
SERVERS_FAT = "fattree:k=4,servers=4,accels_per_server=4,nics_per_server=2,nic_placement=spread"
SERVERS_HDRM = "bigraph:upper=2,lower=2,hosts_per_switch=2,servers=4,accels_per_server=2,nics_per_server=2,nic_placement=hdrm"
SERVERS_STAR = "star:hosts=4,servers=2,accels_per_server=3,nics_per_server=2"
SERVER_CASES = [(SERVERS_NA, "bigraph"), (SERVERS_NA, "ecmp"), (SERVERS_NA, "shortest"),
                (SERVERS_N1, "dmodk"), (SERVERS_N1, "ecmp"),
                (SERVERS_FAT, "ecmp"), (SERVERS_FAT, "dmodk"), (SERVERS_FAT, "shortest"),
                (SERVERS_HDRM, "bigraph"), (SERVERS_STAR, "ecmp"), (SERVERS_STAR, "shortest")]


class FakeFlowTable:
    """Forwards a packet through flow entries the way an OpenFlow 1.3 switch would."""

    def __init__(self, topo: topology.Topology, table: dict[str, list[FlowEntry]]):
        self.topo = topo
        self.table = table

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
        for entry in self.table.get(switch, []):
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
            if entry is None:
                return path + ["DROP"], hops
            link = self.topo.link_at(node, entry.out_port)
            assert link is not None, f"{node} port {entry.out_port} has no link"
            hops.append((node, entry.out_port))
            nxt = link.other(node)
            path.append(nxt)
            if self.topo.is_host(nxt):
                return path, hops
            in_port = link.port_of(nxt)
            node = nxt
            assert len(path) < 20, f"loop: {path}"


def _flows(topo: topology.Topology, src: str, dst: str) -> list[Flow]:
    return [Flow(src, dst, routing.IPPROTO_ICMP), Flow(src, dst, routing.IPPROTO_TCP, 45678, 5201),
            *routing.exact_flows(topo, src, dst)]


@pytest.mark.parametrize("spec,policy", CASES + SERVER_CASES)
def test_flow_table_forwards_every_packet_along_route(spec, policy):
    topo = topology.load(spec)
    fake = FakeFlowTable(topo, routing.flow_table(topo, policy, seed=3))
    for src, dst in topology.all_host_pairs(topo):
        for flow in _flows(topo, src, dst):
            path = routing.route(topo, policy, flow, seed=3)
            # Ports too: a server's parallel NIC links to one switch are told apart.
            assert fake.trace_hops(flow) == (path, routing.directed_links(topo, path)), (flow, policy)
            assert len(path) - 2 == topo.switch_hops(src, dst)  # shortest paths only
        assert fake.trace(Flow(src, dst), routing.ETH_TYPE_ARP)[-1] == dst


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
    code = ("from emulator import routing, topology; t = topology.load('fattree:k=4'); "
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


def test_ecmp_other_traffic_takes_pair_path():
    topo = topology.load(LEAFSPINE)
    for src, dst in itertools.islice(topology.all_host_pairs(topo), 0, 240, 7):
        icmp = routing.route(topo, "ecmp", Flow(src, dst, routing.IPPROTO_ICMP), seed=5)
        assert routing.route(topo, "ecmp", Flow(src, dst, routing.IPPROTO_TCP, 40000, 5201), seed=5) == icmp


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
    for src, dst in topology.all_host_pairs(topo):
        for f in _flows(topo, src, dst):
            assert fake.trace(f) == routing.route(topo, policy, f, failed=[link])
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


def test_link_sharing_lists_colliding_flows():
    topo = topology.load(LEAFSPINE)
    flows = [routing.agent_flow(topo, f"h{i}", f"h{i + 4}") for i in (1, 2, 3, 4)]
    shared = routing.link_sharing(topo, "ecmp", flows, seed=0)
    # Four flows from leaf s1 onto two spines: some uplink carries at least two of them.
    assert shared and all(len(v) >= 2 for v in shared.values())
    assert all(topo.is_switch(a) and topo.is_switch(b) for a, b in shared)
