"""The collective algorithms' generators: one function per (collective, algorithm), which the registry
(:mod:`emulator.model.collectives.registry`) names and
:func:`~emulator.model.collectives.generators.generate` runs on a :class:`Plan`.
``size`` is nccl-tests' size of the collective: the bytes of each rank's
``data`` buffer (every collective below keeps input and result the same
size).

Allreduce (in place; its algorithms in the registry's order):

``ring``
    Reduce-scatter then all-gather around the ring ``0 -> 1 -> ... -> p-1 -> 0``,
    ``2(p-1)`` steps, ``p`` chunks (block ``b`` = chunk ``b``).
``hd``
    Rabenseifner: recursive halving reduce-scatter (step ``s`` pairs ranks
    differing in bit ``s``), then recursive doubling all-gather in reverse.
    For ``p`` not a power of two, with ``P`` the largest power of two below
    ``p`` and ``x = p - P``: a first step where rank ``2i`` (``i < x``) hands
    its whole buffer to rank ``2i+1``, halving-doubling among the ``P``
    remaining ranks, and a last step returning the result to rank ``2i``.
    ``P`` chunks; ``2 log2 P`` steps, plus 2 when ``p`` is not a power of two.
``hdrm``
    ``hd`` with the HDRM placement (:func:`hdrm_placement`). On a topology
    with servers the placement is the identity over accelerators (rank ``r``
    on local accelerator ``r mod A`` of server ``r // A``), with ``S`` and
    ``A`` powers of two: the first ``log2(A)`` steps, the largest, pair
    accelerators of one server (over PCIe), the others pair the same local
    accelerator of two servers (so the same NIC index when ``N = A``). With
    ``N = A`` and ``nic_placement=hdrm`` on a BiGraph where HDRM exists, NIC
    ``g = s·A + j`` sits on the slot HDRM gives rank ``g``, so no NIC or fabric
    link carries two flows in any step (proved in the tests with
    :func:`emulator.model.prediction.cost.analyze`). With ``N = 1`` the ``A``
    accelerators of a server share its NIC in the inter-server steps.
``dbtree``
    NCCL-style double binary tree: two complementary binary trees each reduce
    half of the buffer towards their root and broadcast it back, pipelined in
    chunks (``chunks`` in all, half per tree, default 8).
``hier``
    Hierarchical: ranks on the same switch form a group: with servers, the
    accelerators of one server (they share its PCIe switch); without, the
    hosts of one fabric switch. Ring reduce-scatter inside each group, ring
    allreduce across groups among the ranks with the same local index (with
    servers and ``N = A``: each over its own NIC), ring all-gather inside
    each group. ``p`` chunks, ``2(g-1) + 2(S-1)`` steps for ``S`` groups of
    ``g`` ranks.
``nccl``
    NCCL's ring algorithm over ``C = chunks / p`` channels, each its own lane
    and ring order (:mod:`emulator.model.collectives.nccl_rings`); also for
    ``reduce_scatter`` and ``allgather``.
``nccl-nvls``
    NCCL's NVLS tree over ``C = chunks / 16`` channels: every GPU below its
    node's head, the heads on the double binary tree between servers,
    pipelined in 16 pieces a channel (:mod:`emulator.model.collectives.nccl_rings`).
``nccl-tree``
    NCCL's tree over ``C = chunks / 8`` channels: the double binary tree
    between servers, a chain inside each, pipelined in 8 pieces a channel
    (:mod:`emulator.model.collectives.nccl_rings`).
``rd``
    Recursive doubling (Open MPI's allreduce algorithm 3, its choice for small
    messages): step ``s`` pairs ranks differing in bit ``s``, and each pair
    swaps and adds its whole buffer. ``p`` not a power of two is handled as
    for ``hd``. One chunk; ``log2 P`` steps, plus 2 when ``p`` is not a power
    of two.

The other collectives, with ``k = chunks / p`` chunks per rank's block
(block ``b`` = chunks ``b·k..b·k+k-1``):

``reduce_scatter`` (in place, NCCL's layout: rank ``r``'s result is block ``r`` of ``data``)
    ``ring``: the ring reduce-scatter above, shifted by one rank so that rank
    ``r`` ends with block ``r``; ``p-1`` steps. ``hd``/``hdrm``: recursive
    halving, ``log2 p`` steps, the first pairing ranks ``p/2`` apart (rank
    ``r`` keeps the half holding block ``r``, MPICH's order), power-of-two
    ``p`` only. ``direct``: pairwise, ``p-1`` lockstep steps; in step ``s``
    rank ``r`` sends block ``r+s`` to rank ``r+s`` and adds in block ``r``
    from rank ``r-s`` (mod ``p``), so every rank sends and receives one
    message per step. ``hier``: two levels over the groups of ``hier``
    (:func:`hier_groups`: a server's accelerators), as NCCL runs them on
    servers with rails: a ring reduce-scatter inside every group in which
    local rank ``j`` collects the blocks of every group's ``j``-th rank (one
    message per block, ``S`` of them per step), then a ring reduce-scatter
    across the groups among the ``j``-th ranks, each keeping its own block.
    Per rank ``(g-1)·S`` blocks inside its group and ``S-1`` across groups
    (on rail fabrics, on its own rail); ``(g-1) + (S-1)`` steps.
``allgather`` (in place, NCCL's layout: rank ``r``'s input is block ``r`` of ``data``)
    ``ring``: ``p-1`` steps around the ring. ``hd``/``hdrm``: recursive
    doubling, ``log2 p`` steps, the first pairing neighbours (ranks differing
    in bit 0), power-of-two ``p`` only. ``direct``: pairwise, step ``s``
    sends rank ``r``'s block to rank ``r+s``. ``hier``: the reduce-scatter's
    mirror, across groups first (every ``j``-th rank gathers the blocks of
    the other ``j``-th ranks), then inside every group.
``alltoall`` (out of place: ``output`` has as many chunks as ``data``)
    ``direct`` only: a local copy of the rank's own block, then ``p-1``
    lockstep steps, step ``s`` sending ``data`` block ``r+s`` to rank ``r+s``
    (into its ``output`` block ``r``) and receiving from rank ``r-s``.
    Halving-doubling has no alltoall and no store-and-forward ring is
    implemented: ``hd``, ``hdrm`` and ``ring`` are refused.
``broadcast`` (in place: every rank's ``data`` ends as the root's)
    ``ring``: a pipelined chain ``root -> root+1 -> ... -> root-1`` in
    ``chunks`` pieces (default 8), ``chunks + p - 2`` steps. ``dbtree``: the
    double binary tree of :func:`double_binary_tree` over the ``p-1`` other
    ranks (rank ``root+1+v`` is tree rank ``v``), each tree carrying half of
    the chunks, which the root hands to both tree roots; pipelined,
    ``chunks/2 + floor(log2(p-1))`` steps. ``hd``/``hdrm``: van de Geijn,
    a binomial scatter from the root then a recursive doubling allgather,
    ``2 log2 p`` lockstep steps, power-of-two ``p``; ranks are renumbered
    ``r xor root`` so that partners still differ in one bit (what HDRM
    needs).
``reduce`` (in place: the root's ``data`` ends with the sum; other ranks' data is scratch)
    The mirror images: ``ring`` is the chain ``root+1 -> root+2 -> ... ->
    root``; ``dbtree`` reduces up both trees and the tree roots add their
    halves into the root; ``hd``/``hdrm`` (Rabenseifner's reduce) is a
    recursive halving reduce-scatter then a binomial gather to the root.

Every generator is proved by the symbolic executor in the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emulator.base.errors import FieldError
from emulator.model.collectives.blocks import (
    Builder,
    binomial_gather,
    binomial_scatter,
    block_order,
    double_binary_tree,
    halving_doubling,
    recursive_doubling,
    recursive_halving,
    ring_all_gather,
    ring_pieces,
    ring_reduce_scatter,
    rooted_trees,
    tree_shape,
)
from emulator.model.collectives.placements import WHERE
from emulator.model.topology import Topology


@dataclass(frozen=True)
class Plan:
    """What a recipe builds on: ``chunks`` data chunks, ``unit`` chunks per block of the recipe's base count."""

    b: Builder
    p: int
    chunks: int
    unit: int
    root: int
    topo: Topology
    hosts: list[str]


def per_rank(p: int) -> int:
    """Chunks in multiples of ``p``: one block per rank."""
    return p


def pow2_below(p: int) -> int:
    """The largest power of two <= ``p``."""
    return 1 << (p.bit_length() - 1)


def one(p: int) -> int:
    """Any number of chunks."""
    return 1


def two(p: int) -> int:
    """An even number of chunks (half per tree)."""
    return 2


def _shifted(p: int) -> list[int]:
    """Ring members so that member ``i`` (rank ``i+1``) ends a reduce-scatter with, or starts an all-gather
    from, block ``i+1``: its own."""
    return [(i + 1) % p for i in range(p)]


def allreduce_ring(pl: Plan) -> None:
    ranks = list(range(pl.p))
    s = ring_reduce_scatter(pl.b, ranks, 0, pl.unit, 0)
    ring_all_gather(pl.b, ranks, 0, pl.unit, s)


def _power_of_two_core(pl: Plan, core: Callable[[list[int], int], int]) -> None:
    """``core(members, first_step)`` (returning its steps) among the largest power of two of ranks; for ``p`` not
    a power of two, with ``x = p - P`` extra ranks, rank ``2i`` (``i < x``) first hands its whole buffer to rank
    ``2i+1`` and gets the result back last (Open MPI's and MPICH's rule)."""
    b, p = pl.b, pl.p
    extra = p - pow2_below(p)
    if extra == 0:
        core(list(range(p)), 0)
        return
    for i in range(extra):
        b.xfer(2 * i, 2 * i + 1, 0, pl.chunks, 0, reduce=True)
    members = [2 * i + 1 for i in range(extra)] + list(range(2 * extra, p))
    steps = core(members, 1)
    for i in range(extra):
        b.xfer(2 * i + 1, 2 * i, 0, pl.chunks, 1 + steps, reduce=False)


def allreduce_hd(pl: Plan) -> None:
    _power_of_two_core(pl, lambda members, step0: halving_doubling(pl.b, members, pl.unit, step0))


def allreduce_rd(pl: Plan) -> None:
    def doubling(members: list[int], step0: int) -> int:
        steps = len(members).bit_length() - 1
        for s in range(steps):
            for i, rank in enumerate(members):
                if i < i ^ (1 << s):
                    pl.b.swap_and_add(rank, members[i ^ (1 << s)], 0, pl.chunks, step0 + s)
        return steps
    _power_of_two_core(pl, doubling)


def allreduce_dbtree(pl: Plan) -> None:
    b, p = pl.b, pl.p
    per_tree = pl.chunks // 2
    for t, (root, parent) in enumerate(double_binary_tree(p)):
        depth, height = tree_shape(root, parent)
        top = height[root]
        for c in range(per_tree):
            chunk = t * per_tree + c
            for v in range(p):
                if parent[v] >= 0:
                    b.xfer(v, parent[v], chunk, 1, c + height[v], reduce=True)
            for v in range(p):
                if parent[v] >= 0:
                    b.xfer(parent[v], v, chunk, 1, c + top + depth[v] - 1, reduce=False)


def hier_groups(topo: Topology, hosts: list[str]) -> list[list[int]]:
    """The ranks of every group of ``hier``, by switch: with servers the accelerators of one server, without
    the hosts of one fabric switch; groups in switch order, ranks in rank order. :class:`FieldError` unless
    every group has as many ranks."""
    servers: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        servers.setdefault(topo.host(h).switch, []).append(r)
    groups = [servers[s.name] for s in topo.switches if s.name in servers]
    if len({len(g) for g in groups}) != 1:
        raise FieldError(WHERE, "topology", "the same number of hosts on every host-bearing switch for hier",
                         topo.spec)
    return groups


def _rotated(members: list[int]) -> list[int]:
    """``members`` one place on: in a ring reduce-scatter member ``i`` ends with block ``(i+1) % m``, so member
    ``k`` of ``members`` ends with block ``k``."""
    return members[1:] + members[:1]


def _hier_blocks(groups: list[list[int]], unit: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """For a hierarchical reduce-scatter or all-gather in NCCL's layout (rank ``r``'s block is chunks
    ``r·unit..``): inside a group, local rank ``j``'s block is the pieces of every group's ``j``-th rank; across
    groups, among the ``j``-th ranks, rank ``r``'s block is its own piece."""
    g = len(groups[0])
    inside = [[grp[j] * unit for grp in groups] for j in range(g)]
    across = [[[grp[j] * unit] for grp in groups] for j in range(g)]
    return inside, across


def reduce_scatter_hier(pl: Plan) -> None:
    groups = hier_groups(pl.topo, pl.hosts)
    inside, across = _hier_blocks(groups, pl.unit)
    steps = 0
    if len(groups[0]) > 1:
        for grp in groups:
            steps = ring_pieces(pl.b, _rotated(grp), inside, pl.unit, 0, reduce=True)
    if len(groups) > 1:
        for j in range(len(groups[0])):
            ring_pieces(pl.b, _rotated([grp[j] for grp in groups]), across[j], pl.unit, steps, reduce=True)


def allgather_hier(pl: Plan) -> None:
    groups = hier_groups(pl.topo, pl.hosts)
    inside, across = _hier_blocks(groups, pl.unit)
    steps = 0
    if len(groups) > 1:
        for j in range(len(groups[0])):
            steps = ring_pieces(pl.b, _rotated([grp[j] for grp in groups]), across[j], pl.unit, 0,
                                reduce=False)
    if len(groups[0]) > 1:
        for grp in groups:
            ring_pieces(pl.b, _rotated(grp), inside, pl.unit, steps, reduce=False)


def allreduce_hier(pl: Plan) -> None:
    b, unit = pl.b, pl.unit
    groups = hier_groups(pl.topo, pl.hosts)
    g, n_servers = len(groups[0]), len(groups)
    bs = n_servers * unit  # one block per local rank, made of one sub-block per server
    step = 0
    if g > 1:
        for grp in groups:
            ring_reduce_scatter(b, grp, 0, bs, step)
        step += g - 1
    if n_servers > 1:
        for j in range(g):
            members = [grp[j] for grp in groups]
            lo = ((j + 1) % g) * bs
            s = ring_reduce_scatter(b, members, lo, unit, step)
            ring_all_gather(b, members, lo, unit, step + s)
        step += 2 * (n_servers - 1)
    if g > 1:
        for grp in groups:
            ring_all_gather(b, grp, 0, bs, step)


def _pairwise(pl: Plan, blocks: Callable[[int, int], tuple[int, int]], reduce: bool, to_buffer: str = "data") -> None:
    """``p-1`` steps; in step ``s`` rank ``r`` sends to rank ``d = r+s`` (mod ``p``) its ``data`` block
    ``blocks(r, d)[0]``, which lands in ``d``'s block ``blocks(r, d)[1]`` of ``to_buffer``."""
    for s in range(1, pl.p):
        for r in range(pl.p):
            d = (r + s) % pl.p
            send, recv = blocks(r, d)
            pl.b.xfer(r, d, send * pl.unit, pl.unit, s - 1, reduce, to_chunk=recv * pl.unit, to_buffer=to_buffer)


def reduce_scatter_ring(pl: Plan) -> None:
    ring_reduce_scatter(pl.b, _shifted(pl.p), 0, pl.unit, 0)


def reduce_scatter_hd(pl: Plan) -> None:
    recursive_halving(pl.b, block_order(pl.p), pl.unit, 0)


def reduce_scatter_direct(pl: Plan) -> None:
    _pairwise(pl, lambda r, d: (d, d), reduce=True)


def allgather_ring(pl: Plan) -> None:
    ring_all_gather(pl.b, _shifted(pl.p), 0, pl.unit, 0)


def allgather_hd(pl: Plan) -> None:
    members = block_order(pl.p)
    recursive_doubling(pl.b, members, pl.unit, 0, [(r, r + 1) for r in members])


def allgather_direct(pl: Plan) -> None:
    _pairwise(pl, lambda r, d: (r, r), reduce=False)


def alltoall_direct(pl: Plan) -> None:
    for r in range(pl.p):
        pl.b.copy(r, "output", r * pl.unit, "data", r * pl.unit, pl.unit, 0)
    _pairwise(pl, lambda r, d: (d, r), reduce=False, to_buffer="output")


def _chain(pl: Plan, chain: list[int], reduce: bool) -> None:
    """Every chunk down ``chain``, pipelined: hop ``j`` carries chunk ``c`` in step ``c + j``."""
    for c in range(pl.chunks):
        for j in range(len(chain) - 1):
            pl.b.xfer(chain[j], chain[j + 1], c, 1, c + j, reduce)


def broadcast_ring(pl: Plan) -> None:
    _chain(pl, [(pl.root + j) % pl.p for j in range(pl.p)], reduce=False)


def reduce_ring(pl: Plan) -> None:
    _chain(pl, [(pl.root + 1 + j) % pl.p for j in range(pl.p)], reduce=True)


def broadcast_dbtree(pl: Plan) -> None:
    half = pl.chunks // 2
    for t, tree in enumerate(rooted_trees(pl.p, pl.root)):
        for c in range(half):
            chunk = t * half + c
            pl.b.xfer(pl.root, tree.root, chunk, 1, c, reduce=False)
            for e in tree.edges:
                pl.b.xfer(e.parent, e.child, chunk, 1, c + e.depth, reduce=False)


def reduce_dbtree(pl: Plan) -> None:
    half = pl.chunks // 2
    for t, tree in enumerate(rooted_trees(pl.p, pl.root)):
        for c in range(half):
            chunk = t * half + c
            for e in tree.edges:
                pl.b.xfer(e.child, e.parent, chunk, 1, c + e.height, reduce=True)
            pl.b.xfer(tree.root, pl.root, chunk, 1, c + tree.height, reduce=True)


def broadcast_hd(pl: Plan) -> None:
    steps = binomial_scatter(pl.b, pl.p, pl.unit, pl.root, 0)
    members = block_order(pl.p, pl.root)
    recursive_doubling(pl.b, members, pl.unit, steps, [(r ^ pl.root, (r ^ pl.root) + 1) for r in members])


def reduce_hd(pl: Plan) -> None:
    recursive_halving(pl.b, block_order(pl.p, pl.root), pl.unit, 0)
    binomial_gather(pl.b, pl.p, pl.unit, pl.root, pl.p.bit_length() - 1)
