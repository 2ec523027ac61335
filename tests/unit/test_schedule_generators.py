"""Every generator, at every supported p from 2 to 64, is proved an allreduce by symbolic execution."""

from __future__ import annotations

import pytest

from emulator import routing, topology
from emulator.errors import FieldError
from emulator.schedule.cost import analyze
from emulator.schedule.executor import execute
from emulator.schedule.format import validate
from emulator.schedule.generators import double_binary_tree, generate, hdrm_placement

PS = list(range(2, 65))


def _size(chunks: int) -> int:
    return 4 * chunks * 3


def _proved(sched):
    result = execute(sched)
    assert result.valid, result.errors[:3]
    assert result.deadlock is None
    return result


def _leafspine_for(p: int) -> topology.Topology:
    """A leaf-spine whose leaves hold g hosts, g the largest divisor of p up to sqrt(p)."""
    g = max(d for d in range(1, int(p**0.5) + 1) if p % d == 0)
    return topology.build(f"leafspine:leaves={p // g},spines=1,hosts_per_leaf={g}")


@pytest.mark.parametrize("p", PS)
def test_ring_is_an_allreduce_with_2p_minus_2_steps(p):
    sched = generate("ring", topology.build(f"star:hosts={p}"), _size(p))
    _proved(sched)
    assert sched.steps == 2 * (p - 1)
    assert sched.chunks == p


@pytest.mark.parametrize("p", PS)
def test_hd_is_an_allreduce_including_non_powers_of_two(p):
    sched = generate("hd", topology.build(f"star:hosts={p}"), 4 * 64 * 3)
    _proved(sched)
    k = p.bit_length() - 1
    assert sched.steps == 2 * k + (0 if p == 1 << k else 2)
    assert sched.chunks == 1 << k


@pytest.mark.parametrize("p", PS)
def test_dbtree_is_an_allreduce(p):
    sched = generate("dbtree", topology.build(f"star:hosts={p}"), 4 * 8 * 5)
    _proved(sched)


@pytest.mark.parametrize("p", PS)
def test_hier_is_an_allreduce_on_servers(p):
    topo = _leafspine_for(p)
    sched = generate("hier", topo, _size(p))
    _proved(sched)
    g = topo.params["hosts_per_leaf"]
    assert sched.steps == 2 * (g - 1) + 2 * (p // g - 1)


HDRM_SPECS = [(u, m) for u in (1, 2, 4, 8, 16, 32) for m in (1, 2, 4, 8, 16, 32)
              if m <= u and 2 * u * m <= 64]


@pytest.mark.parametrize(("u", "m"), HDRM_SPECS)
def test_hdrm_is_an_allreduce_and_contention_free(u, m):
    spec = f"bigraph:upper={u},lower={u},hosts_per_switch={m}"
    topo = topology.build(spec)
    sched = generate("hdrm", topo, _size(2 * u * m))
    _proved(sched)
    # Proof of the placement, step by step: partners in different groups and
    # no directed upper-lower link used twice.
    role = {h.name: topo.switch(h.switch).role for h in topo.hosts}
    hosts = sched.hosts
    assert sorted(hosts, key=topology.node_sort_key) == [h.name for h in topo.hosts]
    per_step: dict[int, list[tuple[str, str]]] = {}
    for prog in sched.ranks:
        for op in prog.ops:
            if op.kind == "send":
                src, dst = hosts[prog.rank], hosts[op.peer]
                assert role[src] != role[dst]
                per_step.setdefault(op.step, []).append((topo.host(src).switch, topo.host(dst).switch))
    for step, links in per_step.items():
        assert len(links) == len(set(links)), f"step {step} shares a switch link"
    assert max(analyze(sched, topo, "shortest").max_flows_per_link) == 1


def test_hdrm_placement_puts_m_ranks_on_every_switch():
    topo = topology.build("bigraph:upper=4,lower=4,hosts_per_switch=4")
    hosts = hdrm_placement(topo)
    per_switch: dict[str, int] = {}
    for h in hosts:
        per_switch[topo.host(h).switch] = per_switch.get(topo.host(h).switch, 0) + 1
    assert set(per_switch.values()) == {4} and len(per_switch) == 8
    for r, h in enumerate(hosts):
        assert topo.switch(topo.host(h).switch).role == ("upper" if bin(r).count("1") % 2 == 0 else "lower")


BIG = "bigraph:upper=4,lower=4,hosts_per_switch=4"
#: Every routing policy that applies to a bigraph (the others are refused, see the test after the next).
BIGRAPH_POLICIES = [p for p, kinds in routing.POLICY_KINDS.items() if kinds is None or "bigraph" in kinds]


@pytest.mark.parametrize("policy", BIGRAPH_POLICIES)
def test_hdrm_one_flow_per_link_while_hd_identity_collides(policy):
    topo = topology.build(BIG)
    hdrm = analyze(generate("hdrm", topo, 1 << 20), topo, policy)
    hd = analyze(generate("hd", topo, 1 << 20, placement="identity"), topo, policy)
    assert len(hdrm.max_flows_per_link) == 10
    assert all(n == 1 for n in hdrm.max_flows_per_link)
    assert max(hd.max_flows_per_link) > 1
    assert hd.maxmin_time_s > hdrm.maxmin_time_s


def test_every_policy_is_tested_above_or_refused_on_a_bigraph():
    topo = topology.build(BIG)
    for policy in routing.POLICIES:
        if policy in BIGRAPH_POLICIES:
            routing.check_policy(topo, policy)
        else:
            with pytest.raises(FieldError, match="field 'policy'"):
                analyze(generate("hdrm", topo, 1 << 20), topo, policy)
    assert {"bigraph", "ecmp", "shortest"} <= set(BIGRAPH_POLICIES)


def test_cross_group_pairs_have_a_unique_shortest_path():
    """Why every policy of the test above routes hdrm's transfers alike: each has one shortest path."""
    import networkx as nx

    topo = topology.build(BIG)
    role = {h.name: topo.switch(h.switch).role for h in topo.hosts}
    for a in ("h1", "h6"):
        for b in ("h17", "h30"):
            assert role[a] != role[b]
            assert len(list(nx.all_shortest_paths(topo.graph, a, b))) == 1


@pytest.mark.parametrize("spec, needle", [
    ("bigraph:upper=2,lower=2,hosts_per_switch=4", "at most 2 hosts per switch"),
    ("bigraph:upper=4,lower=2,hosts_per_switch=1", "upper = lower"),
    ("bigraph:upper=3,lower=3,hosts_per_switch=2", "power of two"),
    ("star:hosts=8", "bigraph"),
])
def test_hdrm_refuses_topologies_that_cannot_be_contention_free(spec, needle):
    with pytest.raises(FieldError, match=needle):
        generate("hdrm", topology.build(spec), 1 << 20)


def test_random_placement_is_seeded_and_still_an_allreduce():
    topo = topology.build("star:hosts=8")
    a = generate("hd", topo, 4096, placement="random", seed=3)
    b = generate("hd", topo, 4096, placement="random", seed=3)
    c = generate("hd", topo, 4096, placement="random", seed=4)
    assert a.hosts == b.hosts != c.hosts
    _proved(a)


def test_chunks_must_be_a_multiple_and_size_must_split():
    topo = topology.build("star:hosts=4")
    with pytest.raises(FieldError, match="chunks"):
        generate("ring", topo, 1 << 20, chunks=6)
    with pytest.raises(FieldError, match="multiple of 12 bytes"):
        generate("ring", topology.build("star:hosts=3"), 65536)
    with pytest.raises(FieldError, match="algo"):
        generate("tree", topo, 1 << 20)
    with pytest.raises(FieldError, match="hdrm"):
        generate("hdrm", topology.build(BIG), 1 << 20, placement="identity")
    sched = generate("ring", topo, 1 << 20, chunks=8)
    assert sched.ranks[0].ops[0].nchunks == 2
    _proved(sched)


@pytest.mark.parametrize("algo", ["ring", "hd", "dbtree", "hier"])
def test_generated_schedules_pass_field_validation(algo):
    sched = generate(algo, topology.build("leafspine:leaves=3,spines=2,hosts_per_leaf=2"), 4 * 8 * 6)
    assert validate(sched) == sched


@pytest.mark.parametrize("p", [2, 3, 7, 8, 13])
def test_double_binary_tree_shape(p):
    trees = double_binary_tree(p)
    for root, parent in trees:
        assert parent[root] == -1
        assert sum(1 for x in parent if x == -1) == 1
        for r in range(p):  # every rank reaches the root
            seen, v = 0, r
            while parent[v] != -1:
                v, seen = parent[v], seen + 1
                assert seen <= p
            assert v == root
