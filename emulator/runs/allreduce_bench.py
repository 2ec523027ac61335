"""``emu-allreduce-bench``: an MPI allreduce benchmark in the manner of nccl-tests' ``all_reduce_perf``.

This module is the benchmark's pure logic, importable and testable without
MPI: the command line and its checks, Open MPI's allreduce algorithms by
name, the data pattern and its check, the timing arithmetic, the rows and the
JSON document. :mod:`emulator.emulation.mpi.allreduce_bench_program` is the MPI program around it
(the console script); only it imports :mod:`mpi4py`.

Usage (4 ranks on loopback, as the integration test runs it)::

    mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl self,tcp \\
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \\
        .venv/bin/emu-allreduce-bench --algo ring --sizes 4KiB,256KiB --iters 3 --warmup 1 --json out.json

``--algo`` picks one of Open MPI's ``coll tuned`` allreduce algorithms
(:data:`ALGORITHMS`): the program sets ``OMPI_MCA_coll_tuned_use_dynamic_rules=1``
and ``OMPI_MCA_coll_tuned_allreduce_algorithm=<id>`` in its own environment
before ``MPI_Init`` (``default`` sets nothing and leaves the choice to Open
MPI). Open MPI falls back on its own in some cases: ``ring`` with fewer
elements than ranks runs recursive doubling, ``rabenseifner`` with fewer
elements than the largest power of two <= ranks runs basic_linear, and
``segmented_ring`` with Open MPI's default segment size (0, set
``OMPI_MCA_coll_tuned_allreduce_algorithm_segmentsize``) runs plain ring.

Each rank's send buffer holds ``(rank + 1) * (i % 13 + 1)`` at element ``i``
(:func:`pattern`): small integers whose sum over the ranks, and every partial
sum, is exact in the data type, so the result is compared exactly
(:func:`expected`, :func:`wrong_mask`). By default (``--start window``) every
timed iteration starts at one time shared by all ranks, in windows of
:data:`WINDOW_FACTOR` times the slowest untimed iteration (the window-based
scheme of Hunold and Carpen-Amarie, "Reproducible MPI Benchmarking Is Still
Not As Easy As You Think", IEEE TPDS 2016): an ``MPI_Barrier`` lets ranks go
at different times, and the emulated fabric's dilated latency made that
spread a large part of an allreduce (docs/fidelity.md, 2026-12-05). The time
of a size is then the mean over the timed iterations of the slowest rank's
time from the shared start to its end; an iteration that began late (the one
before ran past its window) is counted and warned of. The ranks read one
clock (``time.time()``): exact where every emulated host is on one machine,
as good as the machines' clock synchronisation across a cluster. With
``--start barrier`` the timed iterations run back to back after one barrier,
and the time is the mean per iteration, the maximum over ranks. ``algbw`` is
``size * 8 / time`` in Mbit/s (the emulated links run at 5..100 Mbit/s) and
``busbw`` is ``algbw`` times nccl-tests' bus factor ``2 (p - 1) / p``
(:func:`emulator.model.schedule.semantics.bus_factor`).

Exit status: 0 when every row's data is right, 1 when some is wrong (after the
rows are printed), 2 with one line for a bad argument (before ``MPI_Init``),
3 when the run failed (an MPI error: the traceback is printed and the job aborted).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np

from emulator import __version__
from emulator.base.errors import MISSING, FieldError, UserError, int_field, printable
from emulator.base.files import read_json
from emulator.model.schedule.format import format_size, parse_size
from emulator.model.schedule.semantics import ALLREDUCE, bus_factor
from emulator.runs import trust
from emulator.runs.trust import Trust

PROG = "emu-allreduce-bench"
FORMAT_VERSION = 1

EXIT_OK, EXIT_WRONG, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3

#: Open MPI's ``coll_tuned_allreduce_algorithm`` values by name (``ompi_info --param coll tuned --level 9``);
#: ``default`` sets nothing: Open MPI decides by message size and ranks.
ALGORITHMS: dict[str, int | None] = {
    "default": None,
    "basic_linear": 1,
    "nonoverlapping": 2,
    "recursive_doubling": 3,
    "ring": 4,
    "segmented_ring": 5,
    "rabenseifner": 6,
}
ALIASES = {"halving_doubling": "rabenseifner"}

ENV_DYNAMIC_RULES = "OMPI_MCA_coll_tuned_use_dynamic_rules"
ENV_ALGORITHM = "OMPI_MCA_coll_tuned_allreduce_algorithm"
#: The MPI_T control variables behind the two environment variables.
CVAR_ALGORITHM = "coll_tuned_allreduce_algorithm"
CVAR_DYNAMIC_RULES = "coll_tuned_use_dynamic_rules"
CVAR_SEGMENT_SIZE = "coll_tuned_allreduce_algorithm_segmentsize"

#: numpy type, and the largest integer up to which every integer is exact in it.
DTYPES: dict[str, tuple[type[np.generic], int]] = {
    "float32": (np.float32, 2**24),
    "float64": (np.float64, 2**53),
    "int32": (np.int32, 2**31 - 1),
}
OPS = ("sum",)
#: The pattern's period: element i of rank r is (r + 1) * (i % PERIOD + 1).
PERIOD = 13
#: The largest size: three buffers of it per rank (send, receive, expected).
MAX_SIZE = 2**30
MAX_SIZES = 1000
DEFAULT_ITERS, DEFAULT_WARMUP = 20, 5
MAX_ITERS = 10**6
#: How the timed iterations start: ``window``, each at a time shared by every rank; ``barrier``, back to back
#: after one ``MPI_Barrier`` (as OSU's and nccl-tests' loops run).
START_MODES = ("window", "barrier")
#: A window is this many times the slowest untimed iteration (any rank's, timed from its own start).
WINDOW_FACTOR = 1.5
#: A rank that begins an iteration more than this share of a window after the window opened started late (the
#: iteration before ran past its window), and never for less than :data:`LATE_FLOOR_S` (a sleep's overshoot).
LATE_SHARE = 0.02
LATE_FLOOR_S = 0.001


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Options:
    algo: str
    sizes: tuple[int, ...]
    iters: int = DEFAULT_ITERS
    warmup: int = DEFAULT_WARMUP
    dtype: str = "float32"
    op: str = "sum"
    check: bool = True
    json_path: str | None = None
    start: str = "window"

    @property
    def sizing_iterations(self) -> int:
        """Untimed iterations per size: the warm-up, and with ``--start window`` at least one, which sizes the window."""
        return max(self.warmup, 1) if self.start == "window" else self.warmup

    @property
    def algorithm_id(self) -> int | None:
        """Open MPI's number for the algorithm; None for ``default``."""
        return ALGORITHMS[self.algo]

    @property
    def itemsize(self) -> int:
        return np.dtype(DTYPES[self.dtype][0]).itemsize


class _Parser(argparse.ArgumentParser):
    """argparse whose own errors (an unknown option, a missing value) raise :class:`UserError`, not exit."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{PROG}: {printable(message)} (see {PROG} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG, exit_on_error=False,
        description="Time MPI_Allreduce (out of place) per size with one of Open MPI's algorithms; rank 0 prints "
                    "rows like nccl-tests' all_reduce_perf, bandwidths in Mbit/s.",
        epilog="Run it under mpirun, e.g. mpirun -np 4 --mca btl self,tcp --mca btl_tcp_if_include lo "
               "--mca oob_tcp_if_include lo emu-allreduce-bench --algo ring --sizes 64KiB,1MiB. Exit status: 0 "
               "right data, 1 wrong data, 2 bad arguments, 3 the run failed.")
    names = ", ".join([*ALGORITHMS, *ALIASES])
    parser.add_argument("--algo", metavar="NAME", help=f"Open MPI's allreduce algorithm: {names}")
    parser.add_argument("--sizes", metavar="LIST", help="comma list of sizes in bytes, e.g. 64KiB,1MiB,4MiB")
    parser.add_argument("-b", "--minbytes", metavar="SIZE", help="instead of --sizes: the smallest size")
    parser.add_argument("-e", "--maxbytes", metavar="SIZE", help="with -b: the largest size (default: -b's)")
    parser.add_argument("-f", "--stepfactor", metavar="N", help="with -b: multiply the size by N (default 2)")
    parser.add_argument("--iters", metavar="N", default=str(DEFAULT_ITERS),
                        help=f"timed iterations per size (default {DEFAULT_ITERS})")
    parser.add_argument("--warmup", metavar="N", default=str(DEFAULT_WARMUP),
                        help=f"untimed iterations before them (default {DEFAULT_WARMUP})")
    parser.add_argument("--start", default="window", metavar="HOW",
                        help="window (default): every timed iteration starts at one time shared by all ranks, each "
                             f"window {WINDOW_FACTOR} times the slowest untimed iteration (at least one runs); "
                             "barrier: the timed iterations run back to back after one MPI_Barrier")
    parser.add_argument("--dtype", default="float32", metavar="TYPE", help=f"{'|'.join(DTYPES)} (default float32)")
    parser.add_argument("--op", default="sum", metavar="OP", help="reduction: sum")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                        help="compare the result with the expected sum (default: on)")
    parser.add_argument("--json", metavar="PATH", help="rank 0 writes the results here as JSON")
    return parser


def program_options(program: Sequence[str]) -> Options | None:
    """The options of ``program`` (a command line) when it runs this benchmark with arguments it accepts; None
    for any other program, and for arguments it would refuse (or ``--help``)."""
    if not program or os.path.basename(program[0]) != PROG:
        return None
    try:
        return parse_args(list(program[1:]))
    except (UserError, SystemExit):
        return None


def parse_args(argv: Sequence[str] | None) -> Options:
    """The options, or :class:`UserError` with the one line to print (``--help`` exits 0 as argparse does)."""
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentError as exc:  # an option without its value
        name = (exc.argument_name or "").split("/")[-1].lstrip("-")
        raise UserError(f"{PROG}: field '{printable(name)}': {printable(exc.message)} (see {PROG} --help)") from None
    if ns.algo is None:
        raise FieldError(PROG, "algo", "one of " + ", ".join([*ALGORITHMS, *ALIASES]), MISSING)
    algo = ALIASES.get(ns.algo, ns.algo)
    if algo not in ALGORITHMS:
        raise FieldError(PROG, "algo", "one of " + ", ".join([*ALGORITHMS, *ALIASES]), ns.algo)
    if ns.dtype not in DTYPES:
        raise FieldError(PROG, "dtype", "one of " + ", ".join(DTYPES), ns.dtype)
    if ns.op not in OPS:
        raise FieldError(PROG, "op", "one of " + ", ".join(OPS), ns.op)
    if ns.start not in START_MODES:
        raise FieldError(PROG, "start", "one of " + ", ".join(START_MODES), ns.start)
    iters = _count("iters", ns.iters, 1, MAX_ITERS)
    warmup = _count("warmup", ns.warmup, 0, MAX_ITERS)
    itemsize = np.dtype(DTYPES[ns.dtype][0]).itemsize
    if ns.sizes is not None:
        if ns.minbytes is not None or ns.maxbytes is not None or ns.stepfactor is not None:
            raise FieldError(PROG, "sizes", "either --sizes or -b/-e/-f, not both", ns.sizes)
        sizes = parse_sizes(ns.sizes)
    elif ns.minbytes is not None:
        sizes = size_range(ns.minbytes, ns.maxbytes, ns.stepfactor)
    else:
        if ns.maxbytes is not None or ns.stepfactor is not None:
            raise FieldError(PROG, "minbytes", "a size with -e/-f", MISSING)
        raise FieldError(PROG, "sizes", "a comma list of sizes such as 64KiB,1MiB (or -b MIN -e MAX)", MISSING)
    for size in sizes:
        check_size(size, ns.dtype, itemsize)
    return Options(algo=algo, sizes=sizes, iters=iters, warmup=warmup, dtype=ns.dtype, op=ns.op,
                   check=ns.check, json_path=ns.json, start=ns.start)


def _count(name: str, text: str, minimum: int, maximum: int) -> int:
    return int_field(PROG, name, text, minimum, maximum, text=True)


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"64KiB,1MiB"`` -> ``(65536, 1048576)``, in the order given; each as :func:`parse_size` reads it."""
    items = text.split(",")
    if len(items) > MAX_SIZES:
        raise FieldError(PROG, "sizes", f"at most {MAX_SIZES} sizes", f"{len(items)} sizes")
    return tuple(parse_size(item, PROG, "sizes") for item in items)


def size_range(minimum: str, maximum: str | None, factor: str | None) -> tuple[int, ...]:
    """nccl-tests' ``-b MIN -e MAX -f FACTOR``: MIN, MIN*FACTOR, ... up to MAX."""
    low = parse_size(minimum, PROG, "minbytes")
    high = low if maximum is None else parse_size(maximum, PROG, "maxbytes")
    step = 2 if factor is None else _count("stepfactor", factor, 2, 1024)
    if high < low:
        raise FieldError(PROG, "maxbytes", f"a size >= -b ({low} bytes)", maximum)
    if high > MAX_SIZE:  # before the loop: -e 1000TiB would otherwise be refused only after counting its steps
        raise FieldError(PROG, "maxbytes", f"a size <= {format_size(MAX_SIZE)}", maximum)
    sizes = [low]
    while sizes[-1] * step <= high:
        sizes.append(sizes[-1] * step)
    return tuple(sizes)


def check_size(size: int, dtype: str, itemsize: int) -> None:
    if size > MAX_SIZE:
        raise FieldError(PROG, "sizes", f"sizes <= {format_size(MAX_SIZE)}", format_size(size))
    if size % itemsize:
        raise FieldError(PROG, "sizes", f"multiples of {itemsize} bytes (whole {dtype} elements)", size)


def check_json_path(path: str) -> None:
    """Refuse a ``--json`` path that cannot be written, before the run rather than after it.

    The path must not be a directory, and its nearest existing ancestor must be a
    writable directory (:func:`emulator.base.files.write_json_atomic` makes the missing ones).
    """
    expected = "a file path in a directory this program can write"
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise FieldError(PROG, "json", expected + " (not a directory)", path)
    ancestor = os.path.dirname(target)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK | os.X_OK):
        raise FieldError(PROG, "json", expected, path)


def algorithm_environment(algo: str) -> dict[str, str]:
    """The environment variables that make Open MPI's ``coll tuned`` run ``algo`` (none for ``default``)."""
    number = ALGORITHMS[algo]
    if number is None:
        return {}
    return {ENV_DYNAMIC_RULES: "1", ENV_ALGORITHM: str(number)}


def rank_before_init(environ: Mapping[str, str]) -> int | None:
    """This process's rank as the launcher announced it (mpirun, PMIx, Hydra), before MPI_Init; None if none did."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


# ---------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------

def max_ranks(dtype: str) -> int:
    """The most ranks for which the pattern's sum, ``PERIOD * p (p + 1) / 2`` at most, is exact in ``dtype``."""
    triangle = DTYPES[dtype][1] // PERIOD  # the largest p (p + 1) / 2 allowed
    return (math.isqrt(8 * triangle + 1) - 1) // 2


def check_ranks(p: int, dtype: str) -> None:
    if p > max_ranks(dtype):
        raise FieldError(PROG, "ranks", f"at most {max_ranks(dtype)} ranks with {dtype} (the expected sums must "
                         "be exact)", p)


def _periodic(values: Iterable[int], count: int, dtype: str) -> np.ndarray:
    base = np.array(list(values), dtype=DTYPES[dtype][0])
    return np.resize(base, count)


def pattern(rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank ``rank``'s send buffer: element ``i`` is ``(rank + 1) * (i % PERIOD + 1)``."""
    return _periodic(((rank + 1) * (j + 1) for j in range(PERIOD)), count, dtype)


def expected(p: int, count: int, dtype: str) -> np.ndarray:
    """The sum of :func:`pattern` over ``p`` ranks: element ``i`` is ``p (p + 1) / 2 * (i % PERIOD + 1)``."""
    return _periodic((p * (p + 1) // 2 * (j + 1) for j in range(PERIOD)), count, dtype)


def wrong_mask(received: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where ``received`` differs from ``want`` (exactly: the values are exact integers; NaN is wrong)."""
    return np.asarray(received != want)


#: A value no element of a result can hold (sums are positive): the receive buffer is filled with it
#: before each check, so a result left over from an earlier call cannot pass for the next one.
SENTINEL = -1


# ---------------------------------------------------------------------------
# Timing and rows
# ---------------------------------------------------------------------------

def time_per_iteration(elapsed_s: float, iters: int) -> float:
    return elapsed_s / iters


def window_seconds(slowest_untimed_s: float) -> float:
    """The length of a timed iteration's window: :data:`WINDOW_FACTOR` times the slowest untimed iteration."""
    if not slowest_untimed_s > 0:
        raise ValueError(f"an untimed iteration must take some time, got {slowest_untimed_s!r}")
    return WINDOW_FACTOR * slowest_untimed_s


def window_starts(first_s: float, window_s: float, iters: int) -> list[float]:
    """When each timed iteration starts: one window after the other from ``first_s``."""
    return [first_s + i * window_s for i in range(iters)]


def is_late(lateness_s: float, window_s: float) -> bool:
    """True when a rank began an iteration so long after its window opened that the iteration before must
    have run past its window (:data:`LATE_SHARE`, :data:`LATE_FLOOR_S`)."""
    return lateness_s > max(LATE_SHARE * window_s, LATE_FLOOR_S)


def windowed_time(slowest_per_iteration_s: Sequence[float]) -> float:
    """The time of a size started in windows: the mean over the timed iterations of the slowest rank's time from
    the iteration's shared start to its own end."""
    if not slowest_per_iteration_s:
        raise ValueError("no timed iteration")
    return sum(slowest_per_iteration_s) / len(slowest_per_iteration_s)


def algbw_mbps(size: int, time_s: float) -> float:
    """``size`` bytes in ``time_s`` seconds, in Mbit/s."""
    if not time_s > 0:
        raise ValueError(f"a time must be positive, got {time_s!r}")
    return size * 8 / time_s / 1e6


def busbw_mbps(algbw: float, p: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce over ``p`` ranks: ``algbw * 2 (p - 1) / p``."""
    return algbw * bus_factor(ALLREDUCE, p)


@dataclass(frozen=True)
class BenchRow:
    """One size's result: the time as :data:`TIME_MEANING` says for the run's start; ``wrong`` None: unchecked."""

    size: int
    count: int
    time_s: float
    algbw_mbps: float
    busbw_mbps: float
    wrong: int | None
    #: timed iterations some rank began late (``--start window``; always 0 with ``barrier``)
    late_starts: int = 0

    @classmethod
    def measured(cls, size: int, count: int, time_s: float, p: int, wrong: int | None,
                 late_starts: int = 0) -> BenchRow:
        algbw = algbw_mbps(size, time_s)
        return cls(size=size, count=count, time_s=time_s, algbw_mbps=algbw, busbw_mbps=busbw_mbps(algbw, p),
                   wrong=wrong, late_starts=late_starts)

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "count": self.count, "time_s": self.time_s, "algbw_mbps": self.algbw_mbps,
                "busbw_mbps": self.busbw_mbps, "wrong": self.wrong, "late_starts": self.late_starts}

    @classmethod
    def from_json(cls, data: object, where: str = PROG) -> BenchRow:
        if not isinstance(data, dict):
            raise FieldError(where, "row", "an object", data)
        unknown = sorted(set(data) - {"size", "count", "time_s", "algbw_mbps", "busbw_mbps", "wrong", "late_starts"})
        if unknown:
            raise FieldError(where, unknown[0], "no such field", data[unknown[0]])
        ints = {name: _json_int(where, name, data.get(name, MISSING), 1) for name in ("size", "count")}
        floats = {name: _json_float(where, name, data.get(name, MISSING))
                  for name in ("time_s", "algbw_mbps", "busbw_mbps")}
        wrong = data.get("wrong", MISSING)
        return cls(size=ints["size"], count=ints["count"], time_s=floats["time_s"],
                   algbw_mbps=floats["algbw_mbps"], busbw_mbps=floats["busbw_mbps"],
                   wrong=None if wrong is None else _json_int(where, "wrong", wrong, 0),
                   late_starts=_json_int(where, "late_starts", data.get("late_starts", 0), 0))


def _json_int(where: str, name: str, value: object, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FieldError(where, name, f"an integer >= {minimum}", value)
    return value


def _json_float(where: str, name: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= sys.float_info.max:
        raise FieldError(where, name, "a number >= 0", value)
    return float(value)


def exit_status(rows: Iterable[BenchRow]) -> int:
    """1 when any row has wrong data, else 0: a row whose data was not checked is not wrong, but the run's
    trust says it is unchecked (:func:`data_check`)."""
    return EXIT_WRONG if any(row.wrong for row in rows) else EXIT_OK


def data_check(wrong: Iterable[int | None]) -> Trust:
    """The rows' data as a check of the run (``wrong`` per row): flagged ``wrong_data`` when a row had wrong
    elements, unchecked when a row was not checked (None), trusted when every row was checked and right."""
    counts = list(wrong)
    if any(n for n in counts):
        return Trust(flags=("wrong_data",))
    return Trust(unchecked=(trust.DATA,)) if any(n is None for n in counts) else Trust()


#: The columns: name, unit, width (nccl-tests' out-of-place half, without root; bandwidths in Mbit/s).
COLUMNS = (("size", "(B)", 12), ("count", "(elements)", 12), ("type", "", 8), ("redop", "", 6),
           ("time", "(us)", 10), ("algbw", "(Mbit/s)", 10), ("busbw", "(Mbit/s)", 10), ("#wrong", "", 6))


def _line(lead: str, cells: Sequence[str]) -> str:
    return lead + "".join(f" {cell:>{width}}" for cell, (_, _, width) in zip(cells, COLUMNS, strict=True))


def column_header() -> list[str]:
    return [_line("#", [name for name, _, _ in COLUMNS]), _line("#", [unit for _, unit, _ in COLUMNS]).rstrip()]


def format_time_us(time_s: float) -> str:
    """nccl-tests' precision: two decimals below 100 us, one below 10 ms, none above."""
    us = time_s * 1e6
    if us >= 10000:
        return f"{us:.0f}"
    if us >= 100:
        return f"{us:.1f}"
    return f"{us:.2f}"


def format_row(row: BenchRow, dtype: str, op: str) -> str:
    wrong = "N/A" if row.wrong is None else str(row.wrong)
    return _line(" ", [str(row.size), str(row.count), dtype, op, format_time_us(row.time_s),
                       f"{row.algbw_mbps:.2f}", f"{row.busbw_mbps:.2f}", wrong])


def parse_row(line: str) -> tuple[int, int, str, str, float, float, float, int | None]:
    """A printed row back: size, count, type, redop, time (us), algbw, busbw (Mbit/s), #wrong (None for N/A)."""
    cells = line.split()
    if len(cells) != len(COLUMNS) or line.startswith("#"):
        raise ValueError(f"not a row: {line!r}")
    return (int(cells[0]), int(cells[1]), cells[2], cells[3], float(cells[4]), float(cells[5]), float(cells[6]),
            None if cells[7] == "N/A" else int(cells[7]))


# ---------------------------------------------------------------------------
# The algorithm check and the header
# ---------------------------------------------------------------------------

def algorithm_check(algo: str, read: Mapping[str, int | None]) -> tuple[bool | None, str]:
    """Whether Open MPI's control variables (read through MPI_T; None: not readable) hold what was set.

    Returns (True, note) when they do, (False, warning) when not, (None, note) when they cannot tell
    or ``algo`` is ``default`` (nothing was set).
    """
    number = ALGORITHMS[algo]
    algorithm, dynamic = read.get(CVAR_ALGORITHM), read.get(CVAR_DYNAMIC_RULES)
    if algorithm is None or dynamic is None:
        return None, f"MPI_T cannot read {CVAR_ALGORITHM} and {CVAR_DYNAMIC_RULES} (not checked)"
    reads = f"MPI_T reads {CVAR_ALGORITHM}={algorithm}, {CVAR_DYNAMIC_RULES}={dynamic}"
    if number is None:
        return None, reads
    if algorithm != number or not dynamic:
        return False, f"{reads}, not {number} and 1: the rows may not be {algo}"
    if algo == "segmented_ring" and read.get(CVAR_SEGMENT_SIZE) == 0:
        reads += f"; {CVAR_SEGMENT_SIZE}=0, so Open MPI runs it as ring"
    return True, reads


def library_name(version: str) -> str:
    """The first line of ``MPI_Get_library_version``'s text (Open MPI ends it with a NUL)."""
    lines = version.replace("\x00", "").strip().splitlines()
    return lines[0].strip() if lines else "unknown"


#: What a row's time is, per :data:`START_MODES`.
TIME_MEANING = {
    "window": "mean over the timed iterations of the slowest rank's time from the iteration's shared start to its end",
    "barrier": "mean per iteration of the timed iterations, the maximum over ranks",
}


def late_line(size: int, late: int, iters: int, worst_s: float) -> str:
    """The warning rank 0 prints before a row whose windows were too short for some iterations."""
    return (f"# WARNING: size {size}: {late} of {iters} iteration starts were late (by up to {worst_s * 1e3:.1f} ms): "
            "an iteration ran past its window, so the next did not start with the others")


def header_lines(opts: Options, p: int, library: str, check_note: str, verified: bool | None,
                 hosts: Sequence[Mapping[str, Any]]) -> list[str]:
    number = opts.algorithm_id
    if number is None:
        chosen = "default (Open MPI's own decision; this program set nothing)"
    else:
        chosen = (f"{opts.algo} (coll_tuned_allreduce_algorithm={number}, coll_tuned_use_dynamic_rules=1, "
                  "set in the environment before MPI_Init)")
    lines = [f"# {PROG} {__version__}: MPI_Allreduce, out of place, {p} ranks",
             f"# MPI library: {library_name(library)}",
             f"# algorithm: {chosen}",
             f"# {'WARNING: ' if verified is False else ''}{check_note}",
             f"# dtype {opts.dtype}, op {opts.op}, iters {opts.iters}, warmup {opts.warmup}, "
             f"check {'on' if opts.check else 'off'}, start {opts.start}",
             f"# time: {TIME_MEANING[opts.start]}; "
             "algbw = size*8/time, busbw = algbw*2(p-1)/p, both in Mbit/s"]
    for host in hosts:
        addresses = ", ".join(host.get("addresses", [])) or "no address but loopback"
        lines.append(f"#  rank {host['rank']:>4} on {host['processor_name']} ({addresses})")
    return lines + column_header()


# ---------------------------------------------------------------------------
# The JSON document
# ---------------------------------------------------------------------------

def document(opts: Options, p: int, library: str, cvars: Mapping[str, int | None], verified: bool | None,
             hosts: Sequence[Mapping[str, Any]], rows: Sequence[BenchRow]) -> dict[str, Any]:
    """The ``--json`` document; :func:`load_rows` reads its rows back.

    ``program``, ``format_version`` (1), ``version``; ``algorithm`` (a name of :data:`ALGORITHMS`),
    ``ompi_algorithm_id`` (None for default), ``environment`` (what the program set), ``mpi_t`` (the
    control variables read back, None where unreadable) and ``algorithm_verified`` (:func:`algorithm_check`);
    ``mpi_library``; ``ranks`` and ``hosts`` (per rank: ``rank``, ``processor_name``, ``pid``, ``addresses``);
    ``dtype``, ``op``, ``iters``, ``warmup``, ``check``, ``start`` (:data:`START_MODES`), ``time`` (what a row's
    time is); ``rows`` (:meth:`BenchRow.to_json`).
    """
    return {
        "program": PROG,
        "format_version": FORMAT_VERSION,
        "version": __version__,
        "collective": ALLREDUCE,
        "algorithm": opts.algo,
        "ompi_algorithm_id": opts.algorithm_id,
        "environment": algorithm_environment(opts.algo),
        "mpi_t": dict(cvars),
        "algorithm_verified": verified,
        "mpi_library": library.replace("\x00", "").strip(),
        "ranks": p,
        "hosts": [dict(host) for host in hosts],
        "dtype": opts.dtype,
        "op": opts.op,
        "iters": opts.iters,
        "warmup": opts.warmup,
        "check": opts.check,
        "start": opts.start,
        "time": TIME_MEANING[opts.start],
        "rows": [row.to_json() for row in rows],
    }


def rows_from_document(data: object, where: str = PROG) -> list[BenchRow]:
    if not isinstance(data, dict):
        raise FieldError(where, "document", "a JSON object", type(data).__name__)
    if data.get("program") != PROG:
        raise FieldError(where, "program", repr(PROG), data.get("program", MISSING))
    if data.get("format_version") != FORMAT_VERSION:
        raise FieldError(where, "format_version", str(FORMAT_VERSION), data.get("format_version", MISSING))
    rows = data.get("rows", MISSING)
    if not isinstance(rows, list):
        raise FieldError(where, "rows", "a list", rows)
    return [BenchRow.from_json(row, f"{where}: rows[{i}]") for i, row in enumerate(rows)]


def load_rows(path: str) -> list[BenchRow]:
    """The rows of a ``--json`` file; :class:`UserError` naming the file when it is missing or not one."""
    data = read_json(path)
    if data is None:
        raise UserError(f"{printable(path)}: cannot read it as JSON")
    return rows_from_document(data, path)
