"""NCCL's ring, tree and NVLS tree over channels (``nccl``, ``nccl-tree``, ``nccl-nvls``): proved by symbolic
execution on servers and without, with each channel on its own lane and leaving every server by its own rail."""

from __future__ import annotations

import pytest

from emulator.model import topology
from emulator.model.collectives.generators import generate
from emulator.model.collectives.nccl_rings import (
    NVLS_PIECES,
    TREE_PIECES,
    channel_ring,
    channel_tree,
    nodes_of,
    nvls_tree,
)
from emulator.model.schedule.executor import execute
from emulator.model.schedule.format import match_transfers

RAILS_2X8 = "railonly:rails=8,hosts_per_rail=2,servers=2,accels_per_server=8,nics_per_server=8,bw=20,domain_bw=180"
RAILS_4X4 = "railonly:rails=4,hosts_per_rail=4,servers=4,accels_per_server=4,nics_per_server=4"
SHARED_NIC = "leafspine:leaves=2,spines=1,hosts_per_leaf=2,servers=2,accels_per_server=4,nics_per_server=1"
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")


def _schedule(spec: str, collective: str, channels: int):
    topo = topology.build(spec)
    p = len(topo.hosts)
    return generate("nccl", topo, 4 * p * channels * 3, chunks=p * channels, collective=collective)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize(("spec", "channels"), [(RAILS_2X8, 16), (RAILS_4X4, 3), (SHARED_NIC, 2),
                                                ("star:hosts=5", 4), ("star:hosts=2", 1)])
def test_every_collective_over_channels_is_proved(spec, collective, channels):
    sched = _schedule(spec, collective, channels)
    result = execute(sched)
    assert result.valid, result.errors[:3]
    assert result.deadlock is None
    p = sched.p
    assert sched.steps == (2 * (p - 1) if collective == "allreduce" else p - 1)
    lanes = {op.lane for prog in sched.ranks for op in prog.ops}
    assert lanes == set(range(channels))


def test_a_channel_enters_every_server_at_its_own_gpu_and_visits_them_all():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert channel_ring(nodes, 0) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert channel_ring(nodes, 1) == [1, 2, 3, 0, 5, 6, 7, 4]
    assert channel_ring(nodes, 5) == [1, 2, 3, 0, 5, 6, 7, 4]  # channel c + G: the same ring, another connection


def test_without_servers_every_rank_is_a_node():
    topo = topology.build("star:hosts=3")
    assert nodes_of(topo, [h.name for h in topo.hosts]) == [[0], [1], [2]]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_the_hops_between_servers_arrive_by_the_channels_rail(collective):
    """Channel c's transfers into a server land on its GPU c mod G, whose NIC is rail c mod G: with 2G channels
    each rail carries exactly two channels' traffic, in both directions."""
    topo = topology.build(RAILS_2X8)
    sched = _schedule(RAILS_2X8, collective, 16)
    rails: dict[int, set[int]] = {}
    for a, send_id, b, _ in match_transfers(sched):
        if topo.server_of(sched.ranks[a].host) == topo.server_of(sched.ranks[b].host):
            continue
        lane = sched.ranks[a].ops[send_id].lane
        receiver_gpu = b % 8
        assert receiver_gpu == lane % 8
        rails.setdefault(receiver_gpu, set()).add(lane)
    assert rails == {g: {g, g + 8} for g in range(8)}


def test_channels_must_divide_the_chunks():
    topo = topology.build(RAILS_4X4)
    with pytest.raises(Exception, match="field 'chunks'.*times the channels"):
        generate("nccl", topo, 1 << 16, chunks=17)


@pytest.mark.parametrize("algorithm", ["nccl-tree", "nccl-nvls"])
@pytest.mark.parametrize(("spec", "channels"), [(RAILS_2X8, 16), (RAILS_4X4, 3), (SHARED_NIC, 2),
                                                ("star:hosts=5", 4), ("star:hosts=2", 1), ("star:hosts=9", 2)])
def test_the_tree_allreduces_over_channels_are_proved(spec, channels, algorithm):
    topo = topology.build(spec)
    pieces = NVLS_PIECES if algorithm == "nccl-nvls" else TREE_PIECES
    sched = generate(algorithm, topo, 4 * pieces * channels * 3, chunks=pieces * channels)
    result = execute(sched)
    assert result.valid, result.errors[:3]
    assert result.deadlock is None
    assert {op.lane for prog in sched.ranks for op in prog.ops if op.is_comm} == set(range(channels))


def test_a_tree_channel_chains_a_servers_gpus_below_its_head_and_links_heads_across_servers():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7]]
    root, parent = channel_tree(nodes, 1)
    # channel 1: heads are GPU 1 of each server; the chains go 1 -> 2 -> 3 -> 0 below them
    assert parent[2] == 1 and parent[3] == 2 and parent[0] == 3
    assert parent[6] == 5 and parent[7] == 6 and parent[4] == 7
    assert {root, parent[root]} == {1, -1} or {root, parent[root]} == {5, -1}
    other = 5 if root == 1 else 1
    assert parent[other] == root
    # NCCL's two copies of a graph channel (c and c + G, on one NIC) take the two trees of the double binary tree,
    # which swap roots; channels 0 .. G-1 share the first
    assert channel_tree(nodes, 0)[0] % 4 == 0 and channel_tree(nodes, 0)[0] // 4 == root // 4
    twin = channel_tree(nodes, 5)[0]
    assert twin % 4 == 1 and twin // 4 != root // 4


def test_an_nvls_channel_puts_a_servers_gpus_below_its_head_and_links_heads_across_servers():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    root, parent = nvls_tree(nodes, 2)
    assert [parent[r] for r in (0, 1, 3)] == [2, 2, 2] and [parent[r] for r in (8, 9, 11)] == [10, 10, 10]
    heads = {2, 6, 10}
    assert root in heads and parent[root] == -1
    assert all(parent[h] in heads for h in heads - {root})
    assert nvls_tree(nodes, 3)[0] % 4 == 3
    assert nvls_tree(nodes, 2)[0] != nvls_tree(nodes, 6)[0]  # channel c + G: the other tree, another root


@pytest.mark.parametrize("algorithm", ["nccl-tree", "nccl-nvls"])
def test_a_parents_receives_wait_for_nothing_but_their_data(algorithm):
    """Every receive of the tree goes into a scratch range of its own, so that it is posted at once (its clear to
    send off the critical path, as NCCL's receive buffers are ready before the collective)."""
    topo = topology.build(RAILS_4X4)
    pieces = NVLS_PIECES if algorithm == "nccl-nvls" else TREE_PIECES
    sched = generate(algorithm, topo, 4 * pieces * 4 * 3, chunks=pieces * 4)
    for prog in sched.ranks:
        for op in prog.ops:
            if op.kind == "recv":
                assert op.buffer == "scratch" and op.deps == ()
