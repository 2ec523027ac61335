"""Every generator, at every supported p from 2 to 64, is proved an allreduce by symbolic execution; every other
collective's generators at p = 2, 3, 4, 6, 8, 12 and 16 (and random p and sizes) are proved the same way."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from emulator.base.errors import FieldError
from emulator.model import routing, topology
from emulator.model.collectives.blocks import double_binary_tree, rooted_trees
from emulator.model.collectives.generators import generate
from emulator.model.collectives.placements import hdrm_placement
from emulator.model.collectives.registry import GENERATED, REGISTRY, algorithms
from emulator.model.prediction.cost import analyze
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import Schedule, match_transfers, validate, with_ops
from emulator.model.schedule.semantics import COLLECTIVES, ROOTED

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
def test_rd_is_an_allreduce_of_whole_buffers_including_non_powers_of_two(p):
    sched = generate("rd", topology.build(f"star:hosts={p}"), 4 * 64 * 3)
    _proved(sched)
    k = p.bit_length() - 1
    assert sched.steps == k + (0 if p == 1 << k else 2)
    assert sched.chunks == 1 and sched.scratch_chunks == 1
    sends = [op for r in sched.ranks for op in r.ops if op.kind == "send"]
    assert all(op.bytes == sched.size for op in sends)  # every message is the whole buffer
    pairs = {(r.rank, op.peer) for r in sched.ranks for op in r.ops if op.kind == "send" and op.step == (p > 1 << k)}
    assert all((b, a) in pairs for a, b in pairs)  # a step swaps: each sends to whom it receives from


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
                src, dst = hosts[prog.rank], hosts[op.partner]
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
BIGRAPH_POLICIES = [p for p in routing.POLICIES if "bigraph" in (routing.policy_kinds(p) or ("bigraph",))]


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
    with pytest.raises(FieldError, match="at least 12 bytes"):
        generate("ring", topology.build("star:hosts=3"), 8)
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


# ---------------------------------------------------------------------------
# The other collectives
# ---------------------------------------------------------------------------

OTHER = [(c, a) for c, a in REGISTRY if c != "allreduce" and a != "hdrm"]
ROOTED_PAIRS = [(c, a) for c, a in OTHER if c in ROOTED]


def _ps(collective: str, algo: str) -> list[int]:
    """2, 3, 4, 8, 16 and the non-powers of two 6 and 12 where the algorithm takes them."""
    return [p for p in (2, 3, 4, 6, 8, 12, 16) if not REGISTRY[(collective, algo)].power_of_two or p & (p - 1) == 0]


def _cases() -> list[tuple[str, str, int]]:
    return [(c, a, p) for c, a in OTHER for p in _ps(c, a)]


def _gen(collective: str, algo: str, p: int, *, root: int = 0, mult: int = 1, **kw) -> Schedule:
    topo = topology.build(f"star:hosts={p}")
    return generate(algo, topo, 4 * 16 * p * mult, collective=collective, root=root, **kw)


@pytest.mark.parametrize(("collective", "algo", "p"), _cases())
def test_every_collective_and_algorithm_is_proved(collective, algo, p):
    roots = [0, p - 1, p // 2] if collective in ROOTED else [0]
    for root in sorted(set(roots)):
        sched = _gen(collective, algo, p, root=root)
        assert sched.collective == collective and sched.root == root and sched.algorithm == algo
        assert validate(sched) == sched
        _proved(sched)


def _expected_steps(collective: str, algo: str, p: int, chunks: int) -> int:
    k = p.bit_length() - 1
    if algo == "hd":
        return k if collective in ("reduce_scatter", "allgather") else 2 * k
    if collective in ROOTED:
        return chunks + p - 2 if algo == "ring" else chunks // 2 + (p - 1).bit_length() - 1
    return p - 1


@pytest.mark.parametrize(("collective", "algo", "p"), _cases())
def test_steps_and_buffers(collective, algo, p):
    sched = _gen(collective, algo, p)
    assert sched.steps == _expected_steps(collective, algo, p, sched.chunks)
    pipelined = collective in ROOTED and algo in ("ring", "dbtree")
    assert sched.chunks == (8 if pipelined else p)
    # alltoall is out of place; the others in place (NCCL's layout for reduce_scatter and allgather)
    assert sched.output_chunks == (sched.chunks if collective == "alltoall" else 0)
    assert sched.collective_bytes == sched.size


@given(pair=st.sampled_from(OTHER), p=st.integers(2, 20), mult=st.integers(1, 3), root=st.integers(0, 19),
       extra=st.integers(1, 3))
@settings(max_examples=150, deadline=None)
def test_random_sizes_and_chunk_counts_are_proved(pair, p, mult, root, extra):
    collective, algo = pair
    how = REGISTRY[pair]
    assume(not how.power_of_two or p & (p - 1) == 0)
    base = how.base(p)
    chunks = (how.default or base) * extra if base > 1 else extra
    sched = _gen(collective, algo, p, root=root % p if collective in ROOTED else 0, mult=mult * chunks,
                 chunks=chunks)
    assert sched.chunks == chunks
    _proved(sched)


SMALL = "bigraph:upper=2,lower=2,hosts_per_switch=2"


@pytest.mark.parametrize("spec", [SMALL, BIG])
@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce"])
def test_hdrm_is_contention_free_for_every_collective_that_has_hd(spec, collective):
    topo = topology.build(spec)
    p = len(topo.hosts)
    for root in ([0, 5, p - 1] if collective in ROOTED else [0]):
        sched = generate("hdrm", topo, 4 * p * 64, collective=collective, root=root)
        assert sched.placement == "hdrm" and sched.hosts == hdrm_placement(topo)
        _proved(sched)
        assert analyze(sched, topo, "shortest").max_flows_per_link == [1] * sched.steps


def test_direct_pairs_every_rank_with_one_sender_and_one_receiver_per_step():
    for collective in ("reduce_scatter", "allgather", "alltoall"):
        sched = _gen(collective, "direct", 6)
        per_step: dict[int, list[tuple[int, int]]] = {}
        for prog in sched.ranks:
            for op in prog.ops:
                if op.kind == "send":
                    per_step.setdefault(op.step, []).append((prog.rank, op.partner))
        for step, pairs in per_step.items():
            assert sorted(pairs) == [(r, (r + step + 1) % 6) for r in range(6)]


def test_rooted_trees_cover_the_other_ranks_with_height_log2_p_minus_1():
    for p in range(2, 40):
        for root in (0, p - 1):
            trees = rooted_trees(p, root)
            assert len(trees) == 2
            for tree in trees:
                reached = {tree.root} | {e.child for e in tree.edges}
                assert reached == set(range(p)) - {root}
                assert tree.height == (p - 1).bit_length() - 1
                assert max((e.depth for e in tree.edges), default=0) == tree.height


@pytest.mark.parametrize(("collective", "algo", "needle"), [
    ("alltoall", "hd", "halving-doubling has no alltoall"),
    ("alltoall", "hdrm", "halving-doubling has no alltoall"),
    ("alltoall", "ring", "no store-and-forward ring"),
    ("allgather", "dbtree", "one of ring, hd, hdrm, direct, hier, nccl for allgather"),
    ("broadcast", "direct", "one of ring, dbtree, hd, hdrm for broadcast"),
    ("broadcast", "hier", "for broadcast"),
])
def test_undefined_algorithms_are_refused_naming_the_allowed_ones(collective, algo, needle):
    with pytest.raises(FieldError, match="field 'algo'") as err:
        generate(algo, topology.build("star:hosts=4"), 1 << 12, collective=collective)
    assert needle in str(err.value)
    assert algo not in algorithms(collective)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "broadcast", "reduce"])
def test_hd_needs_a_power_of_two(collective):
    with pytest.raises(FieldError, match="field 'algo'.*power-of-two number of ranks") as err:
        generate("hd", topology.build("star:hosts=6"), 4 * 6 * 16, collective=collective)
    assert "over 6 ranks" in str(err.value) and "ring" in str(err.value)


def test_bad_collective_root_and_chunks_are_refused():
    topo = topology.build("star:hosts=4")
    with pytest.raises(FieldError, match="field 'collective'"):
        generate("ring", topo, 1 << 12, collective="p2p")
    with pytest.raises(FieldError, match="field 'root'.*0..3"):
        generate("ring", topo, 1 << 12, collective="broadcast", root=4)
    with pytest.raises(FieldError, match="field 'root'.*nothing for allgather"):
        generate("ring", topo, 1 << 12, collective="allgather", root=1)
    with pytest.raises(FieldError, match="field 'chunks'.*multiple of 4"):
        generate("ring", topo, 1 << 12, collective="reduce_scatter", chunks=6)
    with pytest.raises(FieldError, match="field 'chunks'.*multiple of 2.*half per tree"):
        generate("dbtree", topo, 1 << 12, collective="reduce", chunks=3)
    with pytest.raises(FieldError, match="field 'placement'"):
        generate("hdrm", topology.build(BIG), 1 << 12, collective="allgather", placement="identity")


def test_algorithms_lists_allreduce_first_and_every_generated_collective():
    assert algorithms() == algorithms("allreduce") == ("ring", "hd", "hdrm", "dbtree", "hier", "nccl", "nccl-nvls",
                                                       "nccl-tree", "rd")
    assert set(GENERATED) == set(COLLECTIVES) - {"p2p"}
    assert algorithms("alltoall") == ("direct",)
    assert algorithms("p2p") == ()


def _result_transfer(sched: Schedule, kinds: tuple[str, ...] = ("recv", "recv_reduce")) -> tuple[int, int, int, int]:
    """The last matched transfer (by step) whose receive, of one of ``kinds``, lands in a result chunk."""
    shape = sched.shape
    best = None
    for a, send_id, b, recv_id in match_transfers(sched):
        recv = sched.ranks[b].ops[recv_id]
        if (recv.kind in kinds and recv.buffer == shape.result_buffer
                and shape.result_piece(b, recv.chunk) is not None):
            if best is None or recv.step >= sched.ranks[best[2]].ops[best[3]].step:
                best = (a, send_id, b, recv_id)
    assert best is not None
    return best


def _replace_op(sched: Schedule, rank: int, op_id: int, **changes) -> Schedule:
    ops = [list(r.ops) for r in sched.ranks]
    ops[rank][op_id] = dataclasses.replace(ops[rank][op_id], **changes)
    return with_ops(sched, ops)


@pytest.mark.parametrize(("collective", "algo", "p"), [(c, a, p) for c, a, p in _cases() if p in (3, 4, 8)])
def test_the_executor_catches_a_wrong_chunk_sent(collective, algo, p):
    sched = _gen(collective, algo, p, root=p - 1 if collective in ROOTED else 0)
    a, send_id, b, recv_id = _result_transfer(sched)
    send, recv = sched.ranks[a].ops[send_id], sched.ranks[b].ops[recv_id]
    other = 0 if send.chunk else send.nchunks
    assert other + send.nchunks <= sched.chunks
    result = execute(_replace_op(sched, a, send_id, chunk=other))
    assert not result.valid
    assert any(f"rank {b}" in e and f"chunk {recv.chunk}" in e for e in result.errors), result.errors


@pytest.mark.parametrize(("collective", "algo", "p"),
                         [(c, a, p) for c, a, p in _cases() if c in ("reduce_scatter", "reduce") and p in (2, 3, 8)])
def test_the_executor_catches_a_dropped_reduction(collective, algo, p):
    sched = _gen(collective, algo, p, root=1 if collective in ROOTED else 0)
    a, send_id, b, recv_id = _result_transfer(sched, ("recv_reduce",))
    recv = sched.ranks[b].ops[recv_id]
    result = execute(_replace_op(sched, b, recv_id, kind="recv"))
    assert not result.valid
    assert any(f"rank {b} chunk {recv.chunk}" in e and "misses the contribution" in e for e in result.errors), \
        result.errors
