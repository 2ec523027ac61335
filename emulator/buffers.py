"""One rank's buffers and the numeric work on them: inputs, local reduce and copy, received additions, the check.

A rank holds two float32 buffers, ``data`` (the allreduce's input and
result) and ``scratch``, both in chunks of the schedule's ``chunk_bytes``.
:func:`input_values` fills ``data`` with small integers that identify the
rank and element (exact in float32 when summed), so :func:`expected_sum` is
the exact result and :meth:`RankBuffers.wrong` can name the first wrong
element.

Additions into one chunk may be unordered (the schedule allows two
accumulations to commute, ``docs/schedule-format.md``); numpy releases the
GIL while adding, so every addition and copy takes one lock here.
"""

from __future__ import annotations

import threading

import numpy as np

from emulator.schedule.format import REDUCE, Op, Schedule


def input_values(rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s input: small integers (exact in float32 when summed) that differ per rank and element."""
    i = np.arange(n, dtype=np.int64)
    return (((rank * 131 + i * 7) % 61) + 1).astype(np.float32)


def expected_sum(p: int, n: int) -> np.ndarray:
    """The allreduce result of :func:`input_values` over ranks 0..p-1, computed without p passes."""
    table = np.array([sum(((r * 131 + c) % 61) + 1 for r in range(p)) for c in range(61)], dtype=np.float32)
    i = np.arange(n, dtype=np.int64)
    return table[(i * 7) % 61]


def bytes_view(array: np.ndarray) -> memoryview:
    """A writable byte view of a contiguous numpy array (no copy)."""
    return memoryview(array.data).cast("B")


class RankBuffers:
    """Rank ``rank``'s ``data`` and ``scratch`` buffers for ``schedule`` (see the module docstring)."""

    def __init__(self, schedule: Schedule, rank: int):
        self.elems_per_chunk = schedule.chunk_bytes // 4
        self.arrays = {
            "data": np.zeros(schedule.chunks * self.elems_per_chunk, dtype=np.float32),
            "scratch": np.zeros(max(schedule.scratch_chunks, 1) * self.elems_per_chunk, dtype=np.float32),
        }
        self.inputs = input_values(rank, len(self.arrays["data"]))
        self.expected = expected_sum(schedule.p, len(self.arrays["data"]))
        self._lock = threading.Lock()

    def view(self, buffer: str, chunk: int, nchunks: int) -> np.ndarray:
        """Chunks ``chunk .. chunk + nchunks - 1`` of ``buffer`` (a view: writing it writes the buffer)."""
        e = self.elems_per_chunk
        return self.arrays[buffer][chunk * e:(chunk + nchunks) * e]

    def target(self, op: Op) -> np.ndarray:
        """The range ``op`` sends, receives into or writes."""
        return self.view(op.buffer, op.chunk, op.nchunks)

    def reset(self) -> None:
        """``data`` back to this rank's input, ``scratch`` to zeros (before every repetition)."""
        np.copyto(self.arrays["data"], self.inputs)
        self.arrays["scratch"][:] = 0

    def run_local(self, op: Op) -> None:
        """A ``reduce`` (add the source range into the target) or a ``copy`` (overwrite it)."""
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
        """None if ``data`` holds the allreduce's result, else how many elements are wrong and the first one."""
        data = self.arrays["data"]
        if np.array_equal(data, self.expected):
            return None
        bad = np.flatnonzero(data != self.expected)
        first = int(bad[0])
        return (f"{len(bad)} of {len(self.expected)} elements wrong; element {first} "
                f"(chunk {first // self.elems_per_chunk}) is {data[first]:g}, expected {self.expected[first]:g}")


class Staging:
    """A receive worker's own landing area for ``recv_reduce`` data, grown to the largest message."""

    def __init__(self) -> None:
        self._array = np.empty(0, dtype=np.float32)

    def take(self, size: int) -> np.ndarray:
        """An array of ``size`` elements (its contents are whatever was there)."""
        if self._array.size < size:
            self._array = np.empty(size, dtype=np.float32)
        return self._array[:size]
