"""Crossovers: the size below which an algorithm beats ring, as the bench's replay rows show it and as the
latency model predicts it over :data:`~emulator.selfcheck.bench.cases.MODEL_SWEEP` (pure: no network)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from emulator.model import topology
from emulator.model.collectives import generators
from emulator.model.latency import LatencyModel
from emulator.model.prediction.check import check
from emulator.selfcheck.bench.cases import MODEL_SWEEP, TARGET_CROSSOVER_FACTOR, Crossover
from emulator.selfcheck.bench.rows import ReplayRow


@dataclass(frozen=True)
class CrossoverCurve:
    """``t_x / t_ring`` at ``sizes`` and where it crosses 1 going up (``size``, interpolated).

    ``size`` is None when it does not cross within ``sizes``; ``x_faster`` then says whether ``x`` was faster
    throughout (and is None when there is a crossing).
    """

    size: float | None
    ratios: tuple[float, ...]
    sizes: tuple[int, ...]
    x_faster: bool | None

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "ratios": list(self.ratios), "sizes": list(self.sizes), "x_faster": self.x_faster}


def crossover(sizes: Sequence[int], times_x: Sequence[float], times_ring: Sequence[float]) -> CrossoverCurve:
    """Where ``x`` stops beating ring: the first size at which ``t_x / t_ring`` crosses 1 going up.

    Interpolated linearly in log(size) and log(ratio) between the two sizes around the crossing.
    """
    ratios = tuple(tx / tr for tx, tr in zip(times_x, times_ring, strict=True))
    for (s0, r0), (s1, r1) in itertools.pairwise(zip(sizes, ratios, strict=True)):
        if r0 < 1 <= r1:
            f = -math.log(r0) / (math.log(r1) - math.log(r0))
            return CrossoverCurve(math.exp(math.log(s0) + f * (math.log(s1) - math.log(s0))), ratios, tuple(sizes),
                                  None)
    return CrossoverCurve(None, ratios, tuple(sizes), all(r < 1 for r in ratios))


def crossovers_agree(measured: CrossoverCurve, predicted: CrossoverCurve,
                     factor: float = TARGET_CROSSOVER_FACTOR) -> bool:
    """Both find the crossover within ``factor`` of each other, or neither finds one and they agree who wins."""
    if measured.size is None or predicted.size is None:
        return measured.size is None and predicted.size is None and measured.x_faster == predicted.x_faster
    return 1 / factor <= measured.size / predicted.size <= factor


def model_crossover(c: Crossover, link_mbps: float, model: LatencyModel, mtu: int,
                    sizes: tuple[int, ...] = MODEL_SWEEP) -> CrossoverCurve:
    """The crossover the model predicts, from its times at ``sizes`` (no network)."""
    topo = topology.build(c.case.topology, link_mbps)
    times = {algo: [check(generators.generate(algo, topo, n), topo, c.case.routing, seed=c.case.seed, latency=model,
                          mtu=mtu).predicted_time_s for n in sizes] for algo in (c.algorithm, "ring")}
    return crossover(sizes, times[c.algorithm], times["ring"])


def measured_crossover(c: Crossover, rows: Sequence[ReplayRow]) -> CrossoverCurve | None:
    """The crossover the bench's rows show (None unless both algorithms ran at two sizes or more)."""
    def times(algo: str) -> dict[int, float]:
        return {r.size: r.time_s for r in rows if r.status == "ok" and r.time_s and r.same_run(c.case, algo)}

    x, ring = times(c.algorithm), times("ring")
    sizes = sorted(set(x) & set(ring))
    if len(sizes) < 2:
        return None
    return crossover(sizes, [x[n] for n in sizes], [ring[n] for n in sizes])


@dataclass(frozen=True)
class CrossoverRow:
    """One crossover of the bench: measured (None when the rows do not show it), predicted, and whether they agree."""

    label: str
    measured: CrossoverCurve | None
    predicted: CrossoverCurve
    agree: bool | None

    @classmethod
    def of(cls, c: Crossover, rows: Sequence[ReplayRow], link_mbps: float, model: LatencyModel,
           mtu: int) -> CrossoverRow:
        measured = measured_crossover(c, rows)
        predicted = model_crossover(c, link_mbps, model, mtu)
        return cls(c.label, measured, predicted, crossovers_agree(measured, predicted) if measured else None)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "measured": self.measured.to_json() if self.measured else None,
                "predicted": self.predicted.to_json(), "agree": self.agree}
