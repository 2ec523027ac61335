"""Helpers that read replay results in the integration tests."""

from __future__ import annotations

import statistics

from emulator.runs.results import CellResults


def step_time(results: CellResults, steps) -> float:
    """Sum over ``steps`` of the median (over repetitions) step time."""
    per_step: dict[int, list[float]] = {}
    for rep in results.repetitions:
        for st in rep.steps:
            per_step.setdefault(st.step, []).append(st.time_s)
    return sum(statistics.median(per_step[s]) for s in steps)
