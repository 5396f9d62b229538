"""Order-statistic intervals for a median."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.policies.intervals import median_interval, sign_interval


@settings(max_examples=30, deadline=None)
@given(st.integers(5, 2000), st.integers(0, 10_000))
def test_the_median_interval_holds_the_sample_median(n, seed):
    d = np.random.default_rng(seed).lognormal(0.0, 1.0, n)
    low, high = median_interval(d, 0.95)
    if low is not None:
        assert low <= np.median(d) <= high


def test_too_few_values_have_no_interval_and_coverage_holds_over_many_samples():
    assert sign_interval(np.array([1.0, 2.0]), 0.95) == (None, None)
    rng = np.random.default_rng(0)
    for n, level in ((9, 0.9), (400, 0.95)):
        covered = 0
        for _ in range(400):
            low, high = median_interval(rng.exponential(1.0, n), level)
            covered += low <= np.log(2) <= high  # the exponential's true median
        assert covered / 400 >= level - 0.04
