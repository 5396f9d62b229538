"""Order-statistic intervals for a median, a symmetric center and a two-sample shift."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.policies.intervals import (
    SIGNED_RANK_EXACT_UP_TO,
    _signed_rank_k,
    median_interval,
    rank_sum_interval,
    sign_interval,
    signed_rank_interval,
)


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


@pytest.mark.parametrize("n", [6, 7, 12, 40, 81, 300])
def test_the_signed_rank_interval_covers_a_symmetric_center_at_least_at_its_level(n):
    rng = np.random.default_rng(n)
    runs, covered, opened = 1000, 0, 0
    for _ in range(runs):
        d = 0.3 + rng.standard_t(2, n)  # heavy tails, symmetric about 0.3
        _, low, high = signed_rank_interval(d, 0.9)
        if low is None:
            opened += 1
            continue
        covered += low <= 0.3 <= high
    assert opened == 0 and covered / runs >= 0.9 - 0.025  # exact coverage >= 0.9, sampling error of 1,000


@pytest.mark.parametrize("n", [SIGNED_RANK_EXACT_UP_TO + 1, 120, 200])
def test_past_the_exact_range_the_signed_rank_rank_keeps_each_tail_within_its_share(n):
    # The exact null distribution of T+ (its generating function), against the normal approximation's rank.
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for i in range(1, n + 1):
        counts[i:] = counts[i:] + counts[: len(counts) - i]
    tail = np.cumsum(counts) / 2.0**n
    for alpha in (0.01, 0.05, 0.1, 0.2):
        k = _signed_rank_k(n, alpha)
        assert k >= 1 and tail[k - 1] <= alpha / 2 * 1.005  # P(T+ <= k - 1): the interval's miss per tail
        assert tail[k] > alpha / 2 * 0.95  # and not needlessly wide: one rank more already spends about it


def test_the_signed_rank_interval_is_narrower_than_the_sign_tests_on_normal_pairs():
    rng = np.random.default_rng(0)
    widths = []
    for _ in range(200):
        d = rng.normal(0.0, 1.0, 30)
        _, low, high = signed_rank_interval(d, 0.95)
        s_low, s_high = sign_interval(d, 0.95)
        widths.append((high - low) / (s_high - s_low))
    assert np.median(widths) < 0.9  # about sqrt(0.64 / 0.955) = 0.82 in theory


def test_too_few_values_leave_the_signed_rank_interval_open():
    assert signed_rank_interval(np.array([]), 0.95) == (None, None, None)
    assert signed_rank_interval(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 0.95)[1:] == (None, None)  # 2/32 > 0.05
    assert signed_rank_interval(np.arange(6.0), 0.95)[1:] == (0.0, 5.0)  # 2/64 <= 0.05: the extremes


@settings(max_examples=40, deadline=None)
@given(st.integers(6, 1700), st.integers(0, 10_000), st.floats(-5, 5))
def test_the_signed_rank_interval_holds_its_estimate_and_moves_with_a_shift(n, seed, shift):
    d = np.random.default_rng(seed).lognormal(0.0, 1.0, n)
    estimate, low, high = signed_rank_interval(d, 0.95)
    assert low <= estimate <= high
    moved = signed_rank_interval(d + shift, 0.95)
    assert moved == pytest.approx((estimate + shift, low + shift, high + shift), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 60), st.integers(1, 60), st.integers(0, 10_000))
def test_the_rank_sum_interval_is_the_order_statistics_of_every_difference(m, n, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.lognormal(0.0, 1.0, m), rng.normal(0.0, 1.0, n)
    estimate, low, high = rank_sum_interval(x, y, 0.95)
    every = np.sort(np.subtract.outer(x, y).ravel())  # what the bisection must find without forming them
    assert estimate == pytest.approx(float(np.median(every)), abs=1e-9)
    k = math.floor(m * n / 2 - NormalDist().inv_cdf(0.975) * math.sqrt(m * n * (m + n + 1) / 12))
    if k < 1:
        assert (low, high) == (None, None)
    else:
        assert (low, high) == pytest.approx((every[k - 1], every[m * n - k]), abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 10_000))
def test_with_ties_the_rank_sum_interval_is_still_the_order_statistics_of_every_difference(m, n, seed):
    # Counts (goodput) tie often: the k-th difference may be the smallest, or zero, and must be found exactly.
    rng = np.random.default_rng(seed)
    x, y = rng.integers(-1, 2, m).astype(float) * 0.25, rng.choice([0.0, 0.0, 0.0, 1.0], n)
    estimate, low, high = rank_sum_interval(x, y, 0.95)
    every = np.sort(np.subtract.outer(x, y).ravel())
    assert estimate == float(np.median(every))
    k = math.floor(m * n / 2 - NormalDist().inv_cdf(0.975) * math.sqrt(m * n * (m + n + 1) / 12))
    assert (low, high) == ((None, None) if k < 1 else (every[k - 1], every[m * n - k]))


def test_the_rank_sum_interval_covers_the_shift_at_its_level_and_empty_samples_have_none():
    rng = np.random.default_rng(3)
    runs, covered = 1000, 0
    for _ in range(runs):  # heavy tails, unequal sizes, a shift of -0.1
        x, y = rng.standard_t(3, 40) * 0.3 - 0.1, rng.standard_t(3, 25) * 0.3
        _, low, high = rank_sum_interval(x, y, 0.9)
        covered += low <= -0.1 <= high
    assert abs(covered / runs - 0.9) < 0.03
    assert rank_sum_interval(np.empty(0), np.ones(3), 0.9) == (None, None, None)
    assert rank_sum_interval(np.ones(2), np.ones(2), 0.99)[1:] == (None, None)  # too few for 99%
