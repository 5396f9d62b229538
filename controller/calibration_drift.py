"""Whether the reliability curve moved: the drift of the windowed labels' calibration from shadow's
(docs/design.md §2, ``windowed_ece_drift``).

``survival_ece_drift`` subtracts two debiased ECEs. Each is a sum of |gap| per bin less the noise a
calibrated predictor would show, and that correction is exact only where the true gap is zero: where the
drafter is miscalibrated (the shipped one's worst depth by about 0.045) the debiased ECE reads its gap
lower the fewer labels it has, so two sets of very different sizes disagree with no drift at all. The
windowed reference (shadow's rows within their suggested windows) holds a few thousand labels at the
deepest depths against a window of many more, and on a healthy simulated fleet read about +0.013: near
enough the 0.03 threshold to hold stages inconclusive until the progress deadline.

So this statistic compares the curves bin by bin instead of their magnitudes. Per depth, with r_b the
window's mean (y − p) in equal-width bin b of S_k and s_b the reference's,

    D = Σ_b w_b |r_b − s_b| − Σ_b w_b σ_b √(2/π),    σ_b² = ȳ_b(1 − ȳ_b)(1/n_b + 1/m_b),

over the bins both hold, w_b the window's share of their labels and ȳ_b the bin's acceptance rate over
both sides (its outcomes', not its predictions': a miscalibrated bin's labels spread as their outcomes
do). Invariant: when the curve is the same in both (whatever its miscalibration, and whatever the two
sizes) r_b − s_b has mean zero, the second sum is E|r_b − s_b| under the normal approximation, and D is
zero in expectation; a drift of δ in every bin reads about |δ| once σ_b ≪ |δ|. Its standard error comes
from resampling both sides' request groups.

The noise term is exact only where r_b − s_b has mean zero: a real shift hides most of the noise, so D
reads a drift low, as the debiased ECE reads a gap low. The fail side is bounded from D; the pass side
from the first sum alone (at least the shift in expectation), as ``calibration_gates.debiased_ece`` does.
"""

from __future__ import annotations

import math

import numpy as np

from .calibration import KindStats, resample_weights, resampled_sums
from .calibration_gates import bounded
from .measurement import Measurement


def _sums(window: tuple[np.ndarray, ...], reference: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """D's two sums per depth, Σ_b w_b |r_b − s_b| and Σ_b w_b σ_b √(2/π), over the last two axes [...,
    depths + 1, N_BINS] of (count, Σp, Σy) on each side; NaN where no bin holds labels on both."""
    (n, sp, sy), (m, sq, sz) = window, reference
    both = (n > 0) & (m > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        # A label's spread in its bin is its outcome's, so σ_b comes from the bin's acceptance rate, not its
        # mean prediction (the two differ by the miscalibration D must ignore); pooled over both sides, whose
        # rates are the same exactly where the correction is meant to be exact: an unmoved curve.
        rate = np.clip((sy + sz) / (n + m), 0, 1)
        gap = np.abs((sy - sp) / n - (sz - sq) / m)
        noise = np.sqrt(rate * (1 - rate) * (1 / n + 1 / m)) * math.sqrt(2 / math.pi)
        mass = np.where(both, n, 0.0)
        total = mass.sum(axis=-1)
        weights = mass / total[..., None]
        distance, floor = ((np.where(both, weights * x, 0.0)).sum(axis=-1) for x in (gap, noise))
    return np.where(total > 0, distance, np.nan), np.where(total > 0, floor, np.nan)


def _drift(window: tuple[np.ndarray, ...], reference: tuple[np.ndarray, ...]) -> np.ndarray:
    """D per depth (``_sums``: the first less the second)."""
    distance, floor = _sums(window, reference)
    return distance - floor


def _grouped(stats: KindStats) -> tuple[np.ndarray, ...]:
    """The request groups holding labels, each [groups, depths + 1, N_BINS] of (count, Σp, Σy)."""
    occupied = stats.grouped_count.reshape(len(stats.grouped_count), -1).sum(axis=1) > 0
    count, sum_p, sum_y = (stats.grouped_count, stats.grouped_sum_p, stats.grouped_sum_y)
    return count[occupied].astype(np.float64), sum_p[occupied].astype(np.float64), sum_y[occupied].astype(np.float64)


def _resampled(groups: tuple[np.ndarray, ...], resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """``resamples`` draws of the groups with replacement, summed: each [resamples, depths + 1, N_BINS]."""
    return resampled_sums(resample_weights(len(groups[0]), resamples, rng), groups)


def _cells(
    window: KindStats, reference: KindStats, resamples: int, seed: int
) -> tuple[dict[int, float], dict[int, float], dict[int, float], int] | str:
    """Per depth D, its bootstrap standard error and its first sum alone (the pass side's start), and the
    fewest labels of any depth on either side; or why there is nothing to compare."""
    now, then = _grouped(window), _grouped(reference)
    if not len(now[0]) or not len(then[0]):
        return "no windowed labels in the window or in shadow"
    depths = min(now[0].shape[1], then[0].shape[1])
    now, then = tuple(a[:, :depths] for a in now), tuple(a[:, :depths] for a in then)
    plug_in, floor = _sums(tuple(a.sum(axis=0) for a in now), tuple(a.sum(axis=0) for a in then))
    value = plug_in - floor
    rng = np.random.default_rng(seed)
    spread = _drift(_resampled(now, resamples, rng), _resampled(then, resamples, rng))
    found = [d for d in range(1, depths) if not np.isnan(value[d])]
    if not found:
        return "no bin holds windowed labels both now and in shadow"
    counts = [now[0].sum(axis=(0, 2)), then[0].sum(axis=(0, 2))]
    samples = int(min(min(c[d] for d in found) for c in counts))
    se = {d: float(np.nanstd(spread[:, d])) for d in found}
    return {d: float(value[d]) for d in found}, se, {d: float(plug_in[d]) for d in found}, samples


WHAT = "windowed calibration residuals now minus shadow's, per bin"


def curve_drift(
    window: KindStats, reference: KindStats, resamples: int, looks: int, level: float, seed: int = 0
) -> Measurement:
    """The gate input of ``windowed_ece_drift``: the worst depth's D (module docstring), bounded by its
    bootstrap standard error with the fail side spent over depths and looks as ``debiased_ece`` does.
    Samples: the fewest labels of any depth on either side."""
    cells = _cells(window, reference, resamples, seed)
    if isinstance(cells, str):
        return Measurement(None, 0, why=cells)
    gap, se, plug_in, samples = cells
    return bounded(gap, se, samples, looks, level, WHAT, high_from=plug_in)


def worst_replica_curve_drift(
    replicas: dict[str, KindStats], reference: KindStats, resamples: int, looks: int, level: float, seed: int = 0
) -> Measurement:
    """The gate input of ``windowed_ece_drift_replica``: ``curve_drift`` of each replica's windowed labels
    against the fleet's shadow reference, the worst of every (replica, depth) cell with the fail side spent
    over all of them: one drifting replica of R is diluted to about 1/R in the fleet's D, not in its own.
    Samples: the fewest of any replica judged."""
    gap: dict[tuple[str, int], float] = {}
    se: dict[tuple[str, int], float] = {}
    plug_in: dict[tuple[str, int], float] = {}
    samples = []
    for replica, stats in replicas.items():
        cells = _cells(stats, reference, resamples, seed)
        if isinstance(cells, str):
            continue
        for d in cells[0]:
            gap[replica, d], se[replica, d], plug_in[replica, d] = cells[0][d], cells[1][d], cells[2][d]
        samples.append(cells[3])
    if not gap:
        return Measurement(None, 0, why="no replica has windowed labels to compare with shadow's")
    return bounded(gap, se, min(samples), looks, level, WHAT, "(replica, depth) cells", high_from=plug_in)
