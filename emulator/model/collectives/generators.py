"""Collective schedule generators and rank placements.

:func:`generate` builds a schedule of one collective
(:mod:`emulator.model.schedule.semantics`) over every host of a topology, one rank
per host. :data:`RECIPES` maps each (collective, algorithm) to its builder;
:func:`algorithms` lists a collective's algorithms (what the CLI offers and
the errors name). ``size`` is nccl-tests' size of the collective: the bytes
of each rank's ``data`` buffer (every collective below keeps input and result
the same size).

Allreduce (in place; ``ALGORITHMS``):

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

Placements: ``identity`` (rank ``r`` on host ``h(r+1)``; with servers
accelerators are numbered server by server), ``random`` (a seeded
permutation), ``hdrm`` (BiGraph without servers; any fabric with servers, see
``hdrm`` above: on the fabrics with rails and one NIC per rail, partners in
other servers share a local index and so a rail, and every step is
contention-free), ``rail`` (servers only: each odd server's accelerators in
reverse, so that a ring goes from server to server on one rail,
:func:`rail_placement`). ``hdrm`` is ``hd`` with the ``hdrm`` placement for every
collective that has ``hd``: each of their steps pairs ranks that differ in
one bit, as the allreduce's do (or a subset of such pairs).

All operations are filled in with their ``step``; ``deps`` come from
:func:`emulator.model.schedule.deps.derive_dep_indices`: the data hazards, plus for
``hd``, ``hdrm`` and ``direct`` the previous round's transfers (lockstep, see
:meth:`Builder.programs`). Every generator is proved by the symbolic executor
in the tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from emulator.base.errors import FieldError
from emulator.model.schedule.deps import derive_dep_indices
from emulator.model.schedule.format import (
    COPY,
    RECV,
    RECV_REDUCE,
    REDUCE,
    SEND,
    ChunkLayout,
    Op,
    RankProgram,
    Schedule,
    chunk_layout,
    is_power_of_two,
)
from emulator.model.schedule.semantics import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE_SCATTER,
    REDUCE_TO_ROOT,
    ROOTED,
    Shape,
)
from emulator.model.topology import Topology, hdrm_problem, hdrm_slot_order
from emulator.model.topology import build as build_topology

#: Allreduce's algorithms (experiments and the benchmark choose among these).
ALGORITHMS = ("ring", "hd", "hdrm", "dbtree", "hier", "rd")
PLACEMENTS = ("identity", "random", "hdrm", "rail")
DBTREE_DEFAULT_CHUNKS = 8
#: Pieces a pipelined broadcast or reduce (``ring``, ``dbtree``) cuts the buffer into by default.
PIPELINE_DEFAULT_CHUNKS = 8

WHERE = "schedule gen"


# ---------------------------------------------------------------------------
# Placements
# ---------------------------------------------------------------------------

def hdrm_placement(topo: Topology) -> list[str]:
    """Hosts for ranks ``0..p-1`` so that halving-doubling is contention-free.

    Without servers: a BiGraph with ``U = L``, ``M <= U`` hosts per switch
    and ``p = 2·U·M`` a power of two; rank ``r`` runs on the host of slot
    :func:`emulator.model.topology.hdrm_slot_order` ``[r]`` (the construction and
    its proof are there). With servers: the identity over accelerators, with
    ``servers`` and ``accels_per_server`` powers of two (see the module
    docstring).
    """
    if topo.has_servers:
        servers, accels = topo.params["servers"], topo.params["accels_per_server"]
        if not (is_power_of_two(servers) and is_power_of_two(accels)):
            raise FieldError(WHERE, "topology", "servers and accels_per_server powers of two for hdrm on servers "
                             "(rank r runs on accelerator r, the low bits of r pair accelerators of one server)",
                             topo.spec)
        return [h.name for h in topo.hosts]
    if topo.kind != "bigraph":
        raise FieldError(WHERE, "placement", "a bigraph topology for the hdrm placement", topo.spec)
    upper, m = topo.params["upper"], topo.params["hosts_per_switch"]
    problem = hdrm_problem(upper, topo.params["lower"], m)
    if problem:
        raise FieldError(WHERE, "topology", problem, topo.spec)
    return [topo.hosts[slot].name for slot in hdrm_slot_order(upper, m)]


def rail_placement(topo: Topology) -> list[str]:
    """Hosts for ranks ``0..p-1`` so that a ring crosses between servers on one rail: the servers in order,
    the accelerators of every even server in order and those of every odd server in reverse.

    A ring then enters and leaves every server by the same local index, ``0`` or ``A-1`` (with the rail NIC
    placement: the same rail), as NCCL's rings do: each hop between servers joins two NICs on one leaf, and
    no ring traffic crosses a spine, or on a rail-only fabric changes rails. With an odd number of servers
    the hop that closes the ring joins local ``A-1`` to ``0``. Needs servers.
    """
    if not topo.has_servers:
        raise FieldError(WHERE, "placement", "a topology with servers for the rail placement (it orders each "
                         "server's accelerators)", topo.spec)
    out: list[str] = []
    for s, accels in enumerate(topo.servers()):
        out += accels if s % 2 == 0 else accels[::-1]
    return out


def placement_hosts(topo: Topology, placement: str, seed: int = 0) -> list[str]:
    """Hosts of ranks ``0..p-1`` (``p`` = every host of ``topo``) under ``placement``."""
    if placement == "identity":
        return [h.name for h in topo.hosts]
    if placement == "random":
        hosts = [h.name for h in topo.hosts]
        random.Random(seed).shuffle(hosts)
        return hosts
    if placement == "hdrm":
        return hdrm_placement(topo)
    if placement == "rail":
        return rail_placement(topo)
    raise FieldError(WHERE, "placement", f"one of {', '.join(PLACEMENTS)}", placement)


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

@dataclass
class _Pending:
    kind: str
    peer: int | None
    chunk: int
    nchunks: int
    step: int
    buffer: str = "data"
    src: str | None = None
    src_chunk: int | None = None

    @property
    def source(self) -> tuple[str, int]:
        """``(src, src_chunk)`` of a copy (what :func:`emulator.model.schedule.deps.accesses` reads)."""
        assert self.src is not None and self.src_chunk is not None
        return self.src, self.src_chunk


class Builder:
    """Collects transfers; :meth:`programs` sorts each rank's ops by step and derives deps."""

    def __init__(self, p: int, layout: ChunkLayout):
        self.p = p
        self.layout = layout
        self.ops: list[list[_Pending]] = [[] for _ in range(p)]
        self.scratch_chunks = 0

    def xfer(self, src: int, dst: int, chunk: int, nchunks: int, step: int, reduce: bool, *,
             to_chunk: int | None = None, to_buffer: str = "data") -> None:
        """``src`` sends ``nchunks`` chunks of ``data`` from ``chunk`` to ``dst``, which adds them in (or overwrites).

        The receiver's range starts at ``to_chunk`` of ``to_buffer`` (default:
        the same chunk of ``data``).
        """
        self.ops[src].append(_Pending(SEND, dst, chunk, nchunks, step))
        self.ops[dst].append(_Pending(RECV_REDUCE if reduce else RECV, src, chunk if to_chunk is None else to_chunk,
                                      nchunks, step, to_buffer))

    def swap_and_add(self, a: int, b: int, chunk: int, nchunks: int, step: int) -> None:
        """``a`` and ``b`` send each other the same range of ``data`` and each adds the other's in, as
        ``MPI_Sendrecv`` into a scratch buffer and then the reduction do: each receives into ``scratch`` (from
        chunk 0) and adds it to ``data`` once its own send has gone."""
        for me, peer in ((a, b), (b, a)):
            self.ops[me].append(_Pending(SEND, peer, chunk, nchunks, step))
            self.ops[me].append(_Pending(RECV, peer, 0, nchunks, step, "scratch"))
            self.ops[me].append(_Pending(REDUCE, None, chunk, nchunks, step, "data", "scratch", 0))
        self.scratch_chunks = max(self.scratch_chunks, nchunks)

    def copy(self, rank: int, buffer: str, chunk: int, src: str, src_chunk: int, nchunks: int, step: int) -> None:
        """A local ``buffer[chunk..] = src[src_chunk..]`` of ``rank``."""
        self.ops[rank].append(_Pending(COPY, None, chunk, nchunks, step, buffer, src, src_chunk))

    def programs(self, hosts: list[str], lockstep: bool = False) -> tuple[RankProgram, ...]:
        """Each rank's ops sorted by step, with their data-hazard deps.

        ``lockstep``: a rank's ops of one step also wait for all its transfers
        of its previous step, send included, as ``MPI_Sendrecv`` rounds do.
        Data hazards alone let a rank start step s+1 while its step-s send is
        still on the wire; its uplink is then shared, its partner's step-s
        receive slows, and the delay cascades through later steps.
        """
        out = []
        for r, pending in enumerate(self.ops):
            pending = sorted(pending, key=lambda o: o.step)
            deps = derive_dep_indices(pending, _round_barriers(pending) if lockstep else None)
            ops = tuple(Op(id=i, kind=o.kind, peer=o.peer, chunk=o.chunk, nchunks=o.nchunks,
                           bytes=self.layout.range_bytes(o.chunk, o.nchunks), step=o.step, buffer=o.buffer, src=o.src,
                           src_chunk=o.src_chunk, deps=tuple(d))
                        for i, (o, d) in enumerate(zip(pending, deps, strict=True)))
            out.append(RankProgram(r, hosts[r], ops))
        return tuple(out)


def _round_barriers(pending: list[_Pending]) -> list[list[int]]:
    """Per op, the indices of the transfers of the rank's previous step (ops are sorted by step)."""
    extra: list[list[int]] = []
    previous: list[int] = []
    current: list[int] = []
    step = None
    for i, op in enumerate(pending):
        if op.step != step:
            if current:
                previous = current
            current, step = [], op.step
        extra.append(list(previous))
        if op.kind in (SEND, RECV, RECV_REDUCE):
            current.append(i)
    return extra


def ring_reduce_scatter(b: Builder, members: list[int], lo: int, bs: int, step0: int) -> int:
    """Ring reduce-scatter of ``len(members)`` blocks of ``bs`` chunks from chunk ``lo``.

    Afterwards member ``i`` holds block ``(i+1) % m`` fully reduced. Returns the steps used.
    """
    m = len(members)
    for k in range(m - 1):
        for i in range(m):
            blk = (i - k) % m
            b.xfer(members[i], members[(i + 1) % m], lo + blk * bs, bs, step0 + k, reduce=True)
    return m - 1


def ring_all_gather(b: Builder, members: list[int], lo: int, bs: int, step0: int) -> int:
    """Ring all-gather where member ``i`` starts with block ``(i+1) % m``. Returns the steps used."""
    m = len(members)
    for k in range(m - 1):
        for i in range(m):
            blk = (i + 1 - k) % m
            b.xfer(members[i], members[(i + 1) % m], lo + blk * bs, bs, step0 + k, reduce=False)
    return m - 1


def ring_pieces(b: Builder, members: list[int], blocks: list[list[int]], unit: int, step0: int,
                reduce: bool) -> int:
    """A ring reduce-scatter (``reduce``) or all-gather over blocks made of pieces: block ``k`` is the
    ``unit``-chunk pieces starting at the chunks ``blocks[k]``, sent as one message each, in one step.

    Member ``i`` ends the reduce-scatter holding block ``(i+1) % m`` reduced, and starts the all-gather
    holding that block, as :func:`ring_reduce_scatter` and :func:`ring_all_gather`. Returns the steps used.
    """
    m = len(members)
    for k in range(m - 1):
        for i in range(m):
            blk = (i - k) % m if reduce else (i + 1 - k) % m
            for start in blocks[blk]:
                b.xfer(members[i], members[(i + 1) % m], start, unit, step0 + k, reduce=reduce)
    return m - 1


Ranges = list[tuple[int, int]]


def recursive_halving(b: Builder, members: list[int], unit: int, step0: int) -> Ranges:
    """Reduce-scatter by recursive halving among ``len(members)`` (a power of two) ranks on ``n·unit`` chunks.

    Step ``s`` pairs member ``i`` with member ``i xor 2^s``; each hands its
    partner the half of its range that the partner keeps. Returns each
    member's final range in blocks of ``unit`` chunks: member ``i`` keeps
    block ``bitrev(i)`` (:func:`bit_reversed`), fully reduced.
    """
    n = len(members)
    k = n.bit_length() - 1
    rng = [(0, n) for _ in range(n)]  # in blocks of `unit` chunks
    for s in range(k):
        new = []
        for i in range(n):
            lo, hi = rng[i]
            half = (hi - lo) // 2
            keep, give = ((lo, lo + half), (lo + half, hi)) if not i >> s & 1 else ((lo + half, hi), (lo, lo + half))
            b.xfer(members[i], members[i ^ (1 << s)], give[0] * unit, (give[1] - give[0]) * unit, step0 + s, True)
            new.append(keep)
        rng = new
    return rng


def recursive_doubling(b: Builder, members: list[int], unit: int, step0: int, rng: Ranges) -> int:
    """All-gather by recursive doubling: the reverse of :func:`recursive_halving` from its final ranges ``rng``.

    Step ``t`` pairs member ``i`` with member ``i xor 2^(k-1-t)``; each sends
    its whole range and the two ranges merge. Returns the steps used.
    """
    n = len(members)
    k = n.bit_length() - 1
    for t, s in enumerate(reversed(range(k))):
        new = []
        for i in range(n):
            lo, hi = rng[i]
            b.xfer(members[i], members[i ^ (1 << s)], lo * unit, (hi - lo) * unit, step0 + t, False)
            plo, phi = rng[i ^ (1 << s)]
            new.append((min(lo, plo), max(hi, phi)))
        rng = new
    return k


def halving_doubling(b: Builder, members: list[int], unit: int, step0: int) -> int:
    """Rabenseifner among ``len(members)`` (a power of two) ranks on ``len(members)*unit`` chunks from 0."""
    k = len(members).bit_length() - 1
    rng = recursive_halving(b, members, unit, step0)
    return k + recursive_doubling(b, members, unit, step0 + k, rng)


def bit_reversed(i: int, bits: int) -> int:
    """``i`` with its low ``bits`` bits in reverse order."""
    return int(format(i, f"0{bits}b")[::-1], 2) if bits else 0


def _block_order(p: int, root: int = 0) -> list[int]:
    """Members for :func:`recursive_halving` so that rank ``r`` ends with block ``r xor root``.

    Member ``i`` is rank ``bitrev(i) xor root``: member indices differing in
    bit ``s`` are ranks differing in bit ``log2(p)-1-s``.
    """
    k = p.bit_length() - 1
    return [bit_reversed(i, k) ^ root for i in range(p)]


def binomial_scatter(b: Builder, p: int, unit: int, root: int, step0: int) -> int:
    """The root's ``p`` blocks to their ranks down a binomial tree: rank ``r`` gets block ``r xor root``.

    In virtual ranks ``v = r xor root``: step ``s`` has every ``v`` that
    holds blocks ``v..v+2m-1`` (``m = p / 2^(s+1)``) send ``v+m..v+2m-1`` to
    ``v+m``. ``p`` a power of two. Returns the steps used.
    """
    k = p.bit_length() - 1
    for s in range(k):
        m = p >> (s + 1)
        for v in range(0, p, 2 * m):
            b.xfer(v ^ root, (v + m) ^ root, (v + m) * unit, m * unit, step0 + s, reduce=False)
    return k


def binomial_gather(b: Builder, p: int, unit: int, root: int, step0: int) -> int:
    """The reverse of :func:`binomial_scatter`: rank ``r``'s block ``r xor root`` to the root. Returns the steps."""
    k = p.bit_length() - 1
    for t in range(k):
        m = 1 << t
        for v in range(m, p, 2 * m):
            b.xfer(v ^ root, (v - m) ^ root, v * unit, m * unit, step0 + t, reduce=False)
    return k


def binary_tree(p: int) -> tuple[int, list[int]]:
    """An in-order balanced binary tree over ranks ``0..p-1``: ``(root, parent)`` with ``parent[root] = -1``."""
    parent = [-1] * p

    def build(lo: int, hi: int, up: int) -> int:
        if lo >= hi:
            return -1
        mid = (lo + hi) // 2
        parent[mid] = up
        build(lo, mid, mid)
        build(mid + 1, hi, mid)
        return mid

    return build(0, p, -1), parent


def double_binary_tree(p: int) -> list[tuple[int, list[int]]]:
    """The two trees: the in-order tree, and its mirror (``r -> p-1-r``; shifted by one when ``p`` is odd)."""
    root, parent = binary_tree(p)
    f = (lambda r: p - 1 - r) if p % 2 == 0 else (lambda r: (r + 1) % p)
    parent2 = [-1] * p
    for r in range(p):
        parent2[f(r)] = f(parent[r]) if parent[r] >= 0 else -1
    return [(root, parent), (f(root), parent2)]


def _tree_shape(root: int, parent: list[int]) -> tuple[list[int], list[int]]:
    p = len(parent)
    children: list[list[int]] = [[] for _ in range(p)]
    for r, up in enumerate(parent):
        if up >= 0:
            children[up].append(r)
    depth = [0] * p
    order = [root]
    for v in order:
        for c in children[v]:
            depth[c] = depth[v] + 1
            order.append(c)
    height = [0] * p
    for v in reversed(order):
        height[v] = max((height[c] + 1 for c in children[v]), default=0)
    return depth, height


@dataclass(frozen=True)
class _Edge:
    """A tree edge between ranks: ``child`` sits at ``depth`` below its tree's root, ``height`` above its leaves."""

    child: int
    parent: int
    depth: int
    height: int


@dataclass(frozen=True)
class _Tree:
    root: int
    height: int
    edges: list[_Edge]


def rooted_trees(p: int, root: int) -> list[_Tree]:
    """The double binary tree over the ``p-1`` ranks other than ``root`` (rank ``root+1+v`` is tree rank ``v``).

    Per tree: its root rank (which the collective's root feeds, or is fed
    by), its height, ``floor(log2(p-1))`` for both, and its edges.
    """
    q = p - 1

    def rank(v: int) -> int:
        return (root + 1 + v) % p

    out = []
    for troot, parent in double_binary_tree(q):
        depth, height = _tree_shape(troot, parent)
        edges = [_Edge(rank(v), rank(parent[v]), depth[v], height[v]) for v in range(q) if parent[v] >= 0]
        out.append(_Tree(rank(troot), height[troot], edges))
    return out


# ---------------------------------------------------------------------------
# Algorithms
# ---------------------------------------------------------------------------

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


@dataclass(frozen=True)
class Recipe:
    """How :func:`generate` builds one (collective, algorithm).

    ``chunks`` must be a multiple of ``base(p)`` (``why`` says why) and
    defaults to ``default`` or else ``base(p)``; ``lockstep`` runs the steps
    as ``MPI_Sendrecv`` rounds (:meth:`Builder.programs`); ``power_of_two``
    refuses other rank counts.
    """

    build: Callable[[Plan], None]
    base: Callable[[int], int]
    default: int | None = None
    lockstep: bool = False
    power_of_two: bool = False
    why: str = "one block per rank"


def _p(p: int) -> int:
    return p


def _pow2_below(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def _one(p: int) -> int:
    return 1


def _two(p: int) -> int:
    return 2


def _shifted(p: int) -> list[int]:
    """Ring members so that member ``i`` (rank ``i+1``) ends a reduce-scatter with, or starts an all-gather
    from, block ``i+1``: its own."""
    return [(i + 1) % p for i in range(p)]


def _allreduce_ring(pl: Plan) -> None:
    ranks = list(range(pl.p))
    s = ring_reduce_scatter(pl.b, ranks, 0, pl.unit, 0)
    ring_all_gather(pl.b, ranks, 0, pl.unit, s)


def _power_of_two_core(pl: Plan, core: Callable[[list[int], int], int]) -> None:
    """``core(members, first_step)`` (returning its steps) among the largest power of two of ranks; for ``p`` not
    a power of two, with ``x = p - P`` extra ranks, rank ``2i`` (``i < x``) first hands its whole buffer to rank
    ``2i+1`` and gets the result back last (Open MPI's and MPICH's rule)."""
    b, p = pl.b, pl.p
    extra = p - _pow2_below(p)
    if extra == 0:
        core(list(range(p)), 0)
        return
    for i in range(extra):
        b.xfer(2 * i, 2 * i + 1, 0, pl.chunks, 0, reduce=True)
    members = [2 * i + 1 for i in range(extra)] + list(range(2 * extra, p))
    steps = core(members, 1)
    for i in range(extra):
        b.xfer(2 * i + 1, 2 * i, 0, pl.chunks, 1 + steps, reduce=False)


def _allreduce_hd(pl: Plan) -> None:
    _power_of_two_core(pl, lambda members, step0: halving_doubling(pl.b, members, pl.unit, step0))


def _allreduce_rd(pl: Plan) -> None:
    def doubling(members: list[int], step0: int) -> int:
        steps = len(members).bit_length() - 1
        for s in range(steps):
            for i, rank in enumerate(members):
                if i < i ^ (1 << s):
                    pl.b.swap_and_add(rank, members[i ^ (1 << s)], 0, pl.chunks, step0 + s)
        return steps
    _power_of_two_core(pl, doubling)


def _allreduce_dbtree(pl: Plan) -> None:
    b, p = pl.b, pl.p
    per_tree = pl.chunks // 2
    for t, (root, parent) in enumerate(double_binary_tree(p)):
        depth, height = _tree_shape(root, parent)
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


def _reduce_scatter_hier(pl: Plan) -> None:
    groups = hier_groups(pl.topo, pl.hosts)
    inside, across = _hier_blocks(groups, pl.unit)
    steps = 0
    if len(groups[0]) > 1:
        for grp in groups:
            steps = ring_pieces(pl.b, _rotated(grp), inside, pl.unit, 0, reduce=True)
    if len(groups) > 1:
        for j in range(len(groups[0])):
            ring_pieces(pl.b, _rotated([grp[j] for grp in groups]), across[j], pl.unit, steps, reduce=True)


def _allgather_hier(pl: Plan) -> None:
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


def _allreduce_hier(pl: Plan) -> None:
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


def _reduce_scatter_ring(pl: Plan) -> None:
    ring_reduce_scatter(pl.b, _shifted(pl.p), 0, pl.unit, 0)


def _reduce_scatter_hd(pl: Plan) -> None:
    recursive_halving(pl.b, _block_order(pl.p), pl.unit, 0)


def _reduce_scatter_direct(pl: Plan) -> None:
    _pairwise(pl, lambda r, d: (d, d), reduce=True)


def _allgather_ring(pl: Plan) -> None:
    ring_all_gather(pl.b, _shifted(pl.p), 0, pl.unit, 0)


def _allgather_hd(pl: Plan) -> None:
    members = _block_order(pl.p)
    recursive_doubling(pl.b, members, pl.unit, 0, [(r, r + 1) for r in members])


def _allgather_direct(pl: Plan) -> None:
    _pairwise(pl, lambda r, d: (r, r), reduce=False)


def _alltoall_direct(pl: Plan) -> None:
    for r in range(pl.p):
        pl.b.copy(r, "output", r * pl.unit, "data", r * pl.unit, pl.unit, 0)
    _pairwise(pl, lambda r, d: (d, r), reduce=False, to_buffer="output")


def _chain(pl: Plan, chain: list[int], reduce: bool) -> None:
    """Every chunk down ``chain``, pipelined: hop ``j`` carries chunk ``c`` in step ``c + j``."""
    for c in range(pl.chunks):
        for j in range(len(chain) - 1):
            pl.b.xfer(chain[j], chain[j + 1], c, 1, c + j, reduce)


def _broadcast_ring(pl: Plan) -> None:
    _chain(pl, [(pl.root + j) % pl.p for j in range(pl.p)], reduce=False)


def _reduce_ring(pl: Plan) -> None:
    _chain(pl, [(pl.root + 1 + j) % pl.p for j in range(pl.p)], reduce=True)


def _broadcast_dbtree(pl: Plan) -> None:
    half = pl.chunks // 2
    for t, tree in enumerate(rooted_trees(pl.p, pl.root)):
        for c in range(half):
            chunk = t * half + c
            pl.b.xfer(pl.root, tree.root, chunk, 1, c, reduce=False)
            for e in tree.edges:
                pl.b.xfer(e.parent, e.child, chunk, 1, c + e.depth, reduce=False)


def _reduce_dbtree(pl: Plan) -> None:
    half = pl.chunks // 2
    for t, tree in enumerate(rooted_trees(pl.p, pl.root)):
        for c in range(half):
            chunk = t * half + c
            for e in tree.edges:
                pl.b.xfer(e.child, e.parent, chunk, 1, c + e.height, reduce=True)
            pl.b.xfer(tree.root, pl.root, chunk, 1, c + tree.height, reduce=True)


def _broadcast_hd(pl: Plan) -> None:
    steps = binomial_scatter(pl.b, pl.p, pl.unit, pl.root, 0)
    members = _block_order(pl.p, pl.root)
    recursive_doubling(pl.b, members, pl.unit, steps, [(r ^ pl.root, (r ^ pl.root) + 1) for r in members])


def _reduce_hd(pl: Plan) -> None:
    recursive_halving(pl.b, _block_order(pl.p, pl.root), pl.unit, 0)
    binomial_gather(pl.b, pl.p, pl.unit, pl.root, pl.p.bit_length() - 1)


#: Every (collective, algorithm) :func:`generate` builds; :func:`algorithms` lists them in this order.
RECIPES: dict[tuple[str, str], Recipe] = {
    (ALLREDUCE, "ring"): Recipe(_allreduce_ring, _p),
    (ALLREDUCE, "hd"): Recipe(_allreduce_hd, _pow2_below, lockstep=True,
                              why="one block per rank of the largest power of two <= p"),
    (ALLREDUCE, "hdrm"): Recipe(_allreduce_hd, _p, lockstep=True),
    (ALLREDUCE, "dbtree"): Recipe(_allreduce_dbtree, _two, DBTREE_DEFAULT_CHUNKS, why="half per tree"),
    (ALLREDUCE, "hier"): Recipe(_allreduce_hier, _p),
    (ALLREDUCE, "rd"): Recipe(_allreduce_rd, _one, lockstep=True),
    **{(REDUCE_SCATTER, a): r for a, r in (
        ("ring", Recipe(_reduce_scatter_ring, _p)),
        ("hd", Recipe(_reduce_scatter_hd, _p, lockstep=True, power_of_two=True)),
        ("hdrm", Recipe(_reduce_scatter_hd, _p, lockstep=True, power_of_two=True)),
        ("direct", Recipe(_reduce_scatter_direct, _p, lockstep=True)),
        ("hier", Recipe(_reduce_scatter_hier, _p)))},
    **{(ALLGATHER, a): r for a, r in (
        ("ring", Recipe(_allgather_ring, _p)),
        ("hd", Recipe(_allgather_hd, _p, lockstep=True, power_of_two=True)),
        ("hdrm", Recipe(_allgather_hd, _p, lockstep=True, power_of_two=True)),
        ("direct", Recipe(_allgather_direct, _p, lockstep=True)),
        ("hier", Recipe(_allgather_hier, _p)))},
    (ALLTOALL, "direct"): Recipe(_alltoall_direct, _p, lockstep=True),
    **{(BROADCAST, a): r for a, r in (
        ("ring", Recipe(_broadcast_ring, _one, PIPELINE_DEFAULT_CHUNKS, why="pipeline pieces")),
        ("dbtree", Recipe(_broadcast_dbtree, _two, PIPELINE_DEFAULT_CHUNKS, why="half per tree")),
        ("hd", Recipe(_broadcast_hd, _p, lockstep=True, power_of_two=True)),
        ("hdrm", Recipe(_broadcast_hd, _p, lockstep=True, power_of_two=True)))},
    **{(REDUCE_TO_ROOT, a): r for a, r in (
        ("ring", Recipe(_reduce_ring, _one, PIPELINE_DEFAULT_CHUNKS, why="pipeline pieces")),
        ("dbtree", Recipe(_reduce_dbtree, _two, PIPELINE_DEFAULT_CHUNKS, why="half per tree")),
        ("hd", Recipe(_reduce_hd, _p, lockstep=True, power_of_two=True)),
        ("hdrm", Recipe(_reduce_hd, _p, lockstep=True, power_of_two=True)))},
}
#: The collectives :func:`generate` builds (p2p traffic has no generator).
GENERATED = tuple(dict.fromkeys(c for c, _ in RECIPES))
#: Why an algorithm a reader might expect is refused.
_UNDEFINED = {(ALLTOALL, "hd"): "halving-doubling has no alltoall", (ALLTOALL, "hdrm"): "halving-doubling has no "
              "alltoall", (ALLTOALL, "ring"): "no store-and-forward ring alltoall is implemented"}


def algorithms(collective: str = ALLREDUCE) -> tuple[str, ...]:
    """The algorithms :func:`generate` has for ``collective`` (none for a collective it does not build)."""
    return tuple(a for c, a in RECIPES if c == collective)


def recipe(collective: str, algo: str) -> Recipe:
    """The recipe of ``(collective, algo)``; :class:`FieldError` naming ``collective`` or ``algo`` if there is none."""
    if collective not in GENERATED:
        raise FieldError(WHERE, "collective", f"one of {', '.join(GENERATED)} (p2p traffic has no generator)",
                         collective)
    if (collective, algo) not in RECIPES:
        note = _UNDEFINED.get((collective, algo))
        raise FieldError(WHERE, "algo", f"one of {', '.join(algorithms(collective))} for {collective}"
                         + (f" ({note})" if note else ""), algo)
    return RECIPES[(collective, algo)]


def generate(algo: str, topo: Topology, size: int, placement: str | None = None, seed: int = 0,
             chunks: int | None = None, *, collective: str = ALLREDUCE, root: int = 0) -> Schedule:
    """A schedule of ``collective`` by ``algo`` over every host of ``topo``, on ``size`` bytes per rank.

    ``size`` is each rank's ``data`` buffer (nccl-tests' size of the
    collective). ``placement`` defaults to ``hdrm`` for ``hdrm`` and
    ``identity`` otherwise; ``chunks`` defaults to the algorithm's own count
    (``p`` for blocks of one chunk, the largest power of two <= ``p`` for
    allreduce ``hd``, 8 for ``dbtree`` and pipelined ``ring`` broadcast and
    reduce) and must be a multiple of the algorithm's base count (even, for
    dbtree). ``root`` is broadcast's and reduce's root rank. Raises
    :class:`FieldError` for anything unsupported: ``collective``, ``algo``
    (not one of :func:`algorithms`, or needing a power-of-two number of
    ranks), ``root``, ``placement``, ``chunks``, ``size``, ``topology``.
    """
    how = recipe(collective, algo)
    p = len(topo.hosts)
    if p < 2:
        raise FieldError(WHERE, "topology", "a topology with at least 2 hosts", topo.spec)
    _check_root(collective, root, p)
    if how.power_of_two and not is_power_of_two(p):
        others = [a for a in algorithms(collective) if not RECIPES[(collective, a)].power_of_two]
        raise FieldError(WHERE, "algo", f"one of {', '.join(others)} for {collective} over {p} ranks ({algo} pairs "
                         "rank r with rank r xor 2^s in step s: it needs a power-of-two number of ranks)", algo)
    placement, hosts = _place(algo, topo, placement, seed)
    base = how.base(p)
    if chunks is None:
        chunks = how.default or base
    elif chunks < base or chunks % base:
        raise FieldError(WHERE, "chunks", f"a multiple of {base} for {algo} on {p} ranks ({how.why})", chunks)
    shape = Shape(collective, p, chunks, chunks if collective == ALLTOALL else 0, root)
    b = Builder(p, chunk_layout(size, chunks, shape.block, WHERE))
    how.build(Plan(b, p, chunks, chunks // base, root, topo, hosts))
    meta = {"generator": algo, "seed": seed} if placement == "random" else {"generator": algo}
    # Halving-doubling and pairwise exchanges run in MPI_Sendrecv rounds; ring, hier and dbtree pipeline
    # (their data dependencies already chain the steps, and a round barrier
    # would add a delivery wait to each of ring's 2(p-1) small steps).
    programs = b.programs(hosts, lockstep=how.lockstep)
    return Schedule(algorithm=algo, size=size, chunks=chunks, ranks=programs, topology=topo.spec,
                    placement=placement, meta=meta, collective=collective, scratch_chunks=b.scratch_chunks,
                    output_chunks=chunks if collective == ALLTOALL else 0, root=root)


def _check_root(collective: str, root: int, p: int) -> None:
    if collective in ROOTED:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < p:
            raise FieldError(WHERE, "root", f"a rank 0..{p - 1} for {collective}", root)
    elif root:
        raise FieldError(WHERE, "root", f"nothing for {collective} (only {' and '.join(ROOTED)} have a root)", root)


def _place(algo: str, topo: Topology, placement: str | None, seed: int) -> tuple[str, list[str]]:
    """The placement (its default for ``algo`` when None) and the hosts of ranks ``0..p-1``."""
    if placement is None:
        placement = "hdrm" if algo == "hdrm" else "identity"
    if algo == "hdrm" and placement != "hdrm":
        raise FieldError(WHERE, "placement", "hdrm for --algo hdrm (use --algo hd for other placements)", placement)
    return placement, placement_hosts(topo, placement, seed)


def pair_exchange(a: str, b: str, size: int) -> Schedule:
    """A 2-rank halving-doubling exchange between hosts ``a`` and ``b``: two lockstep rounds of ``size // 2`` bytes.

    The probe of a network and the latency calibration replay it between two
    chosen hosts of a bigger topology (placement ``probe``, no topology named).
    """
    base = generate("hd", build_topology("star:hosts=2"), size)
    ranks = tuple(RankProgram(r.rank, host, r.ops) for r, host in zip(base.ranks, (a, b), strict=True))
    return replace(base, ranks=ranks, topology=None, placement="probe")
