"""nccl-tests' conventions: its binaries, its sizes, the count each size is run with, its bus-bandwidth factors and
its table (NVIDIA/nccl-tests, ``src/common.cu`` and each test's ``*GetCollByteCount`` and ``*GetBw``).

* ``-b``/``-e`` read a size as nccl-tests does: a number with an optional
  ``K``, ``M`` or ``G`` (powers of 1024); ``-f`` multiplies from ``-b`` up to
  ``-e``.
* The ``size`` column is the larger of a rank's send and receive buffers in
  bytes; ``count`` is the element count passed to NCCL (per rank for all-gather
  and reduce-scatter, per peer for all-to-all, rounded down to 16 bytes). The size is also what NCCL's model
  is given (its ``nBytes``: the whole buffer for all-gather and reduce-scatter, a rank's send buffer for
  all-to-all).
* ``algbw`` is size / time in GB/s (10^9 bytes per second); ``busbw`` is algbw
  times the collective's factor: all-reduce ``2(n-1)/n``; all-gather,
  reduce-scatter and all-to-all ``(n-1)/n``; broadcast, reduce and
  send/receive 1.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from emulator.base.errors import FieldError

TYPE_SIZE = 4  # -d float, nccl-tests' default
MAX_BYTES = 1 << 40
MAX_SIZES = 1000


@dataclass(frozen=True)
class Op:
    """One nccl-tests binary."""

    binary: str
    collective: str  # the name the model knows
    redop: str  # what the table prints
    per_rank: bool  # count per rank (all-gather, reduce-scatter) or per peer (all-to-all)
    root: int
    factor: Callable[[int], float]


OPS = {op.binary: op for op in (
    Op("all_reduce_perf", "allreduce", "sum", False, -1, lambda n: 2 * (n - 1) / n),
    Op("all_gather_perf", "allgather", "none", True, -1, lambda n: (n - 1) / n),
    Op("reduce_scatter_perf", "reducescatter", "sum", True, -1, lambda n: (n - 1) / n),
    Op("alltoall_perf", "alltoall", "none", True, -1, lambda n: (n - 1) / n),
    Op("broadcast_perf", "broadcast", "none", False, 0, lambda n: 1.0),
    Op("reduce_perf", "reduce", "sum", False, 0, lambda n: 1.0),
    Op("sendrecv_perf", "sendrecv", "sum", False, -1, lambda n: 1.0),
)}

_SIZE = re.compile(r"^\s*(\d+)\s*([kKmMgG]?)\s*$")


def parse_size(flag: str, text: str) -> int:
    """A size as nccl-tests reads ``-b``/``-e``: ``8``, ``128K``, ``128M``, ``8G`` (powers of 1024)."""
    match = _SIZE.match(text) if len(text) < 40 else None
    if match is None:
        raise FieldError("nccl-tests", flag, "a size such as 8, 128K, 128M or 8G", text)
    value = int(match.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2).lower()]
    if not 1 <= value <= MAX_BYTES:
        raise FieldError("nccl-tests", flag, "a size from 1 byte to 1T", text)
    return value


def sizes(minimum: int, maximum: int, factor: int) -> list[int]:
    """The sizes nccl-tests runs for ``-b minimum -e maximum -f factor``."""
    if maximum < minimum:
        raise FieldError("nccl-tests", "maxbytes", f"a size at least -b ({minimum})", maximum)
    if not 2 <= factor <= 1 << 20:
        raise FieldError("nccl-tests", "stepfactor", "an integer from 2 to 1048576", factor)
    out, size = [], minimum
    while size <= maximum:
        out.append(size)
        size *= factor
    if len(out) > MAX_SIZES:
        raise FieldError("nccl-tests", "stepfactor", f"at most {MAX_SIZES} sizes", factor)
    return out


def count_and_size(op: Op, size: int, ranks: int) -> tuple[int, int]:
    """The element count NCCL is called with and the size nccl-tests prints for a requested ``size``."""
    count = size // TYPE_SIZE
    if not op.per_rank:
        return count, count * TYPE_SIZE
    per = (count // ranks) // (16 // TYPE_SIZE) * (16 // TYPE_SIZE)  # 16-byte aligned, as nccl-tests does
    return per, per * ranks * TYPE_SIZE


@dataclass(frozen=True)
class Row:
    """One line of nccl-tests' table."""

    size: int
    count: int
    op: Op
    time_us: float
    ranks: int

    @property
    def algbw_gbs(self) -> float:
        return self.size / (self.time_us * 1e3) if self.time_us > 0 else 0.0

    @property
    def busbw_gbs(self) -> float:
        return self.algbw_gbs * self.op.factor(self.ranks)

    def to_json(self) -> dict[str, float]:
        return {"size": self.size, "time_us": round(self.time_us, 3), "algbw_GBps": round(self.algbw_gbs, 3),
                "busbw_GBps": round(self.busbw_gbs, 3)}


HEADER = ("#       size         count      type   redop    root     time   algbw   busbw",
          "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")


def format_row(row: Row) -> str:
    """One line as nccl-tests prints it (its out-of-place columns)."""
    return (f"{row.size:12d}  {row.count:12d}  {'float':>8}  {row.op.redop:>6}  {row.op.root:6d}  "
            f"{row.time_us:7.2f}  {row.algbw_gbs:6.2f}  {row.busbw_gbs:6.2f}")


def average_busbw(rows: list[Row]) -> float:
    """nccl-tests' closing "Avg bus bandwidth": the mean of the rows' busbw."""
    return sum(r.busbw_gbs for r in rows) / len(rows) if rows else 0.0
