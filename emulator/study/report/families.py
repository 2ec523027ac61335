"""The report's families: scaling efficiency of every family against its host count, collectives and training
iterations apart.

Pure: numbers from replay rows (:mod:`emulator.study.report.rows`). It owns
scaling efficiency (busbw / link goodput) per family and host count for the
rows busbw describes (:func:`scaling_families`), and the training
iterations' scaling efficiency (compute-only / iteration time) per family and
host count (:func:`training_families`), with its interval between two
families (:func:`efficiency_interval`). ECMP seeds fold by their median.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from emulator.base import stats
from emulator.study.report.rows import CellRow, busbw_rows, training_rows
from emulator.study.report.speedups import RESAMPLES, median, ratio


class ScalingKey(NamedTuple):
    """A family measured at several host counts: kind, routing, algorithm (with placement and, unless
    allreduce, the collective: :attr:`CellRow.op_label`) and size."""

    kind: str
    routing: str
    algorithm: str
    size: int


@dataclass(frozen=True)
class ScalingPoint:
    """A family at one host count: median efficiency (busbw / link goodput), the model's, and median busbw."""

    efficiency: float | None
    model_efficiency: float | None
    busbw: float | None


def scaling_families(rows: list[CellRow]) -> dict[ScalingKey, dict[int, ScalingPoint]]:
    """Per family measured at two or more host counts: hosts -> its point (ECMP seeds folded by median).

    Training rows are left out (:func:`busbw_rows`; :func:`training_families` has theirs).
    """
    acc: dict[ScalingKey, dict[int, list[CellRow]]] = {}
    for r in busbw_rows(rows):
        acc.setdefault(ScalingKey(r.kind, r.routing, r.op_label, r.size), {}).setdefault(r.hosts, []).append(r)
    out = {}
    for key, by_hosts in acc.items():
        if len(by_hosts) < 2:
            continue
        out[key] = {hosts: ScalingPoint(efficiency=median(c.busbw_mbps / c.capacity_mbps for c in cells
                                                          if c.busbw_mbps),
                                        model_efficiency=median(c.predicted_busbw_mbps / c.capacity_mbps
                                                                for c in cells if c.predicted_busbw_mbps),
                                        busbw=median(c.busbw_mbps for c in cells))
                    for hosts, cells in sorted(by_hosts.items())}
    return out


class TrainingKey(NamedTuple):
    """A family of training cells: kind, routing, algorithm (with placement) and workload without its scale
    (``resnet50-b32``: an experiment may shrink the iteration by a different scale at each host count, an
    emulation setting like the link rate, so the family's line goes on through them)."""

    kind: str
    routing: str
    algorithm: str
    workload: str

    @property
    def label(self) -> str:
        """``bigraph bigraph hdrm resnet50-b32``."""
        return f"{self.kind} {self.routing} {self.algorithm} {self.workload}"


@dataclass(frozen=True)
class TrainingPoint:
    """A training family at one host count (ECMP seeds folded by their median), emulated seconds.

    ``efficiency`` is the median over cells of each cell's median scaling efficiency (compute-only / iteration
    time) over its measured repetitions; ``efficiency_range`` the lowest and highest repetition's over every
    cell; the model's are the timing model's (``schedule check``) on the same routes.
    """

    efficiency: float | None
    efficiency_range: tuple[float, float] | None
    model_efficiency: float | None
    iteration_s: float | None
    model_iteration_s: float | None
    compute_only_s: float | None
    cells: list[CellRow]

    @property
    def scales(self) -> list[float]:
        """The workload scales of the cells (one, unless cells of the same host count ran at several)."""
        return sorted({c.workload_scale for c in self.cells})

    @property
    def measured_over_model(self) -> float | None:
        """Measured over the model's iteration time."""
        return ratio(self.iteration_s, self.model_iteration_s)


def training_key(row: CellRow) -> TrainingKey:
    return TrainingKey(row.kind, row.routing, row.algorithm_label, row.workload_model)


def training_families(rows: list[CellRow]) -> dict[TrainingKey, dict[int, TrainingPoint]]:
    """Every family of training cells (:func:`training_rows`), also one measured at a single host count:
    hosts -> its :class:`TrainingPoint`, host counts in increasing order."""
    acc: dict[TrainingKey, dict[int, list[CellRow]]] = {}
    for r in training_rows(rows):
        acc.setdefault(training_key(r), {}).setdefault(r.hosts, []).append(r)
    out = {}
    for key, by_hosts in sorted(acc.items()):
        points = {}
        for hosts, cells in sorted(by_hosts.items()):
            reps = [e for c in cells for e in c.rep_efficiency]
            points[hosts] = TrainingPoint(
                efficiency=median(c.scaling_efficiency for c in cells),
                efficiency_range=(min(reps), max(reps)) if reps else None,
                model_efficiency=median(c.predicted_scaling_efficiency for c in cells),
                iteration_s=median(c.iteration_s for c in cells),
                model_iteration_s=median(c.predicted_time_s for c in cells),
                compute_only_s=median(c.compute_only_s for c in cells), cells=cells)
        out[key] = points
    return out


def efficiency_interval(num: list[CellRow], den: list[CellRow]) -> stats.Interval | None:
    """The bootstrap interval of median(num) / median(den) scaling efficiency, a group per cell (as
    :func:`speedup_interval`); None when a side has no measured repetition."""
    n = [r.rep_efficiency for r in num if r.rep_efficiency]
    d = [r.rep_efficiency for r in den if r.rep_efficiency]
    if not n or not d:
        return None
    return stats.ratio_interval(n, d, resamples=RESAMPLES)
