"""Helpers that read replay results in the integration tests."""

from __future__ import annotations

import statistics

from emulator.runs.results import CellResults
from emulator.runs.trust import REPLAY_BAND


def step_time(results: CellResults, steps) -> float:
    """Sum over ``steps`` of the median (over repetitions) step time."""
    per_step: dict[int, list[float]] = {}
    for rep in results.repetitions:
        for st in rep.steps:
            per_step.setdefault(st.step, []).append(st.time_s)
    return sum(statistics.median(per_step[s]) for s in steps)


#: The accuracy docs/fidelity.md states for a replay's measured/predicted time (``make bench``'s rows, ±10 %): the
#: band a report flags ``model_disagrees`` outside of, defined once in emulator.runs.trust.
BENCH_ACCURACY = REPLAY_BAND.accuracy


def band(noise: float, accuracy: float = BENCH_ACCURACY) -> tuple[float, float]:
    """Where a measured/predicted ratio must fall: the documented ``accuracy`` widened by the ``noise`` (the spread of
    the ratio over repeated runs on this machine; both written per check in docs/testing-accuracy.md)."""
    return 1 - accuracy - noise, 1 + accuracy + noise
