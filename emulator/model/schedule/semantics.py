"""What each collective means: every rank's input, the result each rank must end with, and its bus bandwidth.

Pure; the one statement of the collectives' semantics, used by the schedule
format (which buffer shapes a collective allows), the symbolic executor (the
proof), the agents' data check (:mod:`emulator.model.schedule.buffers`) and the metrics.

A schedule works on chunks (of one size, or differing by one element:
:class:`~emulator.model.schedule.format.ChunkLayout`). Every chunk of a rank's buffers
holds, in the model, a *label* (which chunk of the collective's global data it
stands for) and the set of ranks whose contribution to that chunk it sums.
Buffers: ``data`` (the input, and the result when the collective is in
place), ``output`` (``output_chunks`` chunks, the result of an out-of-place
collective) and ``scratch``. With ``p`` ranks and ``k`` chunks per rank's
block (the ranks of a process group, numbered in the group's order: rank
``r`` below is the group's ``r``-th):

================  ===========================  ===========================================
collective        input (``data``)             result (``output``, or ``data`` in place)
================  ===========================  ===========================================
allreduce         every rank: chunk c          every rank: chunk c summed over all ranks
reduce            every rank: chunk c          the root: chunk c summed over all ranks
broadcast         the root: chunk c            every rank: the root's chunk c
reduce_scatter    every rank: p·k chunks       rank r: chunks r·k..r·k+k-1 summed over all
allgather         rank r: its k chunks         every rank: all p·k chunks, each from its rank
alltoall          rank r: p blocks of k        rank r: block s is rank s's block r
p2p               anything                     nothing is checked: only delivery
================  ===========================  ===========================================

In place, ``reduce_scatter`` leaves rank r's result in ``data`` chunks
``r·k..`` and ``allgather`` takes rank r's input from ``data`` chunks
``r·k..`` (NCCL's in-place layout); out of place, allgather's ``data`` has
``k`` chunks and reduce_scatter's ``output`` has ``k``. ``p2p`` stands for
point-to-point traffic with no collective meaning (a Chakra trace of sends
and receives): its schedule is checked for deadlock and matching sizes only.

Bus bandwidth follows nccl-tests (``doc/PERFORMANCE.md``): ``algbw = S / t``
with ``S`` the collective's size (the larger of its input and output), and
``busbw = algbw · factor``: ``2(p-1)/p`` for allreduce, ``(p-1)/p`` for
reduce_scatter, allgather and alltoall, 1 for broadcast, reduce and p2p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ALLREDUCE, REDUCE_SCATTER, ALLGATHER, ALLTOALL = "allreduce", "reduce_scatter", "allgather", "alltoall"
BROADCAST, REDUCE_TO_ROOT, P2P = "broadcast", "reduce", "p2p"
#: A schedule whose segments are of different collectives (see :class:`Shape`).
MIXED = "mixed"


@dataclass(frozen=True)
class Collective:
    """One collective's registration: its name, its short name, what its proof establishes in words, its bus
    bandwidth factor (nccl-tests' busbw / algbw over ``p`` ranks) and whether it has a root. What its ranks hold
    before and after is :class:`Shape`'s; its size in bytes,
    :attr:`~emulator.model.schedule.format.Schedule.collective_bytes` (the larger of input and output)."""

    name: str
    short: str  # in the names of a workload's segments ("tp ar", "dp rs")
    result: str  # what every rank ends with, as the proof establishes it
    bus_factor: Callable[[int], float]
    rooted: bool = False


def _twice_all_but_one(p: int) -> float:
    return 2 * (p - 1) / p


def _all_but_one(p: int) -> float:
    return (p - 1) / p


def _one(p: int) -> float:
    return 1.0


#: Every collective by name.
MEANINGS: dict[str, Collective] = {c.name: c for c in (
    Collective(ALLREDUCE, "ar", "every rank ends with every chunk reduced over all ranks, each once",
               _twice_all_but_one),
    Collective(REDUCE_SCATTER, "rs", "every rank ends with its block reduced over all ranks, each once",
               _all_but_one),
    Collective(ALLGATHER, "ag", "every rank ends with every rank's block", _all_but_one),
    Collective(ALLTOALL, "a2a", "every rank ends with block r of every rank r's input, in rank order", _all_but_one),
    Collective(BROADCAST, "bc", "every rank ends with the root's buffer", _one, rooted=True),
    Collective(REDUCE_TO_ROOT, "red", "the root ends with every chunk reduced over all ranks, each once", _one,
               rooted=True),
    Collective(P2P, "p2p", "every message is matched and delivered, nothing deadlocks (no data to check)", _one),
)}
COLLECTIVES = tuple(MEANINGS)
ROOTED = tuple(c for c, meaning in MEANINGS.items() if meaning.rooted)


def qualified(collective: str, label: str) -> str:
    """``label`` for an allreduce (the collective a run means when it names none), else ``<collective>-<label>``:
    how cell ids and results name an algorithm of another collective (``allgather-ring``)."""
    return label if collective == ALLREDUCE else f"{collective}-{label}"

#: An owner meaning "summed over every rank".
ALL = -2
#: An owner meaning "nothing": an empty input chunk.
NOBODY = -1


@dataclass(frozen=True)
class Piece:
    """What one chunk holds: the global chunk ``label``, contributed by ``owner`` (a rank, :data:`ALL`)."""

    label: int
    owner: int


@dataclass(frozen=True)
class Shape:
    """A collective over ``p`` ranks on ``chunks`` data chunks and ``output_chunks`` output chunks (0: in place).

    A schedule of several collectives (a training iteration, a trace) holds
    one :class:`Shape` per *segment*: its chunks start at ``data_offset`` of
    ``data`` and ``output_offset`` of ``output``, and its labels at
    ``label_base``. Chunk numbers given to and labels returned by the methods
    below are the segment's own (from 0) plus ``label_base`` for labels.

    ``group`` is a process group: the schedule's ranks the collective spans,
    in the group's order (``p`` of them; empty: ranks ``0..p-1``). The methods
    take and return the schedule's ranks; a rank outside the group holds
    nothing of it and must end with nothing. :data:`ALL` means every member.
    """

    collective: str
    p: int
    chunks: int
    output_chunks: int = 0
    root: int = 0
    data_offset: int = 0
    output_offset: int = 0
    label_base: int = 0
    group: tuple[int, ...] = ()

    @property
    def members(self) -> tuple[int, ...]:
        """The schedule's ranks in this collective, in the group's order."""
        return self.group or tuple(range(self.p))

    def _local(self, rank: int) -> int:
        """``rank``'s place in the group (-1: not in it)."""
        if not self.group:
            return rank if 0 <= rank < self.p else -1
        try:
            return self.group.index(rank)
        except ValueError:
            return -1

    def _global(self, piece: Piece) -> Piece:
        owner = piece.owner if piece.owner < 0 or not self.group else self.group[piece.owner]
        return Piece(piece.label + self.label_base, owner)

    @property
    def in_place(self) -> bool:
        return self.output_chunks == 0

    @property
    def result_buffer(self) -> str:
        return "data" if self.in_place else "output"

    @property
    def block(self) -> int:
        """Chunks per rank's block (reduce_scatter's result, allgather's input, alltoall's block); else all."""
        if self.collective == ALLGATHER and not self.in_place:
            return self.chunks
        if self.collective == REDUCE_SCATTER and not self.in_place:
            return self.output_chunks
        if self.collective in (ALLGATHER, REDUCE_SCATTER, ALLTOALL):
            return self.chunks // self.p
        return self.chunks

    @property
    def result_chunks(self) -> int:
        return self.chunks if self.in_place else self.output_chunks

    def problem(self) -> tuple[str, str, object] | None:
        """``(field, expected, given)`` if the buffers cannot hold this collective, else None."""
        c, p, out = self.collective, self.p, self.output_chunks
        if c not in COLLECTIVES:
            return "collective", "one of " + ", ".join(COLLECTIVES), c
        if c in ROOTED and not 0 <= self.root < p:
            return "root", f"a rank 0..{p - 1}", self.root
        if c in (REDUCE_SCATTER, ALLTOALL) or (c == ALLGATHER and self.in_place):
            if self.chunks % p:
                return "chunks", f"a multiple of the {p} ranks (one block per rank)", self.chunks
        if out == 0:
            return None
        wanted = {ALLGATHER: self.chunks * p, REDUCE_SCATTER: self.chunks // p}.get(c, self.chunks)
        if c == P2P:
            return None
        if out != wanted:
            return "output_chunks", f"0 (in place) or {wanted} for {c} over {p} ranks", out
        return None

    def input_piece(self, rank: int, chunk: int) -> Piece:
        """What ``data`` chunk ``chunk`` of ``rank`` holds before the collective (owner NOBODY: nothing)."""
        local = self._local(rank)
        if local < 0:
            return Piece(self.label_base + chunk, NOBODY)
        return self._global(self._input(local, chunk))

    def result_piece(self, rank: int, chunk: int) -> Piece | None:
        """What result chunk ``chunk`` of ``rank`` must hold afterwards (None: anything)."""
        local = self._local(rank)
        piece = None if local < 0 else self._result(local, chunk)
        return None if piece is None else self._global(piece)

    def _input(self, rank: int, chunk: int) -> Piece:
        c, k = self.collective, self.block
        if c == BROADCAST:
            return Piece(chunk, rank if rank == self.root else NOBODY)
        if c == ALLGATHER:
            if not self.in_place:
                return Piece(rank * k + chunk, rank)
            return Piece(chunk, rank if chunk // k == rank else NOBODY)
        return Piece(chunk, rank)

    def _result(self, rank: int, chunk: int) -> Piece | None:
        c, k = self.collective, self.block
        if c == P2P:
            return None
        if c == ALLREDUCE:
            return Piece(chunk, ALL)
        if c == REDUCE_TO_ROOT:
            return Piece(chunk, ALL) if rank == self.root else None
        if c == BROADCAST:
            return Piece(chunk, self.root)
        if c == ALLGATHER:
            return Piece(chunk, chunk // k)
        if c == ALLTOALL:
            return Piece(rank * k + chunk % k, chunk // k)
        # reduce_scatter
        if not self.in_place:
            return Piece(rank * k + chunk, ALL)
        return Piece(chunk, ALL) if chunk // k == rank else None

    def result_location(self, chunk: int) -> tuple[str, int]:
        """The buffer and chunk index (in the whole schedule's buffer) of result chunk ``chunk``."""
        if self.in_place:
            return "data", self.data_offset + chunk
        return "output", self.output_offset + chunk

    @property
    def labels(self) -> int:
        """How many global chunk labels there are (the size of the space labels index)."""
        if self.collective == ALLGATHER:
            return self.chunks * self.p if not self.in_place else self.chunks
        return self.chunks


def bus_factor(collective: str, p: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` over ``p`` ranks (its registration's; 1 for another)."""
    meaning = MEANINGS.get(collective)
    return meaning.bus_factor(p) if meaning is not None else 1.0


def bus_bandwidth_mbps(size: int, p: int, seconds: float, collective: str = ALLREDUCE) -> float:
    """nccl-tests busbw of ``collective`` (default allreduce) of ``size`` bytes taking ``seconds``, in Mbit/s.

    ``size`` is nccl-tests' size (:attr:`~emulator.model.schedule.format.Schedule.collective_bytes`); the factor is
    :func:`bus_factor`'s.
    """
    if seconds <= 0:
        return 0.0
    if collective == ALLREDUCE:  # the arithmetic of earlier versions, so existing figures stay the same to the bit
        return size / seconds * 2 * (p - 1) / p * 8 / 1e6
    return size / seconds * bus_factor(collective, p) * 8 / 1e6
