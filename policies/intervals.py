"""Distribution-free intervals for a median: the sign test's order statistics (pure functions).

Every layer that reports an estimate with an interval over paired or repeated
measurements uses these: the comparison gates (epoch pairs), the adaptive gates
(step errors) and the benchmarks (paired rounds).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def sign_interval(d: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The distribution-free interval for the median of ``d`` with coverage >= ``level`` (None, None when
    ``len(d)`` is too small for one)."""
    n = len(d)
    alpha = 1 - level
    # The largest j with P(Binomial(n, 1/2) < j) <= alpha / 2: [d_(j), d_(n-j+1)] covers the median.
    j, tail = 0, 0.0
    while j < n and tail + math.comb(n, j) / 2**n <= alpha / 2:
        tail += math.comb(n, j) / 2**n
        j += 1
    if j == 0:
        return None, None
    ordered = np.sort(d)
    return float(ordered[j - 1]), float(ordered[n - j])


# Above this many values the median's order-statistic interval uses the normal approximation of the
# binomial (sign_interval's exact sum costs O(n) big-integer terms).
EXACT_UP_TO = 200


def median_interval(d: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """An interval for the median of ``d`` covering it with probability about ``level`` whatever the
    distribution (order statistics of a Binomial(n, 1/2); exact for small ``n``)."""
    n = len(d)
    if n <= EXACT_UP_TO:
        return sign_interval(d, level)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    j = max(1, math.floor((n - z * math.sqrt(n)) / 2))
    ordered = np.sort(d)
    return float(ordered[j - 1]), float(ordered[n - j])
