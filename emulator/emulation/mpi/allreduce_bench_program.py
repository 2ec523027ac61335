"""The MPI program of ``emu-allreduce-bench`` (the console script); its logic is :mod:`emulator.runs.allreduce_bench`.

Run it under mpirun; on one machine over loopback only::

    mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl self,tcp \\
        --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \\
        .venv/bin/emu-allreduce-bench --algo ring --sizes 4KiB,256KiB --iters 3 --warmup 1

The arguments are checked before ``MPI_Init`` (a bad one is one line from
rank 0, exit status 2). Then the algorithm's ``OMPI_MCA_*`` variables go into
this process's environment, :mod:`mpi4py` is imported with
``mpi4py.rc.initialize = False`` and MPI is initialised by hand, so that Open
MPI reads them. MPI_T (called through ctypes: mpi4py 3 has no binding) reads
the control variables back to check that they took effect. This is the only
module that imports mpi4py (an import-linter contract in ``setup.cfg``).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np
import psutil

from emulator.base.errors import UserError, printable
from emulator.base.files import write_json_atomic
from emulator.runs import allreduce_bench as bench

#: How long a rank other than 0 waits before exiting on a bad argument (rank 0 says why; its line was lost
#: when mpirun aborted the job on another rank's exit first).
USAGE_EXIT_DELAY_S = 1.0
#: Bytes per value read through MPI_T: the variables read here are ints, the room is against surprises.
_CVAR_ROOM = 256


def main(argv: Sequence[str] | None = None) -> int:
    first = bench.rank_before_init(os.environ) in (None, 0)
    try:
        opts = bench.parse_args(argv)
        if first and opts.json_path is not None:  # rank 0 writes it
            bench.check_json_path(opts.json_path)
    except UserError as exc:
        if first:  # one line, not one per rank
            print(exc, file=sys.stderr, flush=True)
        else:
            # mpirun ends the job when the first rank exits non-zero: give rank 0's line time to reach it
            time.sleep(USAGE_EXIT_DELAY_S)
        return bench.EXIT_USAGE
    os.environ.update(bench.algorithm_environment(opts.algo))
    try:
        import mpi4py
    except ImportError:
        print(f"{bench.PROG}: mpi4py is not installed (Debian: apt-get install python3-mpi4py)", file=sys.stderr)
        return bench.EXIT_USAGE
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    MPI.Init()
    try:
        status = _run(MPI, opts)
    except UserError as exc:  # the same on every rank (the number of ranks), or rank 0's --json path
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(exc, file=sys.stderr)
        status = bench.EXIT_USAGE
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(bench.EXIT_FAILED)  # the other ranks would wait in a collective for ever
        status = bench.EXIT_FAILED  # not reached: Abort ends the job
    MPI.Finalize()
    return status


def _run(MPI: Any, opts: bench.Options) -> int:
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    bench.check_ranks(p, opts.dtype)
    library = MPI.Get_library_version()
    cvars = read_control_variables(MPI, (bench.CVAR_ALGORITHM, bench.CVAR_DYNAMIC_RULES, bench.CVAR_SEGMENT_SIZE))
    verified, note = bench.algorithm_check(opts.algo, cvars)
    checks = comm.gather((verified, note), root=0)
    hosts = comm.gather({"rank": rank, "processor_name": MPI.Get_processor_name(), "pid": os.getpid(),
                         "addresses": addresses()}, root=0)
    if rank == 0:
        verified, note = _all_ranks(checks)
        for line in bench.header_lines(opts, p, library, note, verified, hosts):
            print(line)
        sys.stdout.flush()
    rows = []
    for size in opts.sizes:
        row = measure(MPI, comm, opts, size)
        rows.append(row)
        if rank == 0:
            print(bench.format_row(row, opts.dtype, opts.op), flush=True)
    if rank == 0 and opts.json_path is not None:
        doc = bench.document(opts, p, library, cvars, verified, hosts, rows)
        try:
            write_json_atomic(opts.json_path, doc)
        except OSError as exc:
            raise UserError(f"{bench.PROG}: field 'json': cannot write {printable(opts.json_path)}: "
                            f"{exc.strerror or exc}") from None
    return bench.exit_status(rows)


def _all_ranks(checks: list[tuple[bool | None, str]]) -> tuple[bool | None, str]:
    """Rank 0's check, unless another rank's failed (the environment reaches each rank on its own)."""
    for rank, (verified, note) in enumerate(checks):
        if verified is False:
            return False, note if rank == 0 else f"rank {rank}: {note}"
    return checks[0]


def measure(MPI: Any, comm: Any, opts: bench.Options, size: int) -> bench.BenchRow:
    """One size: the untimed iterations, then ``iters`` timed out-of-place allreduces; checked after both."""
    rank, p = comm.Get_rank(), comm.Get_size()
    count = size // opts.itemsize
    send = bench.pattern(rank, count, opts.dtype)
    recv = np.empty_like(send)
    want = bench.expected(p, count, opts.dtype) if opts.check else None
    wrong = np.zeros(count, dtype=bool)
    op = {"sum": MPI.SUM}[opts.op]
    recv.fill(bench.SENTINEL)
    slowest = 0.0
    for _ in range(opts.sizing_iterations):
        began = time.time()
        comm.Allreduce(send, recv, op=op)
        slowest = max(slowest, time.time() - began)
    if want is not None and opts.sizing_iterations:
        wrong |= bench.wrong_mask(recv, want)
    recv.fill(bench.SENTINEL)
    if opts.start == "window":
        time_s, late = timed_in_windows(MPI, comm, send, recv, op, opts, comm.allreduce(slowest, op=MPI.MAX), size)
    else:
        time_s, late = timed_after_barrier(MPI, comm, send, recv, op, opts), 0
    if want is None:
        return bench.BenchRow.measured(size, count, time_s, p, None, late)
    wrong |= bench.wrong_mask(recv, want)
    total = comm.allreduce(int(np.count_nonzero(wrong)), op=MPI.SUM)
    return bench.BenchRow.measured(size, count, time_s, p, total, late)


def timed_after_barrier(MPI: Any, comm: Any, send: Any, recv: Any, op: Any, opts: bench.Options) -> float:
    """The timed iterations back to back after one barrier: the mean per iteration, the slowest rank's."""
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(opts.iters):
        comm.Allreduce(send, recv, op=op)
    elapsed = MPI.Wtime() - start
    comm.Barrier()
    return float(comm.allreduce(bench.time_per_iteration(elapsed, opts.iters), op=MPI.MAX))


def timed_in_windows(MPI: Any, comm: Any, send: Any, recv: Any, op: Any, opts: bench.Options, slowest_s: float,
                     size: int) -> tuple[float, int]:
    """Each timed iteration from a start shared by every rank (:func:`bench.window_starts`): its time and how many
    iterations some rank began late. Rank 0 names the first start one window ahead: the broadcast that tells
    the others takes less than an allreduce did."""
    window = bench.window_seconds(slowest_s)
    first = comm.bcast(time.time() + window if comm.Get_rank() == 0 else None, root=0)
    took = np.zeros(opts.iters)
    late = np.zeros(opts.iters)
    for i, start in enumerate(bench.window_starts(first, window, opts.iters)):
        wait = start - time.time()
        if wait > 0:
            time.sleep(wait)
        late[i] = max(0.0, time.time() - start)
        comm.Allreduce(send, recv, op=op)
        took[i] = time.time() - start
    slowest = np.empty_like(took)
    worst_late = np.empty_like(late)
    comm.Allreduce(took, slowest, op=MPI.MAX)
    comm.Allreduce(late, worst_late, op=MPI.MAX)
    late_starts = sum(1 for x in worst_late if bench.is_late(float(x), window))
    if late_starts and comm.Get_rank() == 0:
        print(bench.late_line(size, late_starts, opts.iters, float(worst_late.max())), flush=True)
    return bench.windowed_time(list(slowest)), late_starts


def addresses() -> list[str]:
    """This host's IPv4 addresses but loopback and link-local (in Mininet, the host's own)."""
    found = {addr.address for nics in psutil.net_if_addrs().values() for addr in nics
             if addr.family == socket.AF_INET and not addr.address.startswith(("127.", "169.254."))}
    return sorted(found)


def read_control_variables(MPI: Any, names: Sequence[str]) -> dict[str, int | None]:
    """Open MPI's integer control variables ``names`` through MPI_T; None for one it cannot read."""
    out: dict[str, int | None] = dict.fromkeys(names)
    try:
        lib = ctypes.CDLL(None)  # mpi4py loads libmpi with RTLD_GLOBAL
        init, finalize = lib.MPI_T_init_thread, lib.MPI_T_finalize
    except (OSError, AttributeError):
        return out
    provided = ctypes.c_int()
    if init(MPI.THREAD_SINGLE, ctypes.byref(provided)) != 0:
        return out
    try:
        for name in names:
            out[name] = _read_int(lib, name)
    finally:
        finalize()
    return out


def _read_int(lib: ctypes.CDLL, name: str) -> int | None:
    index, count, handle = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
    if lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)) != 0:
        return None
    if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
        return None
    try:
        if count.value != 1:
            return None
        buf = ctypes.create_string_buffer(_CVAR_ROOM)
        if lib.MPI_T_cvar_read(handle, buf) != 0:
            return None
        return ctypes.c_int.from_buffer(buf).value
    finally:
        lib.MPI_T_cvar_handle_free(ctypes.byref(handle))


if __name__ == "__main__":
    sys.exit(main())
