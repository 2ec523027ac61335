"""Uncertainty of a speedup: a hierarchical bootstrap interval for the ratio of two medians.

This module owns the statistics the report puts beside every speedup. A
measurement side (numerator or denominator) is a list of *groups*: one group
per ECMP seed (one network), each group the per-repetition values of that
cell. Repetitions of one cell share a network and its hashing, so they are
not independent of each other the way the seeds are; the bootstrap therefore
resamples on both levels, as the data was produced:

1. draw as many groups as there are, with replacement;
2. within every drawn group, draw as many repetitions as it has, with replacement;
3. pool the drawn values and take their median.

The ratio of the numerator's and the denominator's resampled medians, over
``resamples`` draws, gives the percentile interval. Pure and deterministic:
the same input and ``seed`` give the same interval (``numpy.random.default_rng``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Groups = Sequence[Sequence[float]]
DEFAULT_RESAMPLES = 10000


@dataclass(frozen=True)
class Interval:
    """A percentile interval ``[low, high]`` around ``point`` (the ratio of the plain, pooled medians)."""

    low: float
    high: float
    point: float
    level: float = 0.95
    resamples: int = 0

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high


def significant(interval: Interval) -> bool:
    """Whether the interval excludes 1 (the two sides differ at the interval's level)."""
    return not interval.contains(1.0)


def _check(groups: Groups, side: str, positive: bool) -> list[np.ndarray]:
    if not groups:
        raise ValueError(f"{side}: no groups")
    out = []
    for i, g in enumerate(groups):
        arr = np.asarray(g, dtype=float)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{side}: group {i} is empty")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{side}: group {i} has a value that is not finite")
        if positive and np.any(arr <= 0):
            raise ValueError(f"{side}: group {i} has a value <= 0 (a ratio needs a positive denominator)")
        out.append(arr)
    return out


CHUNK_VALUES = 1 << 21  # values drawn per batch of resamples (bounds the memory, ~16 MiB a batch)


def _resampled_medians(groups: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The median of every hierarchical resample, in batches that hold at most ``CHUNK_VALUES`` draws."""
    sizes = np.array([g.size for g in groups])
    width = int(sizes.max())
    table = np.full((len(groups), width), np.inf)  # +inf pads short groups; they sort to the end
    for i, g in enumerate(groups):
        table[i, :g.size] = g
    batch = max(1, CHUNK_VALUES // (len(groups) * width))
    return np.concatenate([_batch_medians(table, sizes, min(batch, resamples - start), rng)
                           for start in range(0, resamples, batch)])


def _batch_medians(table: np.ndarray, sizes: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``resamples`` hierarchical resamples of the padded ``table`` (vectorised)."""
    n_groups, width = table.shape
    chosen = rng.integers(0, n_groups, size=(resamples, n_groups))
    counts = sizes[chosen]                                            # (B, G) repetitions of each drawn group
    picks = np.floor(rng.random((resamples, n_groups, width)) * counts[..., None]).astype(np.int64)
    values = table[chosen[..., None], picks]                          # (B, G, width)
    values[np.arange(width)[None, None, :] >= counts[..., None]] = np.inf  # slots past a group's size
    pooled = np.sort(values.reshape(resamples, n_groups * width), axis=1)
    total = counts.sum(axis=1)                                        # pooled values per resample
    rows = np.arange(resamples)
    return (pooled[rows, (total - 1) // 2] + pooled[rows, total // 2]) / 2


def _pooled_median(groups: list[np.ndarray]) -> float:
    return float(np.median(np.concatenate(groups)))


def ratio_interval(numerator_groups: Groups, denominator_groups: Groups, *, resamples: int = DEFAULT_RESAMPLES,
                   seed: int = 0, level: float = 0.95) -> Interval:
    """Bootstrap ``level`` percentile interval of median(numerator) / median(denominator).

    Each side is a list of groups (one per ECMP seed), each group the
    per-repetition values of a cell. Raises ValueError for an empty side or
    group, values that are not finite, a denominator value <= 0, ``resamples``
    < 1 or ``level`` outside (0, 1). With a single value on each side the
    interval is the point.
    """
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    num = _check(numerator_groups, "numerator", positive=False)
    den = _check(denominator_groups, "denominator", positive=True)
    point = _pooled_median(num) / _pooled_median(den)
    if sum(g.size for g in num) == 1 and sum(g.size for g in den) == 1:
        return Interval(point, point, point, level, resamples)
    rng = np.random.default_rng(seed)
    ratios = _resampled_medians(num, resamples, rng) / _resampled_medians(den, resamples, rng)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return Interval(float(low), float(high), point, level, resamples)
