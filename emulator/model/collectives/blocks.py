"""The building blocks of generated schedules: the builder that turns transfers into each rank's program, and
the rings, halvings and doublings, binomial trees and double binary trees the algorithms are made of.

All operations are filled in with their ``step``; ``deps`` come from
:func:`emulator.model.schedule.deps.derive_dep_indices`: the data hazards,
plus for lockstep algorithms the previous round's transfers
(:meth:`Builder.programs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.model.schedule.deps import derive_dep_indices
from emulator.model.schedule.format import COPY, RECV, RECV_REDUCE, REDUCE, SEND, ChunkLayout, Op, RankProgram


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
    lane: int = 0

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
             to_chunk: int | None = None, to_buffer: str = "data", lane: int = 0) -> None:
        """``src`` sends ``nchunks`` chunks of ``data`` from ``chunk`` to ``dst``, which adds them in (or overwrites).

        The receiver's range starts at ``to_chunk`` of ``to_buffer`` (default:
        the same chunk of ``data``); ``lane`` is the connection between the two
        it goes over (an NCCL channel's own).
        """
        self.ops[src].append(_Pending(SEND, dst, chunk, nchunks, step, lane=lane))
        self.ops[dst].append(_Pending(RECV_REDUCE if reduce else RECV, src, chunk if to_chunk is None else to_chunk,
                                      nchunks, step, to_buffer, lane=lane))

    def swap_and_add(self, a: int, b: int, chunk: int, nchunks: int, step: int) -> None:
        """``a`` and ``b`` send each other the same range of ``data`` and each adds the other's in, as
        ``MPI_Sendrecv`` into a scratch buffer and then the reduction do: each receives into ``scratch`` (from
        chunk 0) and adds it to ``data`` once its own send has gone."""
        for me, peer in ((a, b), (b, a)):
            self.ops[me].append(_Pending(SEND, peer, chunk, nchunks, step))
            self.ops[me].append(_Pending(RECV, peer, 0, nchunks, step, "scratch"))
            self.ops[me].append(_Pending(REDUCE, None, chunk, nchunks, step, "data", "scratch", 0))
        self.scratch_chunks = max(self.scratch_chunks, nchunks)

    def xfer_through_scratch(self, src: int, dst: int, chunk: int, nchunks: int, step: int, reduce: bool,
                             scratch_chunk: int, *, lane: int = 0) -> None:
        """``src`` sends ``nchunks`` chunks of ``data`` from ``chunk`` to ``dst``, which receives them into
        ``scratch`` from ``scratch_chunk``, then adds them into its ``data`` (or copies them there): a receive
        that waits for nothing else that touches the range, as NCCL's receive buffers do not (several children
        into one parent, a result into a range the rank sent before)."""
        self.ops[src].append(_Pending(SEND, dst, chunk, nchunks, step, lane=lane))
        self.ops[dst].append(_Pending(RECV, src, scratch_chunk, nchunks, step, "scratch", lane=lane))
        self.ops[dst].append(_Pending(REDUCE if reduce else COPY, None, chunk, nchunks, step, "data", "scratch",
                                      scratch_chunk))
        self.scratch_chunks = max(self.scratch_chunks, scratch_chunk + nchunks)

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
                           src_chunk=o.src_chunk, deps=tuple(d), lane=o.lane)
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


def ring_reduce_scatter(b: Builder, members: list[int], lo: int, bs: int, step0: int, lane: int = 0) -> int:
    """Ring reduce-scatter of ``len(members)`` blocks of ``bs`` chunks from chunk ``lo``, on ``lane``.

    Afterwards member ``i`` holds block ``(i+1) % m`` fully reduced. Returns the steps used.
    """
    m = len(members)
    for k in range(m - 1):
        for i in range(m):
            blk = (i - k) % m
            b.xfer(members[i], members[(i + 1) % m], lo + blk * bs, bs, step0 + k, reduce=True, lane=lane)
    return m - 1


def ring_all_gather(b: Builder, members: list[int], lo: int, bs: int, step0: int, lane: int = 0) -> int:
    """Ring all-gather on ``lane`` where member ``i`` starts with block ``(i+1) % m``. Returns the steps used."""
    m = len(members)
    for k in range(m - 1):
        for i in range(m):
            blk = (i + 1 - k) % m
            b.xfer(members[i], members[(i + 1) % m], lo + blk * bs, bs, step0 + k, reduce=False, lane=lane)
    return m - 1


def ring_pieces(b: Builder, members: list[int], blocks: list[list[int]], unit: int, step0: int,
                reduce: bool, lane: int = 0) -> int:
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
                b.xfer(members[i], members[(i + 1) % m], start, unit, step0 + k, reduce=reduce, lane=lane)
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


def block_order(p: int, root: int = 0) -> list[int]:
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


def tree_shape(root: int, parent: list[int]) -> tuple[list[int], list[int]]:
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
        depth, height = tree_shape(troot, parent)
        edges = [_Edge(rank(v), rank(parent[v]), depth[v], height[v]) for v in range(q) if parent[v] >= 0]
        out.append(_Tree(rank(troot), height[troot], edges))
    return out
