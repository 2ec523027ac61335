"""Servers (issue 7): spec keys, the model, pinned routing, and schedules that know servers."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.base.errors import FieldError
from emulator.cli.main import main
from emulator.model import routing, topology
from emulator.model.collectives.generators import generate
from emulator.model.prediction import cost
from emulator.model.routing import Flow
from emulator.model.schedule.executor import execute

BIG = "bigraph:upper=4,lower=4,hosts_per_switch=4"
EFLOPS = f"{BIG},servers=8,accels_per_server=4,nics_per_server=4,nic_placement=hdrm"
SHARED = f"{BIG},servers=8,accels_per_server=4,nics_per_server=1,nic_placement=hdrm"


def _server_spec(fabric: str, s: int, a: int, n: int, placement: str = "packed", **extra: object) -> str:
    more = "".join(f",{k}={v}" for k, v in extra.items())
    return f"{fabric},servers={s},accels_per_server={a},nics_per_server={n},nic_placement={placement}{more}"


# ------------------------------------------------------------------- spec
def test_defaults_and_canonical_spec():
    topo = topology.build("leafspine:leaves=2,spines=2,hosts_per_leaf=4,servers=2,accels_per_server=4,"
                          "nics_per_server=2,host_bw=20")
    assert topo.params["pcie_bw"] == 20 and topo.params["nic_placement"] == "packed"
    assert topo.spec == "leafspine:leaves=2,spines=2,hosts_per_leaf=4,host_bw=20,servers=2,accels_per_server=4,nics_per_server=2"
    other = topology.build(f"{BIG},servers=2,accels_per_server=2,nics_per_server=1,pcie_bw=40,nic_placement=spread")
    assert other.spec.endswith(",servers=2,accels_per_server=2,nics_per_server=1,pcie_bw=40,nic_placement=spread")
    for t in (topo, other, topology.build(EFLOPS)):
        assert topology.build(t.spec) == t
        assert topology.parse_spec(t.spec) == (t.kind, dict(t.params))
    mapping = {"kind": "star", "hosts": 4, "servers": 2, "accels_per_server": 3, "nics_per_server": 2,
               "pcie_bw": 100, "nic_placement": "spread"}
    assert topology.build(mapping) == topology.build("star:hosts=4,servers=2,accels_per_server=3,nics_per_server=2,"
                                                     "pcie_bw=100,nic_placement=spread")
    assert "servers" not in topology.build(BIG).params


BAD = [
    ("star:hosts=4,accels_per_server=2", "accels_per_server"),
    ("star:hosts=4,nics_per_server=1", "nics_per_server"),
    ("star:hosts=4,pcie_bw=5", "pcie_bw"),
    ("star:hosts=4,nic_placement=packed", "nic_placement"),
    ("star:hosts=4,servers=2", "accels_per_server"),
    ("star:hosts=4,servers=2,accels_per_server=2", "nics_per_server"),
    ("star:hosts=4,servers=0,accels_per_server=2,nics_per_server=1", "servers"),
    ("star:hosts=4,servers=two,accels_per_server=2,nics_per_server=1", "servers"),
    ("star:hosts=4,servers=2,accels_per_server=0,nics_per_server=1", "accels_per_server"),
    ("star:hosts=4,servers=2,accels_per_server=2,nics_per_server=3", "nics_per_server"),
    ("star:hosts=4,servers=3,accels_per_server=2,nics_per_server=2", "servers"),
    ("star:hosts=4,servers=2,accels_per_server=2,nics_per_server=1,pcie_bw=2000", "pcie_bw"),
    ("star:hosts=4,servers=2,accels_per_server=2,nics_per_server=1,nic_placement=diagonal", "nic_placement"),
    ("fattree:k=4,servers=2,accels_per_server=2,nics_per_server=1,nic_placement=hdrm", "nic_placement"),
    ("bigraph:upper=2,lower=4,hosts_per_switch=1,servers=2,accels_per_server=2,nics_per_server=1,"
     "nic_placement=hdrm", "nic_placement"),
    ("bigraph:upper=2,lower=2,hosts_per_switch=4,servers=2,accels_per_server=2,nics_per_server=1,"
     "nic_placement=hdrm", "nic_placement"),
    ("star:hosts=4,servers=2,accels_per_server=600,nics_per_server=1", "servers"),
    ("star:hosts=600,servers=512,accels_per_server=1,nics_per_server=1", "servers"),
    ("leafspine:leaves=1,spines=1,hosts_per_leaf=2,servers=1,accels_per_server=1,nics_per_server=1", "servers"),
    ("fattree:k=4,servers=4,accels_per_server=4,nics_per_server=4,color=red", "color"),
]


@pytest.mark.parametrize("spec,field", BAD)
def test_bad_server_specs_name_the_field(spec, field):
    with pytest.raises(FieldError) as info:
        topology.build(spec)
    assert info.value.field == field
    text = str(info.value)
    assert "\n" not in text and "expected" in text and "got" in text


def test_too_many_servers_says_how_many_fit():
    with pytest.raises(FieldError, match=r"at most 8 servers of 4 NICs \(the fabric has 32 host slots\)"):
        topology.build(f"{BIG},servers=9,accels_per_server=4,nics_per_server=4")


# ------------------------------------------------------------------ model
@pytest.mark.parametrize("spec", [EFLOPS, SHARED,
                                  _server_spec("fattree:k=4", 3, 4, 2, "spread", pcie_bw=40),
                                  _server_spec("leafspine:leaves=3,spines=2,hosts_per_leaf=2", 2, 3, 3),
                                  _server_spec("star:hosts=5", 2, 2, 2)])
def test_model_keeps_the_fabric_and_appends_servers(spec):
    topo = topology.build(spec)
    bare = topology.build(topology.format_spec(topo.kind, {k: v for k, v in topo.params.items()
                                                           if k not in ("servers", "accels_per_server",
                                                                        "nics_per_server", "pcie_bw",
                                                                        "nic_placement")}))
    s, a, n = (topo.params[k] for k in ("servers", "accels_per_server", "nics_per_server"))
    f = len(bare.switches)
    assert topo.switches[:f] == bare.switches and topo.switch_links() == bare.switch_links()
    assert [sw.name for sw in topo.switches[f:]] == [f"s{f + 1 + i}" for i in range(s)]
    assert {sw.role for sw in topo.switches[f:]} == {"pcie"} and topo.fabric_switches() == list(bare.switches)
    assert [h.name for h in topo.hosts] == [f"h{i}" for i in range(1, s * a + 1)]
    assert topo.servers() == [[f"h{i}" for i in range(srv * a + 1, srv * a + a + 1)] for srv in range(s)]
    slots = [(h.switch, h.switch_port) for h in bare.hosts]
    assert list(topo.slots) == slots
    used = set()
    for srv in range(s):
        pcie = f"s{f + 1 + srv}"
        ports = {p: topo.link_at(pcie, p) for p in range(1, a + n + 2)}
        assert [ports[p].a for p in range(1, a + 1)] == topo.servers()[srv]
        assert all(ports[p].kind == "host" and ports[p].bw_mbps == topo.params["pcie_bw"] for p in range(1, a + 1))
        nics = [ports[p] for p in range(a + 1, a + n + 1)]
        assert all(lk.kind == "nic" and lk.a == pcie and lk.bw_mbps == topo.host_bw for lk in nics)
        assert ports[a + n + 1] is None
        for lk in nics:
            assert (lk.b, lk.b_port) in slots and (lk.b, lk.b_port) not in used
            used.add((lk.b, lk.b_port))
        for j, h in enumerate(topo.servers()[srv]):
            assert topo.server_of(h) == srv and topo.host(h).switch == pcie
            assert topo.pinned_nic(h) == nics[j * n // a]
            sw, pos, g = topo.nic_slot(h)
            assert (sw, pos + 1) == (nics[j * n // a].b, nics[j * n // a].b_port) and slots[g] == (sw, pos + 1)
    assert len(topo.nic_links()) == s * n and len(topo.links) == len(bare.switch_links()) + s * (a + n)
    # Empty slots stay empty: no link on those fabric ports.
    for slot in set(slots) - used:
        assert topo.link_at(*slot) is None
    # Every port used once (parallel NIC links included); fabric ports are the bare fabric's.
    seen = Counter((node, port) for lk in topo.links for node, port in ((lk.a, lk.a_port), (lk.b, lk.b_port)))
    assert set(seen.values()) == {1}
    bare_ports = {(node, port) for lk in bare.links for node, port in ((lk.a, lk.a_port), (lk.b, lk.b_port))}
    for sw in topo.switches:
        ports = sorted(p for (node, p) in seen if node == sw.name)
        if sw.role == "pcie":
            assert ports == list(range(1, a + n + 1))
        else:
            assert {(sw.name, p) for p in ports} <= bare_ports


def test_nic_placements():
    fabric = "bigraph:upper=2,lower=2,hosts_per_switch=2"
    packed = topology.build(_server_spec(fabric, 2, 4, 4))
    assert [(lk.b, lk.b_port) for lk in packed.nic_links()] == [("s1", 1), ("s1", 2), ("s2", 1), ("s2", 2),
                                                                  ("s3", 1), ("s3", 2), ("s4", 1), ("s4", 2)]
    spread = topology.build(_server_spec(fabric, 2, 4, 3, "spread"))
    assert [(lk.b, lk.b_port) for lk in spread.nic_links()] == [("s1", 1), ("s2", 1), ("s3", 1),
                                                                  ("s4", 1), ("s1", 2), ("s2", 2)]
    hdrm = topology.build(_server_spec(fabric, 4, 2, 2, "hdrm"))
    order = topology.hdrm_slot_order(2, 2)
    assert [hdrm.slots.index((lk.b, lk.b_port)) for lk in hdrm.nic_links()] == order
    groups = [hdrm.switch(lk.b).role for lk in hdrm.nic_links()]
    # NICs 2i and 2i+1 sit in opposite groups: each of these servers has one NIC in each.
    assert all({groups[2 * i], groups[2 * i + 1]} == {"upper", "lower"} for i in range(4))


def test_pinning_rule():
    topo = topology.build(_server_spec("star:hosts=8", 2, 4, 2))
    assert [topo.pinned_nic(f"h{i}").a_port for i in range(1, 9)] == [5, 5, 6, 6] * 2
    one = topology.build(_server_spec("star:hosts=8", 2, 4, 1))
    assert {one.pinned_nic(h.name).a_port for h in one.hosts} == {5}
    with pytest.raises(topology.UserError, match="no servers"):
        topology.build(BIG).server_of("h1")
    assert topology.build(BIG).nic_slot("h6") == ("s2", 1, 5)  # without servers: the host's own slot


def test_parallel_nic_links_survive_graph_and_json(tmp_path):
    topo = topology.build(_server_spec("leafspine:leaves=2,spines=2,hosts_per_leaf=4", 2, 4, 4))
    assert len(topo.links_between("s5", "s1")) == 4
    assert topo.graph.number_of_edges() == len(topo.links)
    data = topo.to_json()
    assert len(data["links"]) == len(topo.links)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    again = topology.load(str(path))
    assert again == topo and again.to_json() == data
    data["links"] = data["links"][:-1]
    path.write_text(json.dumps(data))
    with pytest.raises(FieldError, match="field 'links'"):
        topology.load(str(path))


def test_hops_diameter_bisection():
    topo = topology.build(EFLOPS)
    assert topo.switch_hops("h1", "h2") == 1
    for src, dst in topology.all_host_pairs(topo):
        path = routing.route(topo, "bigraph", Flow(src, dst))
        assert len(path) - 2 == topo.switch_hops(src, dst)
    assert topo.diameter_hops() == max(topo.switch_hops(a, b) for a, b in topology.all_host_pairs(topo)) == 5
    # Bare fabric: 80; the NICs of half the servers: 4 x 4 x 10 = 160 (EFLOPS), 4 x 1 x 10 = 40 (shared).
    assert topo.bisection_bw_mbps() == 80
    assert topology.build(SHARED).bisection_bw_mbps() == 40
    assert topology.build(_server_spec("star:hosts=8", 1, 4, 1, pcie_bw=50)).bisection_bw_mbps() == 100
    assert topology.build(_server_spec("star:hosts=8", 1, 4, 1)).diameter_hops() == 1
    # Two servers whose only NICs share a switch: PCIe, switch, PCIe.
    assert topology.build(_server_spec("star:hosts=8", 2, 2, 1)).diameter_hops() == 3


def test_summary_and_cli(capsys):
    summary = topology.build(EFLOPS).summary()
    assert summary["hosts"] == 32 and summary["switches"] == 16 and summary["nic_links"] == 32
    assert summary["host_links"] == 32 and summary["switch_links"] == 16 and summary["servers"] == 8
    assert main(["topo", "show", EFLOPS]) == 0
    out = capsys.readouterr().out
    assert "8 pcie" in out and "32 NIC" in out and "8 x (4 accelerators, 4 NICs)" in out
    assert main(["topo", "show", "star:hosts=4,servers=2", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "accels_per_server" in err


# ---------------------------------------------------------------- routing
ROUTED = [(EFLOPS, "bigraph"), (SHARED, "ecmp"), (_server_spec("fattree:k=4", 4, 4, 2), "dmodk"),
          (_server_spec("leafspine:leaves=4,spines=2,hosts_per_leaf=2", 3, 4, 2, "spread"), "shortest")]


@pytest.mark.parametrize("spec,policy", ROUTED)
def test_paths_use_the_pinned_nics_and_no_foreign_pcie_switch(spec, policy):
    topo = topology.build(spec)
    for src, dst in topology.all_host_pairs(topo):
        path = routing.route(topo, policy, routing.agent_flow(topo, src, dst), seed=2)
        pcie = topo.host(src).switch
        assert path[:2] == [src, pcie] and path[-1] == dst
        if topo.same_server(src, dst):
            assert path == [src, pcie, dst]
            continue
        assert path[2] == topo.pinned_nic(src).b and path[-3] == topo.pinned_nic(dst).b
        assert path[-2] == topo.host(dst).switch
        assert all(topo.is_fabric_switch(n) for n in path[2:-2])
        hops = routing.directed_links(topo, path)
        assert hops[1] == (pcie, topo.pinned_nic(src).a_port)
        assert hops[-2] == (path[-3], topo.pinned_nic(dst).b_port)


@pytest.mark.parametrize("fabric,policy", [(BIG, "bigraph"), ("fattree:k=4", "dmodk"),
                                           ("leafspine:leaves=4,spines=4,hosts_per_leaf=4", "dmodk"),
                                           ("fattree:k=4", "shortest")])
def test_policies_read_the_nic_slot_as_the_host_they_replace(fabric, policy):
    """Between servers, the fabric part of a path is the bare fabric's path between the two slots' hosts."""
    topo = topology.build(_server_spec(fabric, 8, 2, 2, "spread"))
    bare = topology.build(fabric)
    for src, dst in topology.all_host_pairs(topo):
        if topo.same_server(src, dst):
            continue
        a, b = (bare.hosts[topo.nic_slot(h)[2]].name for h in (src, dst))
        if a == b:
            continue
        assert routing.route(topo, policy, Flow(src, dst))[2:-2] == routing.route(bare, policy, Flow(a, b))[1:-1]


def test_flow_table_of_a_pcie_switch():
    topo = topology.build(_server_spec("star:hosts=4", 2, 4, 2))
    table = routing.flow_table(topo, "shortest")["s2"]
    uplinks = [e for e in table if e.priority == routing.PRIORITY_UPLINK]
    assert [(e.match, e.out_port) for e in uplinks] == [((("in_port", p),), 5 + (p - 1) // 2) for p in (1, 2, 3, 4)]
    local = {topo.host(f"h{i}").ip for i in range(1, 5)}
    assert {dict(e.match).get("ipv4_dst", dict(e.match).get("arp_tpa")) for e in table if e not in uplinks} == local
    assert uplinks[0].ofctl() == "priority=50,in_port=1,actions=output:5"


# ------------------------------------------------------------- schedules
def _transfers_per_link(sched, topo, policy):
    """Per step, flows on every directed physical link (parallel NIC links told apart)."""
    per: dict[int, Counter] = {}
    for t in cost.transfers(sched, topo, policy):
        per.setdefault(t.step, Counter()).update(routing.directed_links(topo, t.path))
    return per


@pytest.mark.parametrize("policy", ["bigraph", "shortest"])
def test_hdrm_on_eflops_servers_is_contention_free(policy):
    topo = topology.build(EFLOPS)
    sched = generate("hdrm", topo, 1 << 20)
    assert sched.hosts == [h.name for h in topo.hosts]
    per = _transfers_per_link(sched, topo, policy)
    assert len(per) == 10 and all(max(c.values()) == 1 for c in per.values())
    assert set(cost.analyze(sched, topo, policy).max_flows_per_link) == {1}
    # The first log2(A) = 2 steps (and the last 2) stay inside servers.
    for step in (0, 1, 8, 9):
        assert all(topo.is_host(n) or topo.is_pcie_switch(n) for n, _ in per[step])


@pytest.mark.parametrize("spec", [
    _server_spec("bigraph:upper=4,lower=4,hosts_per_switch=4", 16, 2, 2, "hdrm"),
    _server_spec("bigraph:upper=8,lower=8,hosts_per_switch=1", 4, 4, 4, "hdrm"),
    _server_spec("bigraph:upper=2,lower=2,hosts_per_switch=2", 2, 4, 4, "hdrm"),
])
def test_hdrm_with_a_nic_per_accelerator_has_one_flow_per_link_in_the_cost_model(spec):
    topo = topology.build(spec)
    sched = generate("hdrm", topo, 1 << 20)
    assert execute(sched).valid
    assert set(cost.analyze(sched, topo, "bigraph").max_flows_per_link) == {1}  # parallel NICs told apart
    per = _transfers_per_link(sched, topo, "bigraph")
    assert all(max(c.values()) == 1 for c in per.values())


def test_hdrm_with_one_shared_nic_puts_a_flows_on_every_nic_link():
    topo = topology.build(SHARED)
    sched = generate("hdrm", topo, 1 << 20)
    report = cost.analyze(sched, topo, "bigraph")
    assert report.max_flows_per_link == [1, 1, 4, 4, 4, 4, 4, 4, 1, 1]
    nic_ends = {(lk.a, lk.b) for lk in topo.nic_links()} | {(lk.b, lk.a) for lk in topo.nic_links()}
    for step in report.steps[2:8]:
        assert {step.flows_per_link[link] for link in nic_ends} == {4}
    # The same steps with a NIC per accelerator: each transfer alone on its links, 4x faster.
    own = topology.build(_server_spec("bigraph:upper=8,lower=8,hosts_per_switch=1", 4, 4, 4, "hdrm"))
    shared = topology.build(_server_spec("bigraph:upper=8,lower=8,hosts_per_switch=1", 4, 4, 1, "hdrm"))
    times = [cost.analyze(generate("hdrm", t, 64 << 20), t, "bigraph").steps for t in (own, shared)]
    inter = [sum(s.maxmin_s for s in steps[2:6]) for steps in times]
    # 4x, but for the last frame's store-and-forward, which sharing does not slow (under 1% at 64 MiB)
    assert inter[1] == pytest.approx(4 * inter[0], rel=0.01)


def test_hdrm_on_servers_needs_powers_of_two():
    with pytest.raises(FieldError, match="powers of two"):
        generate("hdrm", topology.build(_server_spec("star:hosts=8", 3, 2, 1)), 1 << 20)
    with pytest.raises(FieldError, match="powers of two"):
        generate("hdrm", topology.build(_server_spec("star:hosts=8", 2, 3, 1)), 1 << 20)


def test_hier_groups_ranks_by_server():
    topo = topology.build(_server_spec("leafspine:leaves=2,spines=2,hosts_per_leaf=4", 4, 3, 2))
    sched = generate("hier", topo, 4 * 12 * 3)
    assert execute(sched).valid
    s, a = 4, 3
    assert sched.steps == 2 * (a - 1) + 2 * (s - 1)
    hosts = sched.hosts
    for prog in sched.ranks:
        for op in prog.ops:
            if op.kind != "send":
                continue
            same = topo.same_server(hosts[prog.rank], hosts[op.peer])
            inside = op.step < a - 1 or op.step >= a - 1 + 2 * (s - 1)
            assert same == inside
            if not same:  # across servers only between the same local accelerator
                assert (topo.host(hosts[prog.rank]).index - 1) % a == (topo.host(hosts[op.peer]).index - 1) % a


@pytest.mark.parametrize("algo", ["ring", "hd", "dbtree", "hier", "hdrm"])
def test_every_algorithm_runs_on_servers(algo):
    topo = topology.build(_server_spec("fattree:k=4", 4, 2, 1, "spread"))
    sched = generate(algo, topo, 4 * 8 * 3)
    assert execute(sched).valid
    assert cost.analyze(sched, topo, "ecmp").steps


# --------------------------------------------------------------- property
FABRICS = st.one_of(
    st.builds(lambda u, lo, m: f"bigraph:upper={u},lower={lo},hosts_per_switch={m}",
              st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
    st.builds(lambda k: f"fattree:k={k}", st.sampled_from([2, 4])),
    st.builds(lambda a, b, c: f"leafspine:leaves={a},spines={b},hosts_per_leaf={c}",
              st.integers(2, 3), st.integers(1, 2), st.integers(1, 3)),
    st.builds(lambda n: f"star:hosts={n}", st.integers(1, 6)),
)


@st.composite
def server_specs(draw):
    fabric = draw(FABRICS)
    kind, params = topology.parse_spec(fabric)
    slots = len(topology.build(fabric).hosts)
    a = draw(st.integers(1, 4))
    n = draw(st.integers(1, min(a, slots)))
    s = draw(st.integers(1, slots // n))
    placements = ["packed", "spread"]
    if kind == "bigraph" and not topology.hdrm_problem(params["upper"], params["lower"], params["hosts_per_switch"]):
        placements.append("hdrm")
    placement = draw(st.sampled_from(placements))
    policy = draw(st.sampled_from([p for p in routing.POLICIES
                                   if kind in (routing.policy_kinds(p) or (kind,))]))
    return _server_spec(fabric, s, a, n, placement), policy


@settings(max_examples=40, deadline=None)
@given(server_specs())
def test_random_server_specs_build_and_route_every_pair(case):
    spec, policy = case
    try:
        topo = topology.build(spec)
    except FieldError as exc:  # a too-small fabric or too few accelerators, never anything else
        assert exc.field in ("hosts", "servers")
        return
    assert topology.build(topo.spec) == topo
    table = routing.flow_table(topo, policy, seed=1)
    assert set(table) == {s.name for s in topo.switches}
    for src, dst in topology.all_host_pairs(topo):
        path = routing.route(topo, policy, routing.agent_flow(topo, src, dst), seed=1)
        assert len(path) - 2 == topo.switch_hops(src, dst) <= topo.diameter_hops()
    assert routing.cut_pairs(topo, []) == []
    assert math.isfinite(topo.bisection_bw_mbps())


def test_pcie_switch_ports_get_deep_queues_and_fabric_ports_the_default():
    from emulator.base.naming import switch_intf
    from emulator.emulation.network.tc_commands import (
        PCIE_QUEUE_BYTES,
        queue_limits,
        queue_packets_for,
        root_interfaces,
    )

    topo = topology.build(SHARED)
    limits = queue_limits(topo, 32000)
    pcie = {s.name for s in topo.switches if s.role == "pcie"}
    assert pcie and set(limits) == set(root_interfaces(topo))
    for name, packets in limits.items():
        owner = name[len("ef"):].rsplit("-eth", 1)[0]
        assert packets == (queue_packets_for(32000, PCIE_QUEUE_BYTES) if owner in pcie else queue_packets_for(32000))
    nic = topo.nic_links()[0]
    assert limits[switch_intf(nic.a, nic.a_port)] > 1000 > limits[switch_intf(nic.b, nic.b_port)]
