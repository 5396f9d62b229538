"""Calibration figures against independent references (scikit-learn) and collectors' statistics."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.calibration import calibration_curve
from sklearn.metrics import roc_auc_score
from threadpoolctl import threadpool_info

from sparkgate.collectors.aggregate import Aggregate, CalibrationStats
from sparkgate.collectors.labels import explode
from sparkgate.collectors.schema import MODES
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten
from sparkgate.controller.calibration import (
    REQUEST_GROUPS,
    KindStats,
    bootstrap_ece,
    fine_bin,
    null_ece,
    resampled_sums,
)

STATIC = MODES.index("static")


def _rows(n, seed, miscalibrate=lambda p: p, depths=1):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0, 1, n)
    y = rng.random(n) < miscalibrate(p)
    depth = rng.integers(1, depths + 1, n)
    group = rng.integers(0, REQUEST_GROUPS, n)
    return np.full(n, STATIC), depth, p, y, group


def sklearn_ece(y, p, n_bins=15):
    prob_true, prob_pred = calibration_curve(y, p, n_bins=n_bins, strategy="uniform")
    bins = np.searchsorted(np.linspace(0, 1, n_bins + 1)[1:-1], p)
    counts = np.bincount(bins, minlength=n_bins)
    counts = counts[counts > 0]
    return float((counts / len(p) * np.abs(prob_true - prob_pred)).sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ece_equals_sklearn_calibration_curve_reference(seed):
    mode, depth, p, y, group = _rows(20_000, seed, lambda p: p**1.3, depths=3)
    stats = KindStats.from_rows(mode, depth, p, y, group, depths=3)
    ece = stats.calibration_stats().ece()
    for d in (1, 2, 3):
        keep = depth == d
        assert ece[d] == pytest.approx(sklearn_ece(y[keep], p[keep]), abs=1e-9)


def test_brier_and_auroc_match_references():
    mode, depth, p, y, group = _rows(50_000, 3, lambda p: p**2)
    stats = KindStats.from_rows(mode, depth, p, y, group, depths=1)
    assert stats.calibration_stats().brier()[1] == pytest.approx(float(((p - y) ** 2).mean()), abs=1e-9)
    # Binned AUROC: ties are only possible within one 1/960-wide bin.
    assert stats.auroc()[1] == pytest.approx(roc_auc_score(y, p), abs=2e-3)


def test_equal_mass_ece_uses_bins_of_equal_count():
    # Predictions crowded near 0 with a gap that changes sign every 0.03: equal-width bins average
    # the signs away where the narrow equal-mass bins of the crowded region do not.
    mode, depth, u, _, group = _rows(60_000, 4)
    p = u**3
    y = np.random.default_rng(5).random(len(p)) < np.clip(p + 0.1 * np.sin(100 * p), 0, 1)
    stats = KindStats.from_rows(mode, depth, p, y, group, depths=1)
    edges = np.quantile(p, np.linspace(0, 1, 16))
    bins = np.clip(np.searchsorted(edges[1:-1], p, side="right"), 0, 14)
    reference = sum(abs(p[bins == b].sum() - y[bins == b].sum()) for b in range(15)) / len(p)
    assert stats.equal_mass_ece()[1] == pytest.approx(reference, abs=2e-3)
    assert stats.equal_mass_ece()[1] != pytest.approx(stats.calibration_stats().ece()[1], abs=1e-3)


def test_the_equal_width_statistics_give_every_figure_but_those_of_the_fine_bins():
    mode, depth, p, y, group = _rows(20_000, 6, lambda p: p**1.2, depths=3)
    fine = KindStats.from_rows(mode, depth, p, y, group, depths=3)
    coarse = fine.coarse()
    assert fine.fine and not coarse.fine and coarse.coarse() is coarse
    a, b = coarse.calibration_stats(), fine.calibration_stats()
    for name in ("count", "sum_p", "sum_y", "sum_sq"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-12, err_msg=name)
    assert coarse.curve().keys() == fine.curve().keys()
    for d, point in coarse.curve().items():
        assert point == pytest.approx(fine.curve()[d])
    assert bootstrap_ece(coarse, 50) == bootstrap_ece(fine, 50)  # the request groups are kept as they were
    for figure, match in ((coarse.equal_mass_ece, "equal-mass ECE"), (coarse.auroc, "AUROC")):
        with pytest.raises(ValueError, match=f"the {match} needs the fine bins"):
            figure()
    with pytest.raises(ValueError, match="cannot add statistics over fine bins"):
        fine + coarse


def test_probability_one_lands_in_the_last_bin():
    assert fine_bin(np.array([0.0, 1.0, np.nextafter(1.0, 0)])).tolist() == [0, 959, 959]


def test_fine_statistics_sum_to_the_collectors_aggregate():
    wire = synthetic_wire(40, 16, 7, seed=5)
    flat = flatten(wire)
    labels = explode(flat)
    reference = Aggregate.from_tables(flat.requests, labels, 7)
    status = labels.column("status").combine_chunks().indices.to_numpy()
    mode = labels.column("mode").combine_chunks().indices.to_numpy()
    depth = labels.column("depth").to_numpy().astype(np.int64)
    observed = status != 3
    group = np.zeros(len(status), np.int64)
    mine = KindStats.from_rows(
        mode[observed],
        depth[observed],
        labels.column("survival").to_numpy()[observed],
        status[observed] == 0,
        group[observed],
        7,
    ).calibration_stats()
    np.testing.assert_array_equal(mine.count, reference.survival.count)
    np.testing.assert_array_equal(mine.sum_y, reference.survival.sum_y)
    np.testing.assert_allclose(mine.sum_p, reference.survival.sum_p, atol=1e-9)
    np.testing.assert_allclose(mine.sum_sq, reference.survival.sum_sq, atol=1e-9)


def test_bootstrap_interval_covers_the_true_ece_at_about_the_nominal_rate():
    # y ~ Bernoulli(p^1.5) with p ~ U(0, 1): the gap p - p^1.5 >= 0 everywhere, so the true
    # ECE is its integral, 1/2 - 1/2.5 = 0.1 (the binned absolute value loses nothing).
    truth, covered, runs = 0.1, 0, 100
    for seed in range(runs):
        mode, depth, p, y, group = _rows(20_000, 100 + seed, lambda p: p**1.5)
        lo, hi, _ = bootstrap_ece(KindStats.from_rows(mode, depth, p, y, group, 1), resamples=200, seed=seed)[1]
        covered += lo <= truth <= hi
    assert 0.88 <= covered / runs <= 0.995


def test_bootstrap_resamples_requests_not_rows():
    # Each request contributes many identical rows; resampling rows would shrink the interval.
    rng = np.random.default_rng(7)
    requests = 400
    p_req, y_req = rng.uniform(0, 1, requests), rng.random(requests) < 0.5
    copies = 50
    p, y = np.repeat(p_req, copies), np.repeat(y_req, copies)
    group = np.repeat(np.arange(requests) % REQUEST_GROUPS, copies)
    grouped = KindStats.from_rows(np.full(len(p), STATIC), np.ones(len(p), np.int64), p, y, group, 1)
    shuffled = KindStats.from_rows(
        np.full(len(p), STATIC), np.ones(len(p), np.int64), p, y, rng.integers(0, REQUEST_GROUPS, len(p)), 1
    )
    width = lambda s: np.subtract(*bootstrap_ece(s, 200)[1][1::-1])
    assert width(grouped) > 3 * width(shuffled)


def test_bootstrap_rejects_a_bad_level():
    mode, depth, p, y, group = _rows(100, 0)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ece(KindStats.from_rows(mode, depth, p, y, group, 1), level=1.5)


def test_the_debiased_ece_is_unbiased_for_a_calibrated_predictor_and_finds_a_known_miscalibration():
    rng = np.random.default_rng(0)

    def ece_pair(n: int, shift: float) -> tuple[float, float]:
        p = rng.uniform(0.05, 0.85, n)  # p + 0.1 stays a probability: the gap is 0.1 everywhere
        y = (rng.random(n) < p + shift).astype(np.int64)
        stats = CalibrationStats.from_rows(np.full(n, STATIC), np.ones(n, np.int64), p, y, 1)
        return stats.ece()[1], stats.ece()[1] - null_ece(stats, seed=int(rng.integers(1 << 30)))[1]

    calibrated = np.array([ece_pair(500, 0.0) for _ in range(300)])
    plug_in, debiased = calibrated.mean(axis=0)
    assert plug_in > 0.04  # sampling noise alone: about 0.05 at 500 labels
    assert abs(debiased) < 0.004  # what is left once the noise floor is subtracted
    # A real 0.1 gap: the plug-in overstates it by the noise, the debiased value understates it by at most
    # the floor (a bin's noise hardly adds to a gap much larger than itself); both detect it.
    shifted = np.array([ece_pair(2000, 0.1) for _ in range(50)])
    plug_in, debiased = shifted.mean(axis=0)
    assert 0.095 <= plug_in < 0.11 and 0.1 - 0.035 < debiased < plug_in and (shifted[:, 1] > 0.03).all()


@given(
    k=st.integers(1, 12),
    resamples=st.integers(1, 9),
    cells=st.lists(st.integers(1, 5), min_size=0, max_size=2),
    seed=st.integers(0, 99),
)
def test_resampled_sums_are_each_resamples_weighted_total_and_leave_the_blas_pool_as_it_was(k, resamples, cells, seed):
    rng = np.random.default_rng(seed)
    weights = rng.integers(0, 4, size=(resamples, k)).astype(np.float64)
    arrays = [rng.random((k, *cells)), rng.integers(0, 50, size=(k, *cells)).astype(np.float64)]
    before = [i["num_threads"] for i in threadpool_info()]
    got = resampled_sums(weights, arrays)
    assert [i["num_threads"] for i in threadpool_info()] == before
    for a, g in zip(arrays, got):
        assert g.shape == (resamples, *cells)
        assert np.allclose(g, np.einsum("rk,k...->r...", weights, a))


def test_the_products_run_on_one_blas_thread_and_concurrent_callers_leave_the_pool_as_they_found_it(monkeypatch):
    from sparkgate.controller import calibration

    def blas_threads() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas_threads()
    seen = []
    real = calibration.one_blas_thread

    @contextlib.contextmanager
    def watched():
        with real():
            seen.append(blas_threads())
            yield

    monkeypatch.setattr(calibration, "one_blas_thread", watched)
    resampled_sums(np.ones((3, 4)), [np.ones((4, 2))])
    assert seen == [[1] * len(before)] and blas_threads() == before
    monkeypatch.setattr(calibration, "one_blas_thread", real)
    # serve's tick and a report evaluate in two threads: their limits must not interleave (without the lock,
    # about one run in five of this loop left the pool at one thread).
    weights, arrays = np.ones((50, 200)), [np.random.default_rng(0).random((200, 120))]

    def many():
        for _ in range(200):
            resampled_sums(weights, arrays)

    threads = [threading.Thread(target=many) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert blas_threads() == before
