"""Generating one collective's schedule: :func:`generate` builds a schedule of one collective
(:mod:`emulator.model.schedule.semantics`) by one of its registered algorithms
(:mod:`emulator.model.collectives.registry`) over every host of a topology, one rank per host;
:func:`pair_exchange` is the two-host exchange the network probe and the calibration replay.
"""

from __future__ import annotations

from dataclasses import replace

from emulator.base.errors import FieldError
from emulator.model.collectives.algorithms import Plan
from emulator.model.collectives.blocks import Builder
from emulator.model.collectives.placements import WHERE, placement_hosts
from emulator.model.collectives.registry import REGISTRY, Algorithm, algorithm, algorithms
from emulator.model.schedule.format import RankProgram, Schedule, chunk_layout, is_power_of_two
from emulator.model.schedule.semantics import ALLREDUCE, ALLTOALL, ROOTED, Shape
from emulator.model.topology import Topology
from emulator.model.topology import build as build_topology


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
    how = algorithm(collective, algo)
    p = len(topo.hosts)
    if p < 2:
        raise FieldError(WHERE, "topology", "a topology with at least 2 hosts", topo.spec)
    _check_root(collective, root, p)
    if how.power_of_two and not is_power_of_two(p):
        others = [a for a in algorithms(collective) if not REGISTRY[(collective, a)].power_of_two]
        raise FieldError(WHERE, "algo", f"one of {', '.join(others)} for {collective} over {p} ranks ({algo} pairs "
                         "rank r with rank r xor 2^s in step s: it needs a power-of-two number of ranks)", algo)
    placement, hosts = _place(how, topo, placement, seed)
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


def _place(how: Algorithm, topo: Topology, placement: str | None, seed: int) -> tuple[str, list[str]]:
    """The placement (the algorithm's own when None) and the hosts of ranks ``0..p-1``."""
    if placement is None:
        placement = how.default_placement
    if how.placement is not None and placement != how.placement:
        raise FieldError(WHERE, "placement", f"{how.placement} for --algo {how.name} (use --algo {how.variant_of} "
                         "for other placements)", placement)
    return placement, placement_hosts(topo, placement, seed)


def pair_exchange(a: str, b: str, size: int) -> Schedule:
    """A 2-rank halving-doubling exchange between hosts ``a`` and ``b``: two lockstep rounds of ``size // 2`` bytes.

    The probe of a network and the latency calibration replay it between two
    chosen hosts of a bigger topology (placement ``probe``, no topology named).
    """
    base = generate("hd", build_topology("star:hosts=2"), size)
    ranks = tuple(RankProgram(r.rank, host, r.ops) for r, host in zip(base.ranks, (a, b), strict=True))
    return replace(base, ranks=ranks, topology=None, placement="probe")
