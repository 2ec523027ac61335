"""Allreduce schedule generators and rank placements.

Algorithms (``ALGORITHMS``), for ``p`` ranks, one per host of the topology:

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
    :func:`emulator.schedule.cost.analyze`). With ``N = 1`` the ``A``
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

Placements: ``identity`` (rank ``r`` on host ``h(r+1)``; with servers
accelerators are numbered server by server), ``random`` (a seeded
permutation), ``hdrm`` (BiGraph without servers; any fabric with servers, see
``hdrm`` above).

All operations are filled in with their ``step``; ``deps`` come from
:func:`emulator.schedule.deps.derive_dep_indices`: the data hazards, plus for
``hd`` and ``hdrm`` the previous round's transfers (lockstep, see
:meth:`Builder.programs`). Every generator is proved by the symbolic executor
in the tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from emulator.errors import FieldError
from emulator.schedule.deps import derive_dep_indices
from emulator.schedule.format import (
    RECV,
    RECV_REDUCE,
    SEND,
    Op,
    RankProgram,
    Schedule,
    check_chunking,
    is_power_of_two,
)
from emulator.topology import Topology, hdrm_problem, hdrm_slot_order
from emulator.topology import build as build_topology

ALGORITHMS = ("ring", "hd", "hdrm", "dbtree", "hier")
PLACEMENTS = ("identity", "random", "hdrm")
DBTREE_DEFAULT_CHUNKS = 8

WHERE = "schedule gen"


# ---------------------------------------------------------------------------
# Placements
# ---------------------------------------------------------------------------

def hdrm_placement(topo: Topology) -> list[str]:
    """Hosts for ranks ``0..p-1`` so that halving-doubling is contention-free.

    Without servers: a BiGraph with ``U = L``, ``M <= U`` hosts per switch
    and ``p = 2·U·M`` a power of two; rank ``r`` runs on the host of slot
    :func:`emulator.topology.hdrm_slot_order` ``[r]`` (the construction and
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
    raise FieldError(WHERE, "placement", f"one of {', '.join(PLACEMENTS)}", placement)


# ---------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------

@dataclass
class _Pending:
    kind: str
    peer: int
    chunk: int
    nchunks: int
    step: int
    buffer: str = "data"
    src: str | None = None
    src_chunk: int | None = None


class Builder:
    """Collects transfers; :meth:`programs` sorts each rank's ops by step and derives deps."""

    def __init__(self, p: int, chunk_bytes: int):
        self.p = p
        self.chunk_bytes = chunk_bytes
        self.ops: list[list[_Pending]] = [[] for _ in range(p)]

    def xfer(self, src: int, dst: int, chunk: int, nchunks: int, step: int, reduce: bool) -> None:
        """``src`` sends ``nchunks`` chunks from ``chunk`` to ``dst``, which adds them in (or overwrites)."""
        self.ops[src].append(_Pending(SEND, dst, chunk, nchunks, step))
        self.ops[dst].append(_Pending(RECV_REDUCE if reduce else RECV, src, chunk, nchunks, step))

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
                           bytes=o.nchunks * self.chunk_bytes, step=o.step, deps=tuple(d))
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


def halving_doubling(b: Builder, members: list[int], unit: int, step0: int) -> int:
    """Rabenseifner among ``len(members)`` (a power of two) ranks on ``len(members)*unit`` chunks from 0."""
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
    for t, s in enumerate(reversed(range(k))):
        new = []
        for i in range(n):
            lo, hi = rng[i]
            b.xfer(members[i], members[i ^ (1 << s)], lo * unit, (hi - lo) * unit, step0 + k + t, False)
            plo, phi = rng[i ^ (1 << s)]
            new.append((min(lo, plo), max(hi, phi)))
        rng = new
    return 2 * k


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


# ---------------------------------------------------------------------------
# Algorithms
# ---------------------------------------------------------------------------

def _base_chunks(algo: str, p: int) -> int:
    if algo in ("ring", "hier", "hdrm"):
        return p
    if algo == "hd":
        return 1 << (p.bit_length() - 1)
    return DBTREE_DEFAULT_CHUNKS


def generate(algo: str, topo: Topology, size: int, placement: str | None = None, seed: int = 0,
             chunks: int | None = None) -> Schedule:
    """An allreduce schedule of ``algo`` over every host of ``topo``, on ``size`` bytes per rank.

    ``placement`` defaults to ``hdrm`` for ``hdrm`` and ``identity`` otherwise;
    ``chunks`` defaults to the algorithm's natural count (``p`` for ring, hdrm
    and hier, the largest power of two <= ``p`` for hd, 8 for dbtree) and must
    be a multiple of it (even, for dbtree). Raises :class:`FieldError` for
    anything unsupported.
    """
    if algo not in ALGORITHMS:
        raise FieldError(WHERE, "algo", f"one of {', '.join(ALGORITHMS)}", algo)
    p = len(topo.hosts)
    if p < 2:
        raise FieldError(WHERE, "topology", "a topology with at least 2 hosts", topo.spec)
    if placement is None:
        placement = "hdrm" if algo == "hdrm" else "identity"
    if algo == "hdrm" and placement != "hdrm":
        raise FieldError(WHERE, "placement", "hdrm for --algo hdrm (use --algo hd for other placements)", placement)
    hosts = placement_hosts(topo, placement, seed)
    base = _base_chunks(algo, p)
    if chunks is None:
        chunks = base
    if algo == "dbtree":
        if chunks < 2 or chunks % 2:
            raise FieldError(WHERE, "chunks", "an even number >= 2 for dbtree (half per tree)", chunks)
    elif chunks < base or chunks % base:
        raise FieldError(WHERE, "chunks", f"a multiple of {base} for {algo} on {p} ranks", chunks)
    chunk_bytes = check_chunking(size, chunks, WHERE)
    unit = chunks // base
    b = Builder(p, chunk_bytes)
    ranks = list(range(p))
    if algo == "ring":
        s = ring_reduce_scatter(b, ranks, 0, unit, 0)
        ring_all_gather(b, ranks, 0, unit, s)
    elif algo in ("hd", "hdrm"):
        _hd(b, p, unit, chunks)
    elif algo == "dbtree":
        _dbtree(b, p, chunks)
    else:
        _hier(b, topo, hosts, unit)
    meta = {"generator": algo, "seed": seed} if placement == "random" else {"generator": algo}
    # Halving-doubling runs in MPI_Sendrecv rounds; ring, hier and dbtree pipeline
    # (their data dependencies already chain the steps, and a round barrier
    # would add a delivery wait to each of ring's 2(p-1) small steps).
    programs = b.programs(hosts, lockstep=algo in ("hd", "hdrm"))
    return Schedule(algorithm=algo, size=size, chunks=chunks, ranks=programs, topology=topo.spec,
                    placement=placement, meta=meta)


def pair_exchange(a: str, b: str, size: int) -> Schedule:
    """A 2-rank halving-doubling exchange between hosts ``a`` and ``b``: two lockstep rounds of ``size // 2`` bytes.

    The probe of a network and the latency calibration replay it between two
    chosen hosts of a bigger topology (placement ``probe``, no topology named).
    """
    base = generate("hd", build_topology("star:hosts=2"), size)
    ranks = tuple(RankProgram(r.rank, host, r.ops) for r, host in zip(base.ranks, (a, b), strict=True))
    return replace(base, ranks=ranks, topology=None, placement="probe")


def _hd(b: Builder, p: int, unit: int, chunks: int) -> None:
    big = 1 << (p.bit_length() - 1)
    extra = p - big
    if extra == 0:
        halving_doubling(b, list(range(p)), unit, 0)
        return
    for i in range(extra):
        b.xfer(2 * i, 2 * i + 1, 0, chunks, 0, reduce=True)
    members = [2 * i + 1 for i in range(extra)] + list(range(2 * extra, p))
    steps = halving_doubling(b, members, unit, 1)
    for i in range(extra):
        b.xfer(2 * i + 1, 2 * i, 0, chunks, 1 + steps, reduce=False)


def _dbtree(b: Builder, p: int, chunks: int) -> None:
    per_tree = chunks // 2
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


def _hier(b: Builder, topo: Topology, hosts: list[str], unit: int) -> None:
    servers: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        servers.setdefault(topo.host(h).switch, []).append(r)
    groups = [servers[s.name] for s in topo.switches if s.name in servers]
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise FieldError(WHERE, "topology", "the same number of hosts on every host-bearing switch for hier",
                         topo.spec)
    g, n_servers = sizes.pop(), len(groups)
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
