"""The CV difference's interval: chi-square quantiles against scipy's, and each side's miss rate over many
seeded samples at its stated share."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from sparkgate.policies.variation import EXACT_DF_UP_TO, chi2_quantile, cv_difference


@pytest.mark.parametrize("df", [1, 2, 5, 29, EXACT_DF_UP_TO, EXACT_DF_UP_TO + 1, 4000])
@pytest.mark.parametrize("p", [0.0005, 0.025, 0.5, 0.975, 0.9995])
def test_chi2_quantiles_match_scipys(df, p):
    tolerance = 1e-6 if df <= EXACT_DF_UP_TO else 1e-3
    assert chi2_quantile(df, p) == pytest.approx(stats.chi2.ppf(p, df), rel=tolerance)


@pytest.mark.parametrize("n", [3, 10, 30])
@pytest.mark.parametrize("cvs", [(0.05, 0.05), (0.15, 0.05), (0.05, 0.15)])
def test_each_side_misses_the_true_difference_at_most_its_share(n, cvs):
    """At 0.95 each side may miss 2.5% of the time; a percentile bootstrap missed 16% on the passing side."""
    rng, draws = np.random.default_rng(n), 3000
    treated = rng.normal(3.0, 3.0 * cvs[0], (draws, n))
    control = rng.normal(3.0, 3.0 * cvs[1], (draws, n))
    bounds = np.array([cv_difference(t, c, 0.95)[1:] for t, c in zip(treated, control, strict=True)])
    true = cvs[0] - cvs[1]
    assert np.mean(bounds[:, 0] > true) <= 0.035 and np.mean(bounds[:, 1] < true) <= 0.035
    assert np.mean(bounds[:, 0] > true) + np.mean(bounds[:, 1] < true) >= 0.025  # not wider than stated


@given(
    st.lists(st.floats(1.0, 10.0), min_size=2, max_size=30),
    st.lists(st.floats(1.0, 10.0), min_size=2, max_size=30),
    st.floats(0.5, 0.999),
)
def test_the_interval_holds_its_estimate(x, y, level):
    estimate, low, high = cv_difference(np.array(x), np.array(y), level)
    assert low <= estimate + 1e-12 and estimate <= high + 1e-12
