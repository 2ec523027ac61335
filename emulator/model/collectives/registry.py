"""The collective algorithms: one registration per (collective, algorithm), and the one place to add one.

An :class:`Algorithm` says once what every other module needs to know of it:
its generator (:mod:`emulator.model.collectives.algorithms`) and how it cuts
the buffer into chunks, whether its steps run in lockstep rounds, whether it
needs a power-of-two rank count, the rank placement it is defined on (hdrm's
is its own), what it runs as inside a process group, and its closed-form cost
(:mod:`emulator.model.collectives.formulas`). What a *collective* means (its
inputs and results, its bus bandwidth, its short name) is
:mod:`emulator.model.schedule.semantics`'.

Everything else asks the registry: :func:`~emulator.model.collectives.generators.generate`,
the experiment files, the language-model generator and the Chakra importer
(which algorithm runs inside a group), the projection (which algorithms it
models), the report (an algorithm's own placement), the tests of the cost
models (:func:`collective_formula`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from emulator.base.errors import FieldError
from emulator.model.collectives import algorithms as alg
from emulator.model.collectives import formulas
from emulator.model.collectives import nccl_rings as nccl
from emulator.model.collectives.algorithms import Plan
from emulator.model.collectives.formulas import ClosedForm, Terms
from emulator.model.collectives.placements import WHERE
from emulator.model.schedule.semantics import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE_SCATTER,
    REDUCE_TO_ROOT,
)
from emulator.model.topology import Topology

DBTREE_DEFAULT_CHUNKS = 8
#: Pieces a pipelined broadcast or reduce (``ring``, ``dbtree``) cuts the buffer into by default.
PIPELINE_DEFAULT_CHUNKS = 8
#: ``nccl``'s chunks: ``p * C`` for ``C`` channels (:mod:`emulator.model.collectives.nccl_rings`).
NCCL_WHY = "one block per rank and channel: p times the channels"


def nccl_pieces(p: int) -> int:
    """``nccl-tree``'s chunks: a multiple of its pieces per channel, whatever the ranks."""
    return nccl.TREE_PIECES


def nvls_pieces(p: int) -> int:
    """``nccl-nvls``'s chunks: a multiple of its pieces per channel, whatever the ranks."""
    return nccl.NVLS_PIECES


#: The placement of an algorithm that is defined on none: rank ``r`` on the ``r``-th host.
IDENTITY = "identity"


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of one collective: how :func:`~emulator.model.collectives.generators.generate` builds it,
    where its ranks go, what it runs as inside a process group, and its closed-form cost.

    ``chunks`` must be a multiple of ``base(p)`` (``why`` says why) and
    defaults to ``default`` or else ``base(p)``; ``lockstep`` runs the steps
    as ``MPI_Sendrecv`` rounds (:meth:`~emulator.model.collectives.blocks.Builder.programs`);
    ``power_of_two`` refuses other rank counts. ``placement`` is the rank
    placement the algorithm is defined on (None: any, :data:`IDENTITY` by
    default); ``variant_of`` the algorithm it is on that placement (hdrm:
    hd). ``topology_groups``: its groups are the topology's servers or
    switches, so it cannot run inside a process group. ``closed_form``:
    :mod:`~emulator.model.collectives.formulas`' (None: it has none).
    """

    collective: str
    name: str
    build: Callable[[Plan], None]
    base: Callable[[int], int]
    default: int | None = None
    lockstep: bool = False
    power_of_two: bool = False
    why: str = "one block per rank"
    placement: str | None = None
    variant_of: str | None = None
    topology_groups: bool = False
    closed_form: ClosedForm | None = None

    @property
    def default_placement(self) -> str:
        """The placement its ranks take when none is given."""
        return self.placement or IDENTITY

    @property
    def in_groups(self) -> str | None:
        """The algorithm it runs as inside a process group (None: it cannot): itself, or for a placement of the
        whole job's ranks (hdrm) the algorithm it is a variant of."""
        if self.topology_groups:
            return None
        return self.variant_of or self.name


def _hd_family(collective: str, build: Callable[[Plan], None], closed_form: ClosedForm) -> list[Algorithm]:
    """``hd`` and ``hdrm`` (hd on HDRM's placement) of a collective: lockstep, a power of two of ranks."""
    return [Algorithm(collective, "hd", build, alg.per_rank, lockstep=True, power_of_two=True,
                      closed_form=closed_form),
            Algorithm(collective, "hdrm", build, alg.per_rank, lockstep=True, power_of_two=True, placement="hdrm",
                      variant_of="hd", closed_form=closed_form)]


_ALL: list[Algorithm] = [
    Algorithm(ALLREDUCE, "ring", alg.allreduce_ring, alg.per_rank, closed_form=formulas.allreduce_ring),
    Algorithm(ALLREDUCE, "hd", alg.allreduce_hd, alg.pow2_below, lockstep=True,
              why="one block per rank of the largest power of two <= p",
              closed_form=formulas.allreduce_halving_doubling),
    Algorithm(ALLREDUCE, "hdrm", alg.allreduce_hd, alg.per_rank, lockstep=True, placement="hdrm", variant_of="hd",
              closed_form=formulas.allreduce_halving_doubling),
    Algorithm(ALLREDUCE, "dbtree", alg.allreduce_dbtree, alg.two, DBTREE_DEFAULT_CHUNKS, why="half per tree"),
    Algorithm(ALLREDUCE, "hier", alg.allreduce_hier, alg.per_rank, topology_groups=True),
    Algorithm(ALLREDUCE, "nccl", nccl.allreduce_nccl, alg.per_rank, why=NCCL_WHY, closed_form=formulas.allreduce_ring),
    Algorithm(ALLREDUCE, "nccl-nvls", nccl.allreduce_nccl_nvls, nvls_pieces, 2 * nccl.NVLS_PIECES,
              why=f"{nccl.NVLS_PIECES} pieces per channel"),
    Algorithm(ALLREDUCE, "nccl-tree", nccl.allreduce_nccl_tree, nccl_pieces, 2 * nccl.TREE_PIECES,
              why=f"{nccl.TREE_PIECES} pieces per channel"),
    Algorithm(ALLREDUCE, "rd", alg.allreduce_rd, alg.one, lockstep=True,
              closed_form=formulas.allreduce_recursive_doubling),
    Algorithm(REDUCE_SCATTER, "ring", alg.reduce_scatter_ring, alg.per_rank, closed_form=formulas.ring_blocks),
    *_hd_family(REDUCE_SCATTER, alg.reduce_scatter_hd, formulas.halving_doubling_blocks),
    Algorithm(REDUCE_SCATTER, "direct", alg.reduce_scatter_direct, alg.per_rank, lockstep=True,
              closed_form=formulas.direct_blocks),
    Algorithm(REDUCE_SCATTER, "hier", alg.reduce_scatter_hier, alg.per_rank, topology_groups=True,
              closed_form=formulas.hier_blocks),
    Algorithm(REDUCE_SCATTER, "nccl", nccl.reduce_scatter_nccl, alg.per_rank, why=NCCL_WHY,
              closed_form=formulas.ring_blocks),
    Algorithm(ALLGATHER, "ring", alg.allgather_ring, alg.per_rank, closed_form=formulas.ring_blocks),
    *_hd_family(ALLGATHER, alg.allgather_hd, formulas.halving_doubling_blocks),
    Algorithm(ALLGATHER, "direct", alg.allgather_direct, alg.per_rank, lockstep=True,
              closed_form=formulas.direct_blocks),
    Algorithm(ALLGATHER, "hier", alg.allgather_hier, alg.per_rank, topology_groups=True,
              closed_form=formulas.hier_blocks),
    Algorithm(ALLGATHER, "nccl", nccl.allgather_nccl, alg.per_rank, why=NCCL_WHY, closed_form=formulas.ring_blocks),
    Algorithm(ALLTOALL, "direct", alg.alltoall_direct, alg.per_rank, lockstep=True,
              closed_form=formulas.direct_blocks),
    Algorithm(BROADCAST, "ring", alg.broadcast_ring, alg.one, PIPELINE_DEFAULT_CHUNKS, why="pipeline pieces",
              closed_form=formulas.rooted_chain),
    Algorithm(BROADCAST, "dbtree", alg.broadcast_dbtree, alg.two, PIPELINE_DEFAULT_CHUNKS, why="half per tree",
              closed_form=formulas.rooted_double_tree),
    *_hd_family(BROADCAST, alg.broadcast_hd, formulas.rooted_halving_doubling),
    Algorithm(REDUCE_TO_ROOT, "ring", alg.reduce_ring, alg.one, PIPELINE_DEFAULT_CHUNKS, why="pipeline pieces",
              closed_form=formulas.rooted_chain),
    Algorithm(REDUCE_TO_ROOT, "dbtree", alg.reduce_dbtree, alg.two, PIPELINE_DEFAULT_CHUNKS, why="half per tree",
              closed_form=formulas.rooted_double_tree),
    *_hd_family(REDUCE_TO_ROOT, alg.reduce_hd, formulas.rooted_halving_doubling),
]
#: Every (collective, algorithm) :func:`~emulator.model.collectives.generators.generate` builds; :func:`algorithms`
#: lists them in this order.
REGISTRY: dict[tuple[str, str], Algorithm] = {(a.collective, a.name): a for a in _ALL}
#: The collectives the generators build (p2p traffic has no generator).
GENERATED = tuple(dict.fromkeys(c for c, _ in REGISTRY))
#: Why an algorithm a reader might expect is refused.
_UNDEFINED = {(ALLTOALL, "hd"): "halving-doubling has no alltoall", (ALLTOALL, "hdrm"): "halving-doubling has no "
              "alltoall", (ALLTOALL, "ring"): "no store-and-forward ring alltoall is implemented"}


def algorithms(collective: str = ALLREDUCE) -> tuple[str, ...]:
    """The algorithms the generators have for ``collective`` (none for a collective they do not build)."""
    return tuple(a for c, a in REGISTRY if c == collective)


def algorithm(collective: str, name: str) -> Algorithm:
    """The registration of ``(collective, name)``; :class:`FieldError` naming ``collective`` or ``algo`` if there is
    none."""
    if collective not in GENERATED:
        raise FieldError(WHERE, "collective", f"one of {', '.join(GENERATED)} (p2p traffic has no generator)",
                         collective)
    if (collective, name) not in REGISTRY:
        note = _UNDEFINED.get((collective, name))
        raise FieldError(WHERE, "algo", f"one of {', '.join(algorithms(collective))} for {collective}"
                         + (f" ({note})" if note else ""), name)
    return REGISTRY[(collective, name)]


def in_group_algorithms(collective: str) -> tuple[str, ...]:
    """The algorithms of ``collective`` that run inside a process group (not those whose groups are the
    topology's)."""
    return tuple(a for a in algorithms(collective) if REGISTRY[(collective, a)].in_groups is not None)


def fallback(collective: str) -> str:
    """The algorithm a collective falls back to where the one asked for cannot run: the first registered that
    needs no power of two of ranks and runs inside a group."""
    return next(a for a in in_group_algorithms(collective) if not REGISTRY[(collective, a)].power_of_two)


def own_placement(collective: str, name: str) -> str:
    """The placement ``(collective, name)`` takes when none is given; :data:`IDENTITY` for one not registered."""
    known = REGISTRY.get((collective, name))
    return known.default_placement if known is not None else IDENTITY


def required_placement(collective: str, name: str) -> str | None:
    """The placement ``(collective, name)`` is defined on, which it always takes (hdrm's); None for any other."""
    known = REGISTRY.get((collective, name))
    return known.placement if known is not None else None


#: A topology where ``hier``'s groups are real: servers of several accelerators (what hier is for) or, without
#: servers, several hosts on each of several switches.
GROUPS_SPEC = "leafspine:leaves=2,spines=1,hosts_per_leaf=2,servers=2,accels_per_server=2,nics_per_server=2"


def check_topology_groups(collective: str, name: str, topo: Topology, where: str, field: str) -> None:
    """Refuse (:class:`FieldError` naming ``field``) an algorithm whose groups are the topology's servers or
    switches (``hier``) on a topology where they are one group of every host, or groups of one host each:
    there it would run a plain ring while its name says otherwise."""
    known = REGISTRY.get((collective, name))
    if known is None or not known.topology_groups:
        return
    per_switch = Counter(h.switch for h in topo.hosts)
    if len(per_switch) >= 2 and min(per_switch.values()) >= 2:
        return
    what = (f"one group of all {len(topo.hosts)} hosts" if len(per_switch) < 2
            else f"{len(per_switch)} groups of one host")
    raise FieldError(where, field, f"{name} on a topology of servers (e.g. '{GROUPS_SPEC}') or of several hosts "
                     f"on each of several switches: on {topo.spec} its groups would be {what}, a plain ring", name)


def collective_formula(collective: str, algo: str, p: int, n: float, alpha: float, beta: float, gamma: float = 0.0,
                       *, chunks: int | None = None, switches: int = 0, switch_latency: float = 0.0,
                       frame: float = 0.0, acks: bool = False, groups: int | None = None) -> float:
    """Closed-form contention-free time of ``collective`` by ``algo`` as the generators build it
    (:mod:`~emulator.model.collectives.formulas` has the forms and what each term is). ``groups`` must be given
    for ``hier``: it is not in the other arguments. Raises :class:`ValueError` for a pair without a formula and
    for what a form does not cover (``hd`` with ``p`` not a power of two, ...)."""
    known = REGISTRY.get((collective, algo))
    if known is None or known.closed_form is None:
        raise ValueError(f"no closed form for {algo} {collective}")
    return known.closed_form(collective, Terms(p, n, alpha, beta, gamma, chunks, switches, switch_latency, frame,
                                               acks, groups))


def allreduce_formula(algo: str, p: int, n: float, alpha: float, beta: float, gamma: float = 0.0, *,
                      switches: int = 0, switch_latency: float = 0.0, frame: float = 0.0,
                      acks: bool = False) -> float:
    """:func:`collective_formula` of an allreduce (``ring``, ``hd``/``hdrm`` and ``rd``; ``docs/domain.md`` §2,
    §3): with ``switches = 0`` the textbook ``2(p-1)·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma``,
    ``2·log2(p)·alpha + ...`` and ``log2(p)·(alpha + n·beta + n·gamma)``."""
    return collective_formula(ALLREDUCE, algo, p, n, alpha, beta, gamma, switches=switches,
                              switch_latency=switch_latency, frame=frame, acks=acks)
