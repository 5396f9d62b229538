"""Calibration figures from depth labels: ECE (equal-width and equal-mass), Brier, AUROC,
reliability curves, and bootstrap intervals that resample requests (docs/design.md §2).

One pass over the label rows fills two histograms per kind of prediction
(survival ``S_k`` against ``y_k`` over observed rows; conditional ``c_k`` against
``y_k`` over rows at risk):

- ``fine``: per (mode, depth, fine bin, y) the count, Σp and Σp². ``FINE_BINS`` is a
  multiple of 15, so each of the 15 equal-width bins is exactly 64 fine bins and
  the collectors' ``CalibrationStats`` (hence their ECE, Brier and reliability)
  is a sum of fine bins. Equal-mass bins and AUROC are resolved to 1/960.
- ``grouped``: per (request group, depth, equal-width bin) the count, Σp and Σy
  over the gated (uncensored) modes. Requests are hashed into ``REQUEST_GROUPS``
  groups; resampling groups resamples requests, at a cost independent of the
  number of rows.

Invariants: every array is indexed by depth with index 0 unused; counts are
integers so merging (adding) histograms is exact. A tick's statistics may hold
the equal-width bins in place of the fine ones (``KindStats.coarse``); adding
the two refuses.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from threadpoolctl import ThreadpoolController

from sparkgate.collectors.aggregate import CalibrationStats
from sparkgate.collectors.schema import MODES
from sparkgate.policies.binning import FINE_BINS, FINE_PER_BIN, N_BINS, REQUEST_GROUPS
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES, WINDOWED_MODES

GATED = np.isin(np.arange(len(MODES)), [MODES.index(m) for m in FULL_BLOCK_MODES])
WINDOWED = np.isin(np.arange(len(MODES)), [MODES.index(m) for m in WINDOWED_MODES])


def fine_bin(p: np.ndarray) -> np.ndarray:
    """Fine bin of each probability; p = 1 lands in the last bin, like the equal-width bins."""
    return np.minimum((p * FINE_BINS).astype(np.int32), FINE_BINS - 1)


def _histogram(key: np.ndarray, size: int, weights: np.ndarray | None = None) -> np.ndarray:
    """``bincount`` over keys shifted by one: key 0 collects the rows left out, and is dropped."""
    return np.bincount(key, weights, minlength=size + 1)[1:]


@dataclass
class KindStats:
    """Histograms of one kind of prediction. ``fine_*`` are [modes, depths+1, FINE_BINS, 2]
    (last axis: y = 0, y = 1); ``grouped_*`` are [REQUEST_GROUPS, depths+1, N_BINS] over gated modes (the
    full-block modes; the windowed kind: ``WINDOWED_MODES``).

    Read for gates alone, ``fine_*`` may hold the N_BINS equal-width bins in place of the fine ones
    (``coarse()``, ``fine`` False): every figure but the equal-mass ECE and AUROC is the same at either."""

    fine_count: np.ndarray
    fine_sum_p: np.ndarray
    fine_sum_p2: np.ndarray
    grouped_count: np.ndarray
    grouped_sum_p: np.ndarray
    grouped_sum_y: np.ndarray

    @classmethod
    def from_rows(
        cls,
        mode: np.ndarray,
        depth: np.ndarray,
        p: np.ndarray,
        y: np.ndarray,
        group: np.ndarray,
        depths: int,
        keep: np.ndarray | None = None,
        grouped: np.ndarray = GATED,
    ) -> KindStats:
        """From one row per label: mode code, depth (1..depths), prediction, outcome (0/1), request group;
        only rows where ``keep`` holds count, and in the grouped histograms only modes where ``grouped``
        (a mask over ``MODES``) holds. Rows are never copied out (a mask would copy every column):
        left-out rows get key 0, which the histograms drop."""
        width = depths + 1
        shape, gshape = (len(MODES), width, FINE_BINS, 2), (REQUEST_GROUPS, width, N_BINS, 2)
        size, gsize = int(np.prod(shape)), int(np.prod(gshape))
        fine = fine_bin(p)
        # In-place arithmetic: at ten million rows, allocating (and page-faulting) a fresh array per
        # operation costs more than the arithmetic itself.
        key = mode.astype(np.int32)
        key *= width
        key += depth
        key *= FINE_BINS
        key += fine
        key *= 2
        key += y
        key += 1
        gkey = group.astype(np.int32)
        gkey *= width
        gkey += depth
        gkey *= N_BINS
        fine //= FINE_PER_BIN
        gkey += fine
        gkey *= 2
        gkey += y
        gkey += 1
        gated = grouped[mode]
        if keep is not None:
            key *= keep
            gated &= keep
        gkey *= gated
        gcount = _histogram(gkey, gsize).reshape(gshape)
        return cls(
            _histogram(key, size).reshape(shape),
            _histogram(key, size, p).reshape(shape),
            _histogram(key, size, p * p).reshape(shape),
            gcount.sum(axis=-1),
            _histogram(gkey, gsize, p).reshape(gshape).sum(axis=-1),
            gcount[..., 1],
        )

    @property
    def depths(self) -> int:
        return self.fine_count.shape[1] - 1

    @property
    def fine(self) -> bool:
        """Whether ``fine_*`` hold the fine bins (else the equal-width ones)."""
        return self.fine_count.shape[2] == FINE_BINS

    def __add__(self, other: KindStats) -> KindStats:
        """Statistics of both row sets (same depths and bins), e.g. two chunks of one window."""
        if other.depths != self.depths:
            raise ValueError(f"depths={other.depths}: cannot add stats over {self.depths} depths")
        if other.fine != self.fine:
            raise ValueError("cannot add statistics over fine bins to statistics over equal-width bins")
        return KindStats(*(getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__))

    def coarse(self) -> KindStats:
        """The same statistics with each equal-width bin's fine bins summed into one."""
        if not self.fine:
            return self
        return KindStats(_equal_width(self.fine_count), _equal_width(self.fine_sum_p), _equal_width(self.fine_sum_p2),
                         self.grouped_count, self.grouped_sum_p, self.grouped_sum_y)  # fmt: skip

    def calibration_stats(self) -> CalibrationStats:
        """The collectors' equal-width statistics (per mode, depth, bin), summed from the fine bins."""
        coarse = self.coarse()
        count, sum_p, sum_p2 = coarse.fine_count, coarse.fine_sum_p, coarse.fine_sum_p2
        # Σ(p - y)² = Σp² - 2Σ_{y=1} p + n_{y=1}, since y² = y.
        sum_sq = sum_p2.sum(-1) - 2 * sum_p[..., 1] + count[..., 1]
        return CalibrationStats(count.sum(-1), sum_p.sum(-1), count[..., 1], sum_sq)

    def _fine(self, modes: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(count [depths+1, F, 2], Σp [depths+1, F]) summed over ``modes``."""
        keep = [MODES.index(m) for m in modes]
        return self.fine_count[keep].sum(axis=0), self.fine_sum_p[keep].sum(axis=(0, -1))

    def _fine_only(self, figure: str) -> None:
        if not self.fine:
            raise ValueError(f"the {figure} needs the fine bins: these statistics hold the equal-width bins alone")

    def equal_mass_ece(self, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> dict[int, float]:
        """ECE over 15 bins of (about) equal count per depth; boundaries fall on fine-bin edges."""
        self._fine_only("equal-mass ECE")
        count, sum_p = self._fine(modes)
        out = {}
        for d in range(1, count.shape[0]):
            n_f = count[d].sum(-1)
            n = n_f.sum()
            if not n:
                continue
            # A fine bin joins the equal-mass bin holding its midpoint in cumulative count.
            middle = np.cumsum(n_f) - n_f / 2
            mass_bin = np.minimum((middle * N_BINS / n).astype(np.int64), N_BINS - 1)
            gap = np.bincount(mass_bin, sum_p[d] - count[d, :, 1], minlength=N_BINS)
            out[d] = float(np.abs(gap).sum() / n)
        return out

    def auroc(self, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> dict[int, float]:
        """P(prediction of a y=1 row > that of a y=0 row), ties within a fine bin counting half.
        Depths with only one outcome are left out."""
        self._fine_only("AUROC")
        count, _ = self._fine(modes)
        out = {}
        for d in range(1, count.shape[0]):
            neg, pos = count[d, :, 0].astype(np.float64), count[d, :, 1].astype(np.float64)
            if not (neg.sum() and pos.sum()):
                continue
            above = pos.sum() - np.cumsum(pos)
            out[d] = float((neg * (above + pos / 2)).sum() / (neg.sum() * pos.sum()))
        return out

    def curve(self, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> dict[int, dict]:
        """Per depth: mean prediction, observed rate of y and the count (the c_k / S_k curve)."""
        count, sum_p = self._fine(modes)
        out = {}
        for d in range(1, count.shape[0]):
            n = int(count[d].sum())
            if n:
                out[d] = {"mean_p": float(sum_p[d].sum() / n), "rate": float(count[d, :, 1].sum() / n), "samples": n}
        return out


def _equal_width(a: np.ndarray) -> np.ndarray:
    """[modes, depths+1, FINE_BINS, 2] summed to [modes, depths+1, N_BINS, 2]."""
    return a.reshape(*a.shape[:2], N_BINS, FINE_PER_BIN, *a.shape[3:]).sum(axis=3)


def grouped_ece(count: np.ndarray, sum_p: np.ndarray, sum_y: np.ndarray) -> np.ndarray:
    """ECE per depth over the last two axes [..., depths+1, N_BINS]: Σ_b |Σp − Σy| / n, the
    estimator of ``CalibrationStats.ece``; NaN where a depth has no rows."""
    n = count.sum(axis=-1)
    gap = np.abs(sum_p - sum_y).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, gap / np.maximum(n, 1), np.nan)


def resample_weights(k: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples, k]: each resample draws k of k request groups with replacement; a weight counts a group's
    draws."""
    draws = rng.integers(0, k, size=(resamples, k)) + np.arange(resamples)[:, None] * k
    return np.bincount(draws.ravel(), minlength=resamples * k).reshape(resamples, k).astype(np.float64)


@functools.cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController()


# The limit is a process-wide setting that each block restores on leaving: held by one thread at a time
# (serve's tick and a /v1/report evaluate in different threads), blocks never interleave, and the pool is
# left as it was found.
_BLAS_LOCK = threading.Lock()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """The BLAS pool at one thread inside the block, as it was after."""
    with _BLAS_LOCK, _blas().limit(limits=1, user_api="blas"):
        yield


def resampled_sums(weights: np.ndarray, arrays: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Per array of ``arrays`` (each [k, ...], one row per request group): its resamples' sums
    [resamples, ...], ``weights`` [resamples, k] times it, one matrix product over the flattened cells
    (a tenth of einsum's time per tick).

    The products run on one BLAS thread. They are small (200 × 200 × a few hundred cells), and a BLAS
    pool's threads spin for a while after each product, taking the cores that the controller's next
    DuckDB statement runs its own threads on: on 2 cores a tick's window statements took 1.6× as long
    after a bootstrap as alone, and a tick's CPU time was 0.81× with one thread (docs/benchmarks.md)."""
    with one_blas_thread():
        return tuple((weights @ a.reshape(len(a), -1)).reshape(len(weights), *a.shape[1:]) for a in arrays)


def bootstrap_ece(
    stats: KindStats, resamples: int = 200, level: float = 0.95, seed: int = 0
) -> dict[int, tuple[float, float, float]]:
    """Per depth of the gated modes: the percentile interval of the ECE at ``level`` and its bootstrap
    standard error, ``(low, high, se)``, resampling request groups with replacement.

    Only groups holding rows are resampled, so sparse windows (fewer requests than
    groups) still resample requests rather than empty groups.
    """
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}: expected a fraction in (0, 1)")
    occupied = stats.grouped_count.reshape(REQUEST_GROUPS, -1).sum(axis=1) > 0
    k = int(occupied.sum())
    if not k:
        return {}
    groups = [a[occupied].astype(np.float64) for a in (stats.grouped_count, stats.grouped_sum_p, stats.grouped_sum_y)]
    weights = resample_weights(k, resamples, np.random.default_rng(seed))
    present = np.flatnonzero(stats.grouped_count.sum(axis=(0, 2))[1:]) + 1
    ece = grouped_ece(*resampled_sums(weights, groups))[:, present]
    tail = (1 - level) / 2 * 100
    lo, hi = np.nanpercentile(ece, [tail, 100 - tail], axis=0)
    se = np.nanstd(ece, axis=0)
    return {int(d): (float(a), float(b), float(c)) for d, a, b, c in zip(present, lo, hi, se)}


def null_ece(
    stats: CalibrationStats, modes: tuple[str, ...] = FULL_BLOCK_MODES, resamples: int = 200, seed: int = 0
) -> dict[int, float]:
    """Per depth: the plug-in ECE a perfectly calibrated predictor would show at these bins' counts and
    mean predictions, the mean over ``resamples`` draws of every bin's labels from its prediction
    (Binomial(n_b, p̄_b)). It is the ECE's noise floor at this sample size; ``ece - null_ece`` is the
    debiased ECE, zero in expectation for a calibrated predictor (its plug-in ECE is pure noise)."""
    s = stats.select(modes)
    n = s.count[0].astype(np.int64)  # [depths+1, N_BINS]
    mean_p = np.clip(np.divide(s.sum_p[0], n, out=np.zeros(n.shape), where=n > 0), 0.0, 1.0)
    draws = np.random.default_rng(seed).binomial(n, mean_p, size=(resamples, *n.shape))
    gap = np.abs(draws - mean_p * n).sum(axis=-1).mean(axis=0)
    total = n.sum(axis=1)
    return {d: float(gap[d] / total[d]) for d in range(1, len(total)) if total[d]}


@dataclass(frozen=True)
class Calibration:
    """One set of labels' survival calibration per depth: plug-in ECE, its noise floor, bootstrap
    (low, high, se), and the fewest labels of any depth."""

    ece: dict[int, float]
    null: dict[int, float]
    bounds: dict[int, tuple[float, float, float]]
    samples: int

    @classmethod
    def of(cls, kind: KindStats, resamples: int, level: float, seed: int = 0) -> Calibration:
        stats = kind.calibration_stats()
        samples = stats.samples()
        return cls(
            stats.ece(), null_ece(stats), bootstrap_ece(kind, resamples, level, seed), min(samples.values(), default=0)
        )

    def debiased(self) -> dict[int, float]:
        return {d: self.ece[d] - self.null[d] for d in self.ece if d in self.null and d in self.bounds}
