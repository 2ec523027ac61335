"""The hierarchical bootstrap interval of a ratio of medians (emulator.base.stats)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.base.stats import Interval, ratio_interval, significant


def test_well_separated_samples_give_an_interval_that_excludes_one_and_holds_the_point():
    fast = [[10.0, 10.3, 9.8, 10.1, 10.2]]
    slow = [[5.0, 5.2, 4.9, 5.1, 5.05]]
    iv = ratio_interval(fast, slow)
    assert iv.point == pytest.approx(statistics.median(fast[0]) / statistics.median(slow[0]))
    assert iv.low <= iv.point <= iv.high
    assert 1.8 < iv.low and iv.high < 2.2
    assert significant(iv)
    # the other way round: below 1, still significant
    assert significant(ratio_interval(slow, fast))


def test_identical_distributions_give_an_interval_that_contains_one():
    values = [[4.8, 5.1, 5.3, 4.9], [5.2, 5.0, 4.7, 5.4]]
    iv = ratio_interval(values, values)
    assert iv.point == 1.0 and iv.low < 1 < iv.high
    assert not significant(iv)


def test_overlapping_samples_are_not_significant():
    iv = ratio_interval([[5.0, 6.0, 5.5]], [[5.4, 5.8, 5.1]])
    assert iv.contains(1.0) and not significant(iv)


def test_variation_between_seeds_widens_the_interval():
    # five ECMP seeds whose cells differ (10, 11, ..., 14), four tight repetitions each
    groups = [[10.0 + g + 0.01 * k for k in range(4)] for g in range(5)]
    flat = [[v for g in groups for v in g]]
    den = [[2.0, 2.0, 2.0]]
    hier, pooled = ratio_interval(groups, den), ratio_interval(flat, den)
    assert hier.point == pooled.point
    assert hier.high - hier.low > 1.5 * (pooled.high - pooled.low)


def test_the_denominator_side_is_resampled_by_groups_too():
    num = [[2.0, 2.0]]
    spread = [[1.0 + g + 0.01 * k for k in range(4)] for g in range(5)]
    hier = ratio_interval(num, spread)
    flat = ratio_interval(num, [[v for g in spread for v in g]])
    assert hier.high - hier.low > 1.5 * (flat.high - flat.low)


def test_deterministic_for_a_seed_and_different_across_seeds():
    rng = np.random.default_rng(7)
    num, den = [list(rng.normal(5, 0.5, 9)), list(rng.normal(5.5, 0.5, 7))], [list(rng.normal(4, 0.4, 8))]
    a, b = ratio_interval(num, den, seed=3), ratio_interval(num, den, seed=3)
    assert a == b
    assert ratio_interval(num, den, seed=4) != a
    assert a.level == 0.95 and a.resamples == 10000


def test_the_level_sets_the_width():
    num, den = [[5.0, 5.5, 6.1, 5.2]], [[4.0, 4.4, 3.9, 4.8]]
    narrow, wide = ratio_interval(num, den, level=0.5), ratio_interval(num, den, level=0.99)
    assert wide.low <= narrow.low <= narrow.high <= wide.high
    assert (wide.high - wide.low) > (narrow.high - narrow.low)


def test_one_repetition_collapses_to_the_point():
    iv = ratio_interval([[6.0]], [[2.0]])
    assert iv == Interval(3.0, 3.0, 3.0, 0.95, 10000)
    assert significant(iv)
    assert not significant(ratio_interval([[2.0]], [[2.0]]))
    # constant groups: no variation to resample either
    iv = ratio_interval([[6.0, 6.0], [6.0]], [[3.0, 3.0]])
    assert (iv.low, iv.point, iv.high) == (2.0, 2.0, 2.0)


@pytest.mark.parametrize("num, den", [([], [[1.0]]), ([[1.0]], []), ([[1.0], []], [[1.0]]),
                                      ([[1.0]], [[0.0]]), ([[float("nan")]], [[1.0]]),
                                      ([[1.0]], [[float("inf")]])])
def test_bad_input_raises(num, den):
    with pytest.raises(ValueError):
        ratio_interval(num, den)


def test_bad_parameters_raise():
    with pytest.raises(ValueError):
        ratio_interval([[1.0, 2.0]], [[1.0]], resamples=0)
    with pytest.raises(ValueError):
        ratio_interval([[1.0, 2.0]], [[1.0]], level=1.0)


def test_groups_of_different_sizes_resample_like_a_loop_would():
    groups = [[1.0, 2.0, 3.0], [5.0], [7.0, 8.0], [10.0, 11.0, 12.0, 13.0]]
    rng = np.random.default_rng(11)
    loop = []
    for _ in range(4000):
        drawn = [groups[i] for i in rng.integers(0, len(groups), len(groups))]
        loop.append(float(np.median([g[j] for g in drawn for j in rng.integers(0, len(g), len(g))])))
    iv = ratio_interval(groups, [[1.0]], resamples=4000, seed=1)
    lo, hi = np.quantile(loop, [0.025, 0.975])
    assert iv.low == pytest.approx(lo, abs=0.6) and iv.high == pytest.approx(hi, abs=0.6)
    assert iv.point == statistics.median([v for g in groups for v in g])


def test_ten_cells_of_ten_thousand_resamples_take_well_under_a_second():
    rng = np.random.default_rng(0)
    num = [list(rng.normal(10, 1, 3)) for _ in range(10)]
    den = [list(rng.normal(8, 1, 3)) for _ in range(10)]
    start = time.perf_counter()
    ratio_interval(num, den)
    assert time.perf_counter() - start < 1.0  # about 0.1 s here; the margin is for a busy machine


positive = st.floats(min_value=0.01, max_value=1e4, allow_nan=False, allow_infinity=False)
side = st.lists(st.lists(positive, min_size=1, max_size=5), min_size=1, max_size=4)


# A random search of 40000 inputs (ties, groups of 1 to 15 values, 1 to 6 groups) found no input whose
# percentile interval misses the point: at least half of the resampled medians fall on either side of
# the pooled median, far more than the 2.5% tails. The bounds below hold for any resample.
@settings(max_examples=200, deadline=None, derandomize=True)
@given(side, side)
def test_interval_is_ordered_holds_the_point_and_stays_within_the_ratio_bounds(num, den):
    iv = ratio_interval(num, den, resamples=500)
    flat_n = [v for g in num for v in g]
    flat_d = [v for g in den for v in g]
    eps = 1e-9 * iv.point
    assert min(flat_n) / max(flat_d) - eps <= iv.low <= iv.point <= iv.high <= max(flat_n) / min(flat_d) + eps
