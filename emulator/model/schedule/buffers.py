"""One rank's buffers and the numeric work on them: inputs, local reduce and copy, received additions, the check.

A rank holds three buffers, ``data``, ``output`` and ``scratch``, in chunks
laid out as the schedule's :class:`~emulator.model.schedule.format.ChunkLayout`
says (float32 elements, or bytes for point-to-point traffic). Every chunk of a collective's input is filled with small integers
that identify the contributing rank and the element of the collective's
global data it stands for (its *label*, :mod:`emulator.model.schedule.semantics`;
exact in float32 when summed), so the result each rank must end with is
known exactly (:func:`expected_sum` for a sum over every rank of a group,
:func:`input_values` for one rank's contribution) and
:meth:`RankBuffers.wrong` can name the first wrong element. Chunks whose
result the collective leaves open (a reduce's non-roots, p2p traffic) are not
checked.

Additions into one chunk may be unordered (the schedule allows two
accumulations to commute, ``docs/schedule-format.md``); numpy releases the
GIL while adding, so every addition and copy takes one lock here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from emulator.model.schedule.format import COMPUTE, DTYPE_BYTES, RECV_REDUCE, REDUCE, ChunkLayout, Op, Schedule
from emulator.model.schedule.semantics import ALL, NOBODY, Shape

BUFFER_NAMES = ("data", "output", "scratch")


def input_values_at(rank: int, elements: np.ndarray) -> np.ndarray:
    """Rank ``rank``'s contribution to global elements ``elements``: small integers, exact in float32 when summed."""
    return (((rank * 131 + elements.astype(np.int64) * 7) % 61) + 1).astype(np.float32)


@functools.cache
def _sum_table(members: tuple[int, ...]) -> np.ndarray:
    """Per residue ``c`` of ``element * 7 mod 61``: the sum over ``members`` of their input there."""
    return np.array([sum(((r * 131 + c) % 61) + 1 for r in members) for c in range(61)], dtype=np.float32)


def expected_sum_at(p: int | tuple[int, ...], elements: np.ndarray) -> np.ndarray:
    """The sum over ranks 0..p-1 (or over the ranks ``p`` lists) of :func:`input_values_at`, without p passes."""
    members = tuple(range(p)) if isinstance(p, int) else p
    return _sum_table(members)[(elements.astype(np.int64) * 7) % 61]


def input_values(rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s allreduce input on ``n`` elements (labels are chunk indices)."""
    return input_values_at(rank, np.arange(n, dtype=np.int64))


def expected_sum(p: int, n: int) -> np.ndarray:
    """The allreduce result of :func:`input_values` over ranks 0..p-1."""
    return expected_sum_at(p, np.arange(n, dtype=np.int64))


#: Elements per batch of :func:`element_batches`: its index arrays and the value functions' int64 temporaries stay
#: a few MiB, whatever the buffers' size (over whole segments they peaked at 3.8 x the buffers, measured).
BATCH_ELEMENTS = 1 << 18


def element_batches(chunks: Sequence[int], labels: Sequence[int], layout: ChunkLayout | int,
                    batch: int = BATCH_ELEMENTS) -> Iterator[tuple[np.ndarray | slice, np.ndarray]]:
    """For chunk ``chunks[i]`` standing for global chunk ``labels[i]``: (where in the buffer, which global
    elements), at most about ``batch`` elements at a time (a chunk larger than that in slices of it).

    ``layout`` is the chunks' layout, or the elements of every chunk when they are equal. A chunk and its
    label are the same size (the layout's rule: labels keep a chunk's place in its block)."""
    if isinstance(layout, ChunkLayout) and not layout.equal:
        yield from _uneven_batches(chunks, labels, layout, batch)
        return
    e = layout if isinstance(layout, int) else layout.block_elements // layout.block
    if e >= batch:
        for chunk, label in zip(chunks, labels, strict=True):
            for lo in range(0, e, batch):
                hi = min(e, lo + batch)
                yield slice(chunk * e + lo, chunk * e + hi), np.arange(label * e + lo, label * e + hi,
                                                                         dtype=np.int64)
        return
    offsets = np.arange(e, dtype=np.int64)
    per = batch // e
    for i in range(0, len(chunks), per):
        c = np.asarray(chunks[i:i + per], dtype=np.int64)
        lab = np.asarray(labels[i:i + per], dtype=np.int64)
        yield (c[:, None] * e + offsets).ravel(), (lab[:, None] * e + offsets).ravel()


def _uneven_batches(chunks: Sequence[int], labels: Sequence[int], layout: ChunkLayout,
                    batch: int) -> Iterator[tuple[slice, np.ndarray]]:
    """:func:`element_batches` for chunks of two sizes: a chunk (or a slice of one) at a time."""
    for chunk, label in zip(chunks, labels, strict=True):
        start, origin, n = layout.offset(chunk), layout.offset(label), layout.elements(chunk)
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            yield slice(start + lo, start + hi), np.arange(origin + lo, origin + hi, dtype=np.int64)


def bytes_view(array: np.ndarray) -> memoryview:
    """A writable byte view of a contiguous numpy array (no copy)."""
    return memoryview(array.data).cast("B")


class RankBuffers:
    """Rank ``rank``'s ``data``, ``output`` and ``scratch`` buffers for ``schedule`` (see the module docstring)."""

    def __init__(self, schedule: Schedule, rank: int):
        self.dtype = np.float32 if schedule.dtype == "float32" else np.uint8
        self.layout = schedule.layout
        self.arrays = {buf: np.zeros(self.layout.offset(max(schedule.buffer_chunks(buf), 1)), dtype=self.dtype)
                       for buf in BUFFER_NAMES}
        self.inputs = np.zeros_like(self.arrays["data"])
        #: per buffer: the expected result and where it is checked (a mask), for the buffers that hold results
        self.expected: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if schedule.dtype == "float32":
            self._fill(schedule, rank)
        self._lock = threading.Lock()

    def _fill(self, schedule: Schedule, rank: int) -> None:
        """Inputs and expected results of every segment, a segment at a time."""
        for shape in schedule.shapes:
            if rank not in shape.members:
                continue
            pieces = [shape.input_piece(rank, c) for c in range(shape.chunks)]
            mine = [(shape.data_offset + c, pc.label) for c, pc in enumerate(pieces) if pc.owner != NOBODY]
            for where, elements in element_batches([c for c, _ in mine], [lab for _, lab in mine], self.layout):
                self.inputs[where] = input_values_at(rank, elements)
            self._expect(shape, rank)

    def _expect(self, shape: Shape, rank: int) -> None:
        """The result ``shape`` leaves in this rank's buffers, and the mask of where it is checked."""
        by_owner: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
        for c in range(shape.result_chunks):
            want = shape.result_piece(rank, c)
            if want is None:
                continue
            buf, index = shape.result_location(c)
            places, labels = by_owner.setdefault((buf, want.owner), ([], []))
            places.append(index)
            labels.append(want.label)
        for (buf, owner), (places, labels) in by_owner.items():
            values, mask = self.expected.setdefault(buf, (np.zeros_like(self.arrays[buf]),
                                                          np.zeros(self.arrays[buf].size, dtype=bool)))
            for where, elements in element_batches(places, labels, self.layout):
                values[where] = (expected_sum_at(shape.members, elements) if owner == ALL
                                 else input_values_at(owner, elements))
                mask[where] = True

    def view(self, buffer: str, chunk: int, nchunks: int) -> np.ndarray:
        """Chunks ``chunk .. chunk + nchunks - 1`` of ``buffer`` (a view: writing it writes the buffer)."""
        return self.arrays[buffer][self.layout.offset(chunk):self.layout.offset(chunk + nchunks)]

    def target(self, op: Op) -> np.ndarray:
        """The range ``op`` sends, receives into or writes."""
        return self.view(op.buffer, op.chunk, op.nchunks)

    def reset(self) -> None:
        """``data`` back to this rank's input, ``output`` and ``scratch`` to zeros (before every repetition)."""
        np.copyto(self.arrays["data"], self.inputs)
        self.arrays["output"][:] = 0
        self.arrays["scratch"][:] = 0

    def run_local(self, op: Op) -> None:
        """A ``reduce`` (add the source range into the target) or a ``copy`` (overwrite it)."""
        if op.kind == COMPUTE:
            return
        target = self.target(op)
        source = self.view(op.src or "data", op.src_chunk or 0, op.nchunks)
        with self._lock:
            if op.kind == REDUCE:
                np.add(target, source, out=target)
            else:
                target[:] = source

    def add(self, target: np.ndarray, values: np.ndarray) -> None:
        """``target += values`` atomically (two receives may add into one chunk: tree children)."""
        with self._lock:
            np.add(target, values, out=target)

    def wrong(self) -> str | None:
        """None if every checked element holds the collective's result, else how many are wrong and the first one."""
        for buf, (expected, mask) in self.expected.items():
            got = self.arrays[buf]
            bad = np.flatnonzero((got != expected) & mask)
            if bad.size:
                first = int(bad[0])
                where = "" if buf == "data" else f" of {buf}"
                return (f"{bad.size} of {int(mask.sum())} elements wrong; element {first}{where} "
                        f"(chunk {self._chunk_at(first)}) is {got[first]:g}, expected {expected[first]:g}")
        return None

    def _chunk_at(self, element: int) -> int:
        """The chunk holding ``element`` of a buffer."""
        chunk = element // self.layout.block_elements * self.layout.block
        while self.layout.offset(chunk + 1) <= element:
            chunk += 1
        return chunk


def rank_bytes(schedule: Schedule, rank: int) -> int:
    """An upper bound on the bytes :class:`RankBuffers` and its receive workers' :class:`Staging` hold for ``rank``.

    The three buffers, the saved inputs (the size of ``data``), for float32 the
    expected results and their masks of ``data`` and ``output`` (both counted,
    whichever the collective leaves its result in), and per receiving
    connection a staging area as large as its largest ``recv_reduce``. What the
    admission check (:mod:`emulator.runs.admission`) sizes an agent by.
    """
    chunk = schedule.chunk_bytes
    arrays = {buf: schedule.layout.range_bytes(0, max(schedule.buffer_chunks(buf), 1)) for buf in BUFFER_NAMES}
    total = sum(arrays.values()) + arrays["data"]
    if schedule.dtype == "float32":
        element_bytes = DTYPE_BYTES["float32"]
        for buf in ("data", "output"):
            total += arrays[buf] + arrays[buf] // element_bytes  # expected values and their bool mask
    staging: dict[tuple[int, int], int] = {}
    for op in schedule.ranks[rank].ops:
        if op.kind == RECV_REDUCE:
            key = (op.partner, op.lane)
            staging[key] = max(staging.get(key, 0), op.nchunks * chunk)
    return total + sum(staging.values())


class Staging:
    """A receive worker's own landing area for ``recv_reduce`` data, grown to the largest message."""

    def __init__(self) -> None:
        self._array = np.empty(0, dtype=np.float32)

    def take(self, size: int) -> np.ndarray:
        """An array of ``size`` elements (its contents are whatever was there)."""
        if self._array.size < size:
            self._array = np.empty(size, dtype=np.float32)
        return self._array[:size]
