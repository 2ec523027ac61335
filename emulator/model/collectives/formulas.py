"""Closed-form contention-free times of the generated collectives (``docs/domain.md`` §2, §3).

Each algorithm's registration (:mod:`emulator.model.collectives.registry`)
names its closed form here; :func:`~emulator.model.collectives.registry.collective_formula`
evaluates it. They are what the alpha-beta step model of
:func:`emulator.model.prediction.cost.analyze` sums to where no link is
shared (and, with ``acks``, the timing model's time), and the unit tests
hold the models to them.

Every message of ``b`` bytes over a path of ``switches`` switches costs
``alpha + switches·switch_latency + b·beta + switches·last·beta`` (software
latency, switch latency, serialisation, and the store-and-forward of its last
frame of ``last`` bytes on each further link: ``b`` cut into frames of
``frame`` bytes, see :func:`~emulator.model.topology.last_segment_bytes`).
Pipelined algorithms (``ring``, ``dbtree``) post their receives before their
messages come, so they pay one rendezvous (``switches·switch_latency``) in
all; lockstep ones (``hd``, ``hdrm``, ``rd``, ``direct``) one per round. With
``acks`` (the timing model's time, not the step model's sum) a round's send
also waits for the previous one's ACK, which leaves its receiver behind that
receiver's own last frame of the previous round (``last·beta``, the timing
model's rule 6): a round starts ``max(rendezvous, last·beta)`` after the
previous one's data arrived. ``n`` is nccl-tests' size of the collective
(each rank's ``data`` buffer; a reduce-scatter's input, an all-gather's
output, an alltoall's send buffer). With ``switches = 0`` and ``m(b) = alpha
+ b·beta`` (Thakur, Rabenseifner and Gropp 2005, "Optimization of collective
communication operations in MPICH"):

=====================  ==================  ============================================================
collective             algo                time
=====================  ==================  ============================================================
allreduce              ring                ``2(p-1)·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma``
allreduce              hd, hdrm            ``2·log2(p)·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma``
allreduce              rd                  ``log2(p)·(alpha + n·beta + n·gamma)``
reduce_scatter         ring, direct, hier  ``(p-1)·m(n/p) + (p-1)/p·n·gamma``
reduce_scatter         hd, hdrm            ``log2(p)·alpha + (p-1)/p·n·beta + (p-1)/p·n·gamma``
allgather              ring, direct, hier  ``(p-1)·m(n/p)``
allgather              hd, hdrm            ``log2(p)·alpha + (p-1)/p·n·beta``
alltoall               direct              ``(p-1)·m(n/p)``
broadcast, reduce      ring                ``(C+p-2)·m(n/C)`` (+ ``(C+p-2)·n/C·gamma`` for reduce)
broadcast, reduce      dbtree              ``(C/2 + floor(log2(p-1)))·m(n/C)``
broadcast, reduce      hd, hdrm            ``2·log2(p)·alpha + 2(p-1)/p·n·beta`` (+ ``(p-1)/p·n·gamma``)
=====================  ==================  ============================================================

``hd``, ``hdrm`` and ``rd`` need ``p`` a power of two. ``C`` is the
schedule's ``chunks`` (required for ``ring`` and ``dbtree`` broadcast and
reduce). ``hier`` reduce-scatter and all-gather have the ring's form over one
group (``groups`` = 1) or groups of one rank (``groups`` = ``p``), where they
are a ring; over several groups of several ranks they have none here (two
link rates, and ``groups`` messages per rank and step inside a group). The
tree's reductions have no closed form here (a rank may add several messages
in one step): ``gamma`` must be 0 for ``dbtree`` reduce. Each form raises
:class:`ValueError` for what it does not cover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emulator.model.schedule.semantics import BROADCAST, REDUCE_SCATTER, REDUCE_TO_ROOT
from emulator.model.topology import last_segment_bytes


@dataclass(frozen=True)
class Terms:
    """What a closed form charges: ``p`` ranks, ``n`` bytes, per-message ``alpha``, per-byte ``beta`` and
    ``gamma`` (a reduction), the schedule's ``chunks``, the ``switches`` a path crosses and each one's
    ``switch_latency``, the ``frame`` size, whether rounds wait for ``acks``, and ``hier``'s ``groups``."""

    p: int
    n: float
    alpha: float
    beta: float
    gamma: float = 0.0
    chunks: int | None = None
    switches: int = 0
    switch_latency: float = 0.0
    frame: float = 0.0
    acks: bool = False
    groups: int | None = None

    @property
    def rendezvous(self) -> float:
        """What a rendezvous costs: the clear to send's way back over the switches."""
        return self.switches * self.switch_latency

    def message(self, b: float) -> float:
        """One message of ``b`` bytes: latencies, serialisation, and its last frame's store-and-forward on later
        links."""
        last = last_segment_bytes(b, int(self.frame)) if self.frame else 0.0
        return self.alpha + self.switches * self.switch_latency + b * self.beta + self.switches * last * self.beta


#: A closed form: the collective's name and the terms -> seconds.
ClosedForm = Callable[[str, Terms], float]


@dataclass(frozen=True)
class _Round:
    """One lockstep round of a closed form: its message bytes, whether every receiver also sends in it (so its
    ACK leaves behind a frame of its own) and whether the receivers add what they got."""

    bytes: float
    two_way: bool = True
    reduces: bool = False


def _lockstep(rounds: list[_Round], t: Terms) -> float:
    """Lockstep rounds in order. Each pays its message, and starts once the previous round's reduction and its
    own rendezvous are done; with ``acks``, also no sooner than the previous round's ACK is back, which leaves a
    two-way round's receiver behind that receiver's own last frame (``last·beta``: the timing model's rule 6).
    The last round's reduction ends the time."""
    total, ack_wait, reduce = 0.0, 0.0, 0.0
    for r in rounds:
        total += max(ack_wait, reduce + t.rendezvous) + t.message(r.bytes)
        last = last_segment_bytes(r.bytes, int(t.frame)) if t.frame else 0.0
        ack_wait = last * t.beta if t.acks and r.two_way else 0.0
        reduce = r.bytes * t.gamma if r.reduces else 0.0
    return total + reduce


def _halving_rounds(p: int, n: float) -> list[float]:
    """The bytes of recursive halving's rounds, ``n/2, n/4, ..., n/p`` (``p`` a power of two)."""
    k = p.bit_length() - 1
    if 1 << k != p:
        raise ValueError("the halving-doubling formula needs p a power of two")
    return [n / 2 ** (s + 1) for s in range(k)]


def _reduced(collective: str, t: Terms) -> float:
    """The reduction of a reduce-scatter or a reduce: ``(p-1)/p·n·gamma`` (nothing for the others)."""
    return (t.p - 1) / t.p * t.n * t.gamma if collective in (REDUCE_SCATTER, REDUCE_TO_ROOT) else 0.0


# ------------------------------------------------------------------ allreduce
def allreduce_ring(collective: str, t: Terms) -> float:
    """Reduce-scatter then all-gather around the ring, pipelined: one rendezvous in all."""
    return t.rendezvous + 2 * (t.p - 1) * t.message(t.n / t.p) + (t.p - 1) / t.p * t.n * t.gamma


def allreduce_halving_doubling(collective: str, t: Terms) -> float:
    """Rabenseifner: recursive halving (each round adding), then recursive doubling."""
    halving = _halving_rounds(t.p, t.n)
    return _lockstep([_Round(b, reduces=True) for b in halving] + [_Round(b) for b in halving[::-1]], t)


def allreduce_recursive_doubling(collective: str, t: Terms) -> float:
    """``log2(p)`` rounds, each the whole buffer both ways, then its reduction."""
    if t.p & (t.p - 1):
        raise ValueError(f"the rd formula needs a power-of-two p (got {t.p})")
    return _lockstep([_Round(t.n, reduces=True)] * (t.p.bit_length() - 1), t)


# ------------------------------------------------------------------ reduce-scatter, all-gather, alltoall
def ring_blocks(collective: str, t: Terms) -> float:
    """A ring reduce-scatter or all-gather: ``p-1`` pipelined steps of one block."""
    return t.rendezvous + (t.p - 1) * t.message(t.n / t.p) + _reduced(collective, t)


def hier_blocks(collective: str, t: Terms) -> float:
    """``hier``'s reduce-scatter or all-gather where it is a ring: over one group, or groups of one rank."""
    if t.groups not in (1, t.p):
        raise ValueError(f"no closed form for hier {collective} over {t.groups} groups (only over one group, "
                         "or groups of one rank, where it is a ring: say how many with groups=)")
    return ring_blocks(collective, t)


def direct_blocks(collective: str, t: Terms) -> float:
    """Pairwise exchanges: ``p-1`` lockstep rounds of one block each."""
    return _lockstep([_Round(t.n / t.p, reduces=collective == REDUCE_SCATTER)] * (t.p - 1), t)


def halving_doubling_blocks(collective: str, t: Terms) -> float:
    """Recursive halving (a reduce-scatter) or doubling (an all-gather): ``log2(p)`` lockstep rounds."""
    reduces = collective == REDUCE_SCATTER
    halving = _halving_rounds(t.p, t.n)
    sizes = halving if reduces else halving[::-1]
    return _lockstep([_Round(b, reduces=reduces) for b in sizes], t)


# ------------------------------------------------------------------ broadcast, reduce
def rooted_halving_doubling(collective: str, t: Terms) -> float:
    """Broadcast: a scatter (one way) then an all-gather; reduce: a reduce-scatter then a gather (one way)."""
    halving = _halving_rounds(t.p, t.n)
    if collective == BROADCAST:
        rounds = [_Round(b, two_way=False) for b in halving] + [_Round(b) for b in halving[::-1]]
    else:
        rounds = [_Round(b, reduces=True) for b in halving] + [_Round(b, two_way=False) for b in halving[::-1]]
    return _lockstep(rounds, t)


def _pipelined_steps(collective: str, t: Terms, steps: int) -> float:
    """``steps`` pipelined steps of one of the schedule's ``chunks`` each (adding each for a reduce)."""
    assert t.chunks
    adds = steps * t.n / t.chunks * t.gamma if collective == REDUCE_TO_ROOT else 0.0
    return t.rendezvous + steps * t.message(t.n / t.chunks) + adds


def _chunks_given(algo: str, collective: str, t: Terms) -> int:
    if not t.chunks:
        raise ValueError(f"the {algo} {collective} formula needs the schedule's chunks")
    return t.chunks


def rooted_chain(collective: str, t: Terms) -> float:
    """A pipelined chain through every rank: ``chunks + p - 2`` steps."""
    return _pipelined_steps(collective, t, _chunks_given("ring", collective, t) + t.p - 2)


def rooted_double_tree(collective: str, t: Terms) -> float:
    """The double binary tree, each tree half the chunks: ``chunks/2 + floor(log2(p-1))`` steps."""
    chunks = _chunks_given("dbtree", collective, t)
    if t.gamma and collective == REDUCE_TO_ROOT:
        raise ValueError("no closed form for the dbtree reduce's reductions (gamma must be 0)")
    return _pipelined_steps(collective, t, chunks // 2 + (t.p - 1).bit_length() - 1)

