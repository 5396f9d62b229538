"""An interval for the difference of two coefficients of variation (pure functions).

The adaptive phase's ``window_oscillation`` compares how much the per-epoch mean window swings in the
treatment arm and in the control arm. A percentile bootstrap of that difference covers less than it states
at the tens of epochs a gate sees, because a resampled standard deviation is biased low and skewed: at 10
epochs an arm with CVs 0.15 and 0.05, its upper bound fell below the true difference 16% of the time
against the 2.5% stated, so a real oscillation passed. Here instead each arm's CV gets
the chi-square interval of its standard deviation, exact for normal values (an epoch's mean window is a
mean of many rows), and the two are combined by MOVER (Zou and Donner's method of variance estimates
recovery), which keeps each side's share of the miss rate: about 2.5% a side at 0.95 for 3 to 30 epochs
an arm, at equal CVs or at CVs three times apart (``tests/policies/test_variation.py``).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

# Up to this many degrees of freedom the chi-square quantile comes from its CDF; above it the Wilson–Hilferty
# approximation is within 0.1% of it (and the CDF's series would overflow).
EXACT_DF_UP_TO = 100


def _lower_gamma(a: float, x: float) -> float:
    """The regularized lower incomplete gamma P(a, x) by its power series (every term positive)."""
    if x <= 0:
        return 0.0
    term = total = 1.0 / a
    n = 0
    while term > total * 1e-16:
        n += 1
        term *= x / (a + n)
        total += term
    return min(1.0, total * math.exp(a * math.log(x) - x - math.lgamma(a)))


@functools.lru_cache(maxsize=1024)
def chi2_quantile(df: int, p: float) -> float:
    """The ``p``-quantile of a chi-square distribution with ``df`` >= 1 degrees of freedom."""
    if df > EXACT_DF_UP_TO:
        z = NormalDist().inv_cdf(p)
        return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    low, high = 0.0, df + 40.0 * math.sqrt(df) + 40.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _lower_gamma(df / 2, mid / 2) < p else (low, mid)
    return (low + high) / 2


def cv(x: np.ndarray) -> float:
    """The coefficient of variation (sample standard deviation over the mean)."""
    return float(np.std(x, ddof=1) / np.mean(x))


def cv_interval(x: np.ndarray, alpha: float) -> tuple[float, float, float]:
    """``x``'s CV with its two-sided ``1 - alpha`` interval (the standard deviation's chi-square interval
    over the mean, which treats the mean as known: the CVs here are a few percent). Needs 2 or more values."""
    k, c = len(x) - 1, cv(x)
    return c, c * math.sqrt(k / chi2_quantile(k, 1 - alpha / 2)), c * math.sqrt(k / chi2_quantile(k, alpha / 2))


def cv_difference(x: np.ndarray, y: np.ndarray, level: float) -> tuple[float, float, float]:
    """CV(x) - CV(y) with its MOVER interval at ``level``: each side's bound from the arms' bounds on it."""
    alpha = 1 - level
    cx, lx, ux = cv_interval(x, alpha)
    cy, ly, uy = cv_interval(y, alpha)
    estimate = cx - cy
    return estimate, estimate - math.hypot(cx - lx, uy - cy), estimate + math.hypot(ux - cx, cy - ly)
