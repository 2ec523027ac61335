"""Data hazards inside one rank: which operations must wait for which.

A host agent runs a rank's operations concurrently, each as soon as its
dependencies have completed. That is only deterministic if every pair of
operations that touch the same chunk of the same buffer is ordered, except two
*accumulations* (``recv_reduce`` and ``reduce`` into the same chunk), which
commute as long as the agent applies each one atomically.

Access modes: ``R`` read, ``W`` overwrite, ``A`` accumulate.

=============  =================================  ==========================
kind           target ``buffer[chunk..]``          ``src[src_chunk..]``
=============  =================================  ==========================
send           R                                  --
recv           W                                  --
recv_reduce    A                                  --
reduce         A                                  R
copy           W                                  R
compute        --                                 --
=============  =================================  ==========================

:func:`hazard_errors` reports every later operation that conflicts with an
earlier one (in list order) without depending on it, directly or through other
dependencies. :func:`derive_deps` computes the smallest such dependency lists,
which is how the generators and importers fill in ``deps``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from emulator.model.schedule.format import COMPUTE, COPY, RECV, RECV_REDUCE, REDUCE, SEND, Op, RankProgram

READ, WRITE, ACC = "R", "W", "A"


_TARGET_MODE = {SEND: READ, RECV: WRITE, RECV_REDUCE: ACC, REDUCE: ACC, COPY: WRITE}


def accesses(op: Op) -> list[tuple[str, int, str]]:
    """``(buffer, chunk, mode)`` for every chunk ``op`` touches.

    Works on anything with the attributes of :class:`Op` (kind, buffer, chunk,
    nchunks, src, src_chunk).
    """
    if op.kind == COMPUTE:
        return []
    target = _TARGET_MODE[op.kind]
    buf = op.buffer
    out = [(buf, c, target) for c in range(op.chunk, op.chunk + op.nchunks)]
    if op.kind in (REDUCE, COPY):
        src, src_chunk = op.source
        out += [(src, c, READ) for c in range(src_chunk, src_chunk + op.nchunks)]
    return out


class _Tracker:
    """Per chunk: the last overwrite, and the reads and accumulations since."""

    def __init__(self) -> None:
        self.last_write: dict[tuple[str, int], int] = {}
        self.reads: dict[tuple[str, int], list[int]] = {}
        self.accs: dict[tuple[str, int], list[int]] = {}

    def required(self, acc: list[tuple[str, int, str]]) -> dict[int, tuple[str, int]]:
        """Earlier op index -> the (buffer, chunk) it conflicts on, for an op with accesses ``acc``."""
        need: dict[int, tuple[str, int]] = {}
        for buf, c, mode in acc:
            key = (buf, c)
            if key in self.last_write:
                need.setdefault(self.last_write[key], key)
            if mode in (READ, WRITE):
                for i in self.accs.get(key, ()):
                    need.setdefault(i, key)
            if mode in (WRITE, ACC):
                for i in self.reads.get(key, ()):
                    need.setdefault(i, key)
        return need

    def record(self, index: int, acc: list[tuple[str, int, str]]) -> None:
        for buf, c, mode in acc:
            key = (buf, c)
            if mode == WRITE:
                self.last_write[key] = index
                self.reads.pop(key, None)
                self.accs.pop(key, None)
            elif mode == READ:
                self.reads.setdefault(key, []).append(index)
            else:
                self.accs.setdefault(key, []).append(index)


def ancestors(ops: Sequence[Op]) -> list[int]:
    """Bitsets (as ints, bit = list index) of every op's transitive dependencies."""
    index = {op.id: i for i, op in enumerate(ops)}
    anc: list[int] = []
    for op in ops:
        bits = 0
        for d in op.deps:
            j = index[d]
            bits |= anc[j] | (1 << j)
        anc.append(bits)
    return anc


def hazard_errors(program: RankProgram, limit: int = 10) -> list[str]:
    """One message per unordered conflicting pair of operations (at most ``limit``)."""
    ops = program.ops
    anc = ancestors(ops)
    tracker = _Tracker()
    errors: list[str] = []
    for i, op in enumerate(ops):
        acc = accesses(op)
        for j, (buf, c) in sorted(tracker.required(acc).items()):
            if not anc[i] >> j & 1:
                other = ops[j]
                errors.append(f"rank {program.rank}: {op.describe()} and {other.describe()} both touch chunk {c} "
                              f"of {buf} but {op.id} does not depend on {other.id} (a data race)")
                if len(errors) >= limit:
                    return errors
        tracker.record(i, acc)
    return errors


def derive_dep_indices(ops: Sequence[object], extra: Iterable[Iterable[int]] | None = None) -> list[list[int]]:
    """Per op, the fewest list indices of earlier ops that order every conflict (see :func:`derive_deps`)."""
    extras = list(extra) if extra is not None else [()] * len(ops)
    tracker = _Tracker()
    anc: list[int] = []
    out: list[list[int]] = []
    for i, op in enumerate(ops):
        acc = accesses(op)  # type: ignore[arg-type]
        need = set(tracker.required(acc))
        need.update(extras[i])
        deps: list[int] = []
        covered = 0
        for j in sorted(need, reverse=True):
            if not covered >> j & 1:
                deps.append(j)
                covered |= anc[j] | (1 << j)
        anc.append(covered)
        tracker.record(i, acc)
        out.append(sorted(deps))
    return out


def derive_deps(ops: Sequence[Op], extra: Iterable[Iterable[int]] | None = None) -> list[Op]:
    """``ops`` with ``deps`` set to the fewest earlier op ids that order every conflict.

    ``extra`` gives, per op, list indices of further required predecessors
    (e.g. program order imported from another format); existing ``deps`` are
    replaced.
    """
    return [replace(op, deps=tuple(ops[j].id for j in idx)) for op, idx in zip(ops, derive_dep_indices(ops, extra),
                                                                                strict=True)]
