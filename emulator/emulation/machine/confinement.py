"""Confinement: the memory limit a run's processes start under, and how running out of it is told.

Every agent and every process of an MPI run (mpirun, the launch agent,
orted, the ranks) starts under ``RLIMIT_DATA`` sized from the admission
estimate (:func:`emulator.runs.admission.agent_limit_bytes`,
:func:`emulator.runs.admission.mpi_rank_limit_bytes`). Since Linux 4.7 that limit
counts private writable mappings (the heap, numpy's arrays, thread stacks),
not ``PROT_NONE`` reservations or shared libraries as ``RLIMIT_AS`` does, and
it works the same under cgroup v1 (this machine) and v2 (the Vagrant VM). A
runaway then fails the allocation in its own process -- ``MemoryError``,
``ENOMEM``, "can't start new thread" -- and its run fails with one line,
instead of the kernel's out-of-memory killer picking a victim.

This module owns setting and reading the limit (:func:`limit_data`,
:func:`data_limit`), recognising an exception of running out
(:func:`is_out_of_memory`), the agent's exit status and log line for it
(:data:`OUT_OF_MEMORY_STATUS`, :func:`agent_out_of_memory_line`), the
fleet's message (:func:`agent_ran_out`), and recognising an MPI rank's
output that ran out (:func:`memory_failure_in`, :func:`mpi_rank_ran_out`).
"""

from __future__ import annotations

import errno
import resource
from collections.abc import Iterable

from emulator.runs.admission import format_bytes

#: An agent's exit status when it ran out of its memory limit (ENOMEM's number): the fleet names the limit.
OUT_OF_MEMORY_STATUS = errno.ENOMEM
#: What a process's stderr holds when an allocation of it was refused: Python's MemoryError, strerror(ENOMEM),
#: C++'s std::bad_alloc, a thread that could not get its stack.
OUT_OF_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "can't start new thread")


def limit_data(limit_bytes: int) -> None:
    """This process, and every process it starts from now on, may map at most ``limit_bytes`` of data."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))


def data_limit() -> int | None:
    """This process's ``RLIMIT_DATA`` (soft), or None when it has none."""
    soft, _ = resource.getrlimit(resource.RLIMIT_DATA)
    return None if soft == resource.RLIM_INFINITY else soft


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from, is an allocation refused: ``MemoryError``, an
    ``OSError`` ``ENOMEM``, a thread that could not start."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno == errno.ENOMEM):
            return True
        if isinstance(e, RuntimeError) and "can't start new thread" in str(e):
            return True
        todo += [e.__cause__, e.__context__]
    return False


def describe_limit(limit_bytes: int | None) -> str:
    return "no limit" if limit_bytes is None else format_bytes(limit_bytes)


def agent_out_of_memory_line(rank: int, limit_bytes: int | None, buffers_bytes: int | None) -> str:
    """The one line an agent that ran out logs: its limit and what the admission estimated for its buffers."""
    estimate = (f", sized from the admission estimate of its buffers {format_bytes(buffers_bytes)}"
                if buffers_bytes is not None else "")
    if limit_bytes is None:
        return f"agent: out of memory: rank {rank} had no memory limit: the machine itself ran out"
    return (f"agent: out of memory: rank {rank} reached its memory limit {format_bytes(limit_bytes)} "
            f"(RLIMIT_DATA{estimate})")


def agent_ran_out(rank: int, limit_bytes: int | None, before: str) -> str:
    """The fleet's message for an agent that ran out of its memory limit before message ``before``."""
    return (f"rank {rank}: agent ran out of its memory limit ({describe_limit(limit_bytes)}, from the admission "
            f"estimate) before '{before}'")


def memory_failure_in(text: str) -> str | None:
    """The first line of a process's output that says an allocation was refused, or None."""
    for line in text.splitlines():
        if any(marker in line for marker in OUT_OF_MEMORY_MARKERS):
            return line.strip()
    return None


def mpi_rank_ran_out(ranks_failed: Iterable[tuple[int, str]], limit_bytes: int | None) -> str | None:
    """``emu mpirun``'s one line for ranks whose output (``(rank, line)`` pairs) says they ran out, or None."""
    failed = sorted(ranks_failed)
    if not failed:
        return None
    rank, line = failed[0]
    more = f" (and {len(failed) - 1} more rank{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
    return (f"mpirun: rank {rank}{more} ran out of its memory limit {describe_limit(limit_bytes)} (RLIMIT_DATA, "
            f"from the admission estimate): {line!r} in ranks/rank-{rank}.stderr")
