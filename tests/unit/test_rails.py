"""Fabrics with rails (issue 30): rail-optimized leaf-spine, dual-plane and rail-only; their specs, the rail
placement, bisection, and the routing that is theirs alone (a NIC never forwards between planes; rail-only
traffic changes rails inside the sending server)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from test_routing import FakeFlowTable, _flows
from test_topology import brute_force_bisection

from emulator.base.errors import FieldError
from emulator.model import routing, topology
from emulator.model.collectives.generators import generate
from emulator.model.prediction import cost
from emulator.model.routing import Flow
from emulator.model.schedule.executor import execute

RAIL = "rail:rails=4,hosts_per_rail=4,spines=2"
RAIL_SERVERS = f"{RAIL},servers=4,accels_per_server=4,nics_per_server=4"
DUAL = "dualplane:rails=3,hosts_per_rail=2,spines=2"
RAILONLY = "railonly:rails=4,hosts_per_rail=3,servers=3,accels_per_server=4,nics_per_server=4"


def test_a_rail_fabric_is_a_leaf_spine_whose_leaves_are_rails():
    topo = topology.build(RAIL)
    assert [s.role for s in topo.switches] == ["leaf"] * 4 + ["spine"] * 2
    assert [len(topo.hosts_of(f"s{i}")) for i in range(1, 5)] == [4, 4, 4, 4]
    assert topo.bisection_bw_mbps() == topology.build("leafspine:leaves=4,spines=2,hosts_per_leaf=4").bisection_bw_mbps()


def test_the_rail_placement_puts_nic_k_of_every_server_on_rail_k():
    topo = topology.build(RAIL_SERVERS)
    assert topo.params["nic_placement"] == "rail" and topo.spec == RAIL_SERVERS  # the kind's default, not shown
    for server, accels in enumerate(topo.servers()):
        for k, host in enumerate(accels):
            switch, position, _ = topo.nic_slot(host)
            assert (switch, position) == (f"s{k + 1}", server)
    # an accelerator reaches the same local accelerator of another server through one rail switch
    assert topo.switch_hops("h1", "h5") == 3 and topo.switch_hops("h1", "h6") == 5


def test_dual_plane_nics_have_two_half_rate_ports_one_per_plane():
    topo = topology.build(f"{DUAL},bw=20")
    nics = [s for s in topo.switches if s.role == topology.NIC_ROLE]
    assert len(nics) == 6 and [h.switch for h in topo.hosts] == [s.name for s in nics]
    for nic in nics:
        ports = [lk for lk in topo.switch_links() if nic.name in (lk.a, lk.b)]
        leaves = [topo.switch(lk.other(nic.name)) for lk in ports]
        assert sorted(s.pod for s in leaves) == [0, 1] and {lk.bw_mbps for lk in ports} == {10.0}
        assert topo.host_link(topo.hosts_of(nic.name)[0].name).bw_mbps == 20.0
    assert {s.pod for s in topo.switches if s.role == "spine"} == {0, 1}


@pytest.mark.parametrize("spec", [
    "rail:rails=3,hosts_per_rail=2,spines=2",
    "rail:rails=4,hosts_per_rail=2,spines=1,switch_bw=30",
    "dualplane:rails=2,hosts_per_rail=2,spines=1",
    "dualplane:rails=2,hosts_per_rail=3,spines=2",
    "dualplane:rails=3,hosts_per_rail=1,spines=1,switch_bw=5",
    "dualplane:rails=2,hosts_per_rail=2,spines=2,host_bw=40",
])
def test_bisection_of_rail_fabrics_matches_exhaustive_search(spec):
    topo = topology.build(spec)
    assert topo.bisection_bw_mbps() == pytest.approx(brute_force_bisection(topo))


def test_rail_only_bisection_is_every_rail_split_in_two():
    topo = topology.build(RAILONLY)  # 3 servers on 4 rails of 3 slots: each rail carries one NIC across
    assert topo.bisection_bw_mbps() == min(4 * (3 // 2) * 10.0, (3 // 2) * 4 * 10.0) == 40.0


@pytest.mark.parametrize("spec,field", [
    ("railonly:rails=4,hosts_per_rail=2", "servers"),
    ("railonly:rails=4,hosts_per_rail=2,servers=2,accels_per_server=4,nics_per_server=2", "nics_per_server"),
    ("railonly:rails=2,hosts_per_rail=2,servers=2,accels_per_server=2,nics_per_server=2,nic_placement=packed",
     "nic_placement"),
    ("rail:rails=2,hosts_per_rail=2,spines=1,servers=3,accels_per_server=2,nics_per_server=2", "servers"),
    ("leafspine:leaves=2,spines=1,hosts_per_leaf=2,servers=2,accels_per_server=2,nics_per_server=2,"
     "nic_placement=rail", "nic_placement"),
    ("dualplane:rails=2,hosts_per_rail=2", "spines"),
    ("rail:rails=0,hosts_per_rail=2,spines=1", "rails"),
])
def test_bad_rail_specs_name_the_field(spec, field):
    with pytest.raises(FieldError) as err:
        topology.build(spec)
    assert f"field '{field}'" in str(err.value) and "\n" not in str(err.value)


def test_other_placements_still_apply_to_rail_fabrics():
    packed = topology.build(f"{RAIL},servers=2,accels_per_server=4,nics_per_server=4,nic_placement=packed")
    assert packed.spec.endswith("nic_placement=packed")
    assert [packed.nic_slot(h)[0] for h in ("h1", "h2", "h3", "h4")] == ["s1"] * 4


def test_a_dual_plane_nic_never_forwards_from_one_plane_to_the_other():
    topo = topology.build(DUAL)
    nic = topo.host("h1").switch  # rail 0
    leaf0, leaf1 = sorted((lk.other(nic) for lk in topo.switch_links() if nic in (lk.a, lk.b)),
                          key=topology.node_sort_key)
    # h1's plane-1 port is down and its plane-0 leaf has lost its spines: only its own rail is left to it,
    # unless another NIC of rail 0 carried it from plane 0 to plane 1, which a NIC does not.
    failed = [frozenset((nic, leaf1))] + [frozenset((leaf0, s.name)) for s in topo.switches
                                          if s.role == "spine" and s.pod == 0]
    rail0 = {h.name for h in topo.hosts[:2]}
    expected = {(a, b) for a, b in topology.all_host_pairs(topo) if "h1" in (a, b) and not {a, b} <= rail0}
    assert set(routing.cut_pairs(topo, failed)) == expected
    fake = FakeFlowTable(topo, routing.flow_table(topo, "ecmp", seed=1, failed=failed))
    for src, dst in topology.all_host_pairs(topo):
        for flow in _flows(topo, src, dst):
            if (src, dst) in expected:
                assert fake.trace(flow)[-1] == "DROP"
                with pytest.raises(routing.NoPath):
                    routing.route(topo, "ecmp", flow, seed=1, failed=failed)
                continue
            path = routing.route(topo, "ecmp", flow, seed=1, failed=failed)
            assert not any(topo.switch(n).role == topology.NIC_ROLE for n in path[2:-2] if topo.is_switch(n))


def test_dual_plane_splits_connections_over_both_planes():
    topo = topology.build(DUAL)
    flows = [Flow("h1", "h6", routing.IPPROTO_TCP, 40000 + i, 5201) for i in range(64)]
    planes = [topo.switch(routing.route(topo, "ecmp", f, seed=0)[2]).pod for f in flows]
    assert 16 < planes.count(0) < 48


def test_rail_only_changes_rails_inside_the_sending_server():
    topo = topology.build(RAILONLY)
    # h1 is accelerator 0 of server 0 (rail 0); h6 accelerator 1 of server 1 (rail 1)
    path = routing.route(topo, "shortest", Flow("h1", "h6"))
    assert path == ["h1", topo.host("h1").switch, "s2", topo.host("h6").switch, "h6"]
    assert routing.directed_links(topo, path)[1] == (topo.host("h1").switch, topo.egress_nic("h1", "h6").a_port)
    assert topo.egress_nic("h1", "h6") != topo.pinned_nic("h1")
    assert all(topo.switch_hops(a, b) in (1, 3) for a, b in topology.all_host_pairs(topo))
    assert topo.diameter_hops() == 3


def test_a_dead_rail_only_nic_cuts_its_server_off_its_rail():
    topo = topology.build(RAILONLY)
    nic = topo.nic_links()[1]  # server 0's NIC on rail 1
    failed = [frozenset((nic.a, nic.b))]
    server0 = set(topo.servers()[0])
    rail1 = {h.name for h in topo.hosts if topo.nic_slot(h.name)[0] == nic.b}
    expected = {(a, b) for a, b in topology.all_host_pairs(topo) if not topo.same_server(a, b)
                and ((a in server0 and b in rail1) or (b in server0 and topo.pinned_nic(b) == nic))}
    assert set(routing.cut_pairs(topo, failed)) == expected and expected
    fake = FakeFlowTable(topo, routing.flow_table(topo, "shortest", failed=failed))
    for src, dst in topology.all_host_pairs(topo):
        flow = Flow(src, dst)
        if (src, dst) in expected:
            assert fake.trace(flow)[-1] == "DROP"
        else:
            path = routing.route(topo, "shortest", flow, failed=failed)
            assert fake.trace_hops(flow) == (path, routing.directed_links(topo, path))


# ------------------------------------------------------------------ collectives on rails
RAIL_64 = "rail:rails=8,hosts_per_rail=8,spines=4,servers=8,accels_per_server=8,nics_per_server=8"
RAILONLY_4 = "railonly:rails=4,hosts_per_rail=4,servers=4,accels_per_server=4,nics_per_server=4"


def _links_of_every_step(sched, topo, policy):
    per: dict[int, list[tuple[str, int]]] = {}
    for t in cost.transfers(sched, topo, policy):
        per.setdefault(t.step, []).extend(routing.directed_links(topo, t.path))
    return per


@pytest.mark.parametrize("spec,policy", [(RAIL_64, "ecmp"), (RAILONLY_4, "shortest"), (RAIL_SERVERS, "dmodk")])
def test_halving_doubling_over_rails_is_contention_free(spec, policy):
    # hdrm on servers is the identity: partners in other servers share their local index, so their NICs a rail
    topo = topology.build(spec)
    sched = generate("hdrm", topo, 1 << 20)
    assert execute(sched).valid
    for step, links in _links_of_every_step(sched, topo, policy).items():
        assert max(Counter(links).values()) == 1, step
        assert not any(topo.is_switch(node) and topo.switch(node).role == "spine" for node, _ in links)


@pytest.mark.parametrize("spec,policy", [(RAIL_64, "ecmp"), (RAILONLY_4, "shortest")])
def test_the_rail_placement_keeps_a_ring_on_one_rail_between_servers(spec, policy):
    topo = topology.build(spec)
    ring = generate("ring", topo, 1 << 20, placement="rail")
    assert execute(ring).valid
    inter = [t for t in cost.transfers(ring, topo, policy) if not topo.same_server(t.src_host, t.dst_host)]
    assert inter and all(topo.nic_slot(t.src_host)[0] == topo.nic_slot(t.dst_host)[0] for t in inter)
    assert all(len(t.path) == 5 for t in inter)  # accelerator, its server's switch, the rail, the other's, accelerator
    # the identity ring leaves a server by its last accelerator and enters the next by its first: another rail
    plain = generate("ring", topo, 1 << 20)
    assert any(topo.nic_slot(t.src_host)[0] != topo.nic_slot(t.dst_host)[0]
               for t in cost.transfers(plain, topo, policy) if not topo.same_server(t.src_host, t.dst_host))


def test_with_an_odd_number_of_servers_only_the_hop_that_closes_the_ring_changes_rails():
    topo = topology.build(RAILONLY)  # 3 servers, 12 ranks
    ring = generate("ring", topo, 48 << 10, placement="rail")
    changes = [(t.src_host, t.dst_host) for t in cost.transfers(ring, topo, "shortest")
               if topo.nic_slot(t.src_host)[0] != topo.nic_slot(t.dst_host)[0]
               and not topo.same_server(t.src_host, t.dst_host)]
    assert set(changes) == {(ring.hosts[-1], ring.hosts[0])}


def test_the_rail_placement_needs_servers():
    with pytest.raises(FieldError, match="field 'placement'.*servers"):
        generate("ring", topology.build(RAIL), 1 << 20, placement="rail")


@pytest.mark.parametrize("servers,accels", [(2, 2), (3, 4), (4, 8), (2, 3), (1, 4)])
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_hierarchical_reduce_scatter_and_allgather_are_proved_and_cross_servers_on_a_rail_once(servers, accels,
                                                                                             collective):
    spec = (f"rail:rails={accels},hosts_per_rail={servers},spines=1,servers={servers},accels_per_server={accels},"
            f"nics_per_server={accels}")
    topo = topology.build(spec)
    p = servers * accels
    size = p * 4 * 16
    for placement in ("identity", "random", "rail"):
        sched = generate("hier", topo, size, placement=placement, seed=5, collective=collective)
        assert execute(sched).valid, placement
    sched = generate("hier", topo, size, collective=collective)
    sent_inside, sent_across = Counter(), Counter()
    for t in cost.transfers(sched, topo, "ecmp"):
        (sent_inside if topo.same_server(t.src_host, t.dst_host) else sent_across)[t.src_host] += t.bytes
        if not topo.same_server(t.src_host, t.dst_host):
            assert topo.nic_slot(t.src_host)[0] == topo.nic_slot(t.dst_host)[0]  # on one rail
    block = size / p
    # NCCL's two-level volumes: ·S blocks inside a server, (S-1) blocks across servers, per rank
    assert all(sent_inside[h.name] == (accels - 1) * servers * block for h in topo.hosts)
    assert all(sent_across[h.name] == (servers - 1) * block for h in topo.hosts)


@pytest.mark.parametrize("spec", [RAIL, RAIL_SERVERS, DUAL, RAILONLY])
def test_rail_fabrics_round_trip_through_their_json_export(spec, tmp_path):
    topo = topology.build(spec)
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topo.to_json()))
    assert topology.load(str(path)) == topo
