"""Mergeable sufficient statistics: how a fleet reports calibration without shipping rows.

Per (mode, depth, bin) an ``Aggregate`` keeps the count, Σp, Σy and Σ(p−y)², for
survival (S_k against y_k over observed rows) and conditional calibration (c_k
against 1[a* >= k] over rows at risk), plus window/accept histograms. Counts and
Σy are integers, so merging is exact; Σp and Σ(p−y)² are float sums, so a merged
figure equals the single-pass one up to float rounding. ECE, Brier and the
reliability diagram derive from these sums alone (DESIGN §2): 15 equal-width
bins ``[k/15, (k+1)/15)``, the last one closed so that p = 1 lands in it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.labels import ACCEPTED, CENSORED, REJECTED, mode_codes
from collectors.schema import MODES

N_BINS = 15
EDGES = np.arange(N_BINS + 1) / N_BINS
UNCENSORED_MODES = ("static", "shadow", "cap_accept")


def bin_index(p: np.ndarray) -> np.ndarray:
    """Bin of each probability: k with EDGES[k] <= p < EDGES[k+1], and the last bin for p = 1."""
    return np.minimum(np.searchsorted(EDGES, p, side="right") - 1, N_BINS - 1)


@dataclass
class CalibrationStats:
    """Arrays shaped [len(MODES), depths + 1, N_BINS]; depth index 0 is unused (depths start at 1)."""

    count: np.ndarray
    sum_p: np.ndarray
    sum_y: np.ndarray
    sum_sq: np.ndarray

    @classmethod
    def empty(cls, depths: int) -> "CalibrationStats":
        shape = (len(MODES), depths + 1, N_BINS)
        return cls(np.zeros(shape, np.int64), np.zeros(shape), np.zeros(shape, np.int64), np.zeros(shape))

    @classmethod
    def from_rows(cls, mode: np.ndarray, depth: np.ndarray, p: np.ndarray, y: np.ndarray,
                  depths: int) -> "CalibrationStats":
        stats = cls.empty(depths)
        index = np.ravel_multi_index((mode, depth, bin_index(p)), stats.count.shape)
        size = stats.count.size
        stats.count += np.bincount(index, minlength=size).reshape(stats.count.shape)
        stats.sum_p += np.bincount(index, p, minlength=size).reshape(stats.count.shape)
        stats.sum_y += np.bincount(index, y, minlength=size).astype(np.int64).reshape(stats.count.shape)
        stats.sum_sq += np.bincount(index, (p - y) ** 2, minlength=size).reshape(stats.count.shape)
        return stats

    def padded(self, depths: int) -> "CalibrationStats":
        extra = depths + 1 - self.count.shape[1]
        return CalibrationStats(*(np.pad(a, ((0, 0), (0, extra), (0, 0))) for a in self._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.count, self.sum_p, self.sum_y, self.sum_sq

    def merge(self, other: "CalibrationStats") -> "CalibrationStats":
        depths = max(self.count.shape[1], other.count.shape[1]) - 1
        a, b = self.padded(depths), other.padded(depths)
        return CalibrationStats(*(x + y for x, y in zip(a._arrays(), b._arrays())))

    def select(self, modes: tuple[str, ...]) -> "CalibrationStats":
        """Statistics summed over ``modes`` (still with a mode axis of length 1)."""
        keep = [MODES.index(m) for m in modes]
        return CalibrationStats(*(a[keep].sum(axis=0, keepdims=True) for a in self._arrays()))

    def ece(self, modes: tuple[str, ...] = UNCENSORED_MODES) -> dict[int, float]:
        """Expected calibration error per depth with samples (depths without samples are left out)."""
        s = self.select(modes)
        n = s.count[0].sum(axis=1)
        gap = np.abs(s.sum_p[0] - s.sum_y[0]).sum(axis=1)
        return {d: float(gap[d] / n[d]) for d in range(1, len(n)) if n[d]}

    def brier(self, modes: tuple[str, ...] = UNCENSORED_MODES) -> dict[int, float]:
        s = self.select(modes)
        n = s.count[0].sum(axis=1)
        return {d: float(s.sum_sq[0, d].sum() / n[d]) for d in range(1, len(n)) if n[d]}

    def samples(self, modes: tuple[str, ...] = UNCENSORED_MODES) -> dict[int, int]:
        n = self.select(modes).count[0].sum(axis=1)
        return {d: int(n[d]) for d in range(1, len(n)) if n[d]}

    def reliability(self, depth: int, modes: tuple[str, ...] = UNCENSORED_MODES) -> list[dict]:
        """Per non-empty bin: its edges, count, mean prediction and observed frequency."""
        s = self.select(modes)
        return [{"lo": float(EDGES[b]), "hi": float(EDGES[b + 1]), "count": int(s.count[0, depth, b]),
                 "mean_p": float(s.sum_p[0, depth, b] / s.count[0, depth, b]),
                 "freq_y": float(s.sum_y[0, depth, b] / s.count[0, depth, b])}
                for b in range(N_BINS) if s.count[0, depth, b]]


def _histogram(mode: np.ndarray, x: np.ndarray, y: np.ndarray, width: int) -> np.ndarray:
    hist = np.zeros((len(MODES), width, width), np.int64)
    np.add.at(hist, (mode, x, y), 1)
    return hist


def _pad_hist(h: np.ndarray, width: int) -> np.ndarray:
    extra = width - h.shape[-1]
    return np.pad(h, [(0, 0)] * (h.ndim - 2) + [(0, extra), (0, extra)])


@dataclass
class Aggregate:
    """Everything a replica reports for one interval; ``merge`` combines replicas or intervals.

    ``accept_hist[mode, window, accepted]`` counts request rows; ``full_hist[mode,
    accepted, full_accept]`` counts rows whose a* is observed; ``suggest_hist[mode,
    window_suggested, full_accept]`` counts rows carrying a suggestion and a*.
    """

    survival: CalibrationStats
    conditional: CalibrationStats
    accept_hist: np.ndarray
    full_hist: np.ndarray
    suggest_hist: np.ndarray

    @classmethod
    def from_tables(cls, requests: pa.Table, labels: pa.Table, depths: int) -> "Aggregate":
        """From stored request rows and their depth labels; ``depths`` >= the largest gamma."""
        mode = mode_codes(labels.column("mode").cast(pa.string()))
        depth = labels.column("depth").to_numpy().astype(np.int64)
        status = labels.column("status").combine_chunks().indices.to_numpy()
        observed, at_risk = status != CENSORED, (status == ACCEPTED) | (status == REJECTED)
        y = (status == ACCEPTED).astype(np.float64)
        survival = labels.column("survival").to_numpy()
        confidence = labels.column("confidence").to_numpy()
        rmode = mode_codes(requests.column("mode").cast(pa.string()))
        window, accepted = requests.column("window").to_numpy(), requests.column("accepted").to_numpy()
        has_full = pc.is_valid(requests.column("full_accept")).to_numpy(zero_copy_only=False)
        full = pc.fill_null(requests.column("full_accept"), 0).to_numpy()
        has_suggest = pc.is_valid(requests.column("window_suggested")).to_numpy(zero_copy_only=False) & has_full
        suggest = pc.fill_null(requests.column("window_suggested"), 0).to_numpy()
        width = depths + 1
        return cls(
            CalibrationStats.from_rows(mode[observed], depth[observed], survival[observed], y[observed], depths),
            CalibrationStats.from_rows(mode[at_risk], depth[at_risk], confidence[at_risk], y[at_risk], depths),
            _histogram(rmode, window, accepted, width),
            _histogram(rmode[has_full], accepted[has_full], full[has_full], width),
            _histogram(rmode[has_suggest], suggest[has_suggest], full[has_suggest], width),
        )

    @property
    def depths(self) -> int:
        return self.accept_hist.shape[-1] - 1

    def merge(self, other: "Aggregate") -> "Aggregate":
        width = max(self.depths, other.depths) + 1
        return Aggregate(self.survival.merge(other.survival), self.conditional.merge(other.conditional),
                         *(_pad_hist(getattr(self, f), width) + _pad_hist(getattr(other, f), width)
                           for f in ("accept_hist", "full_hist", "suggest_hist")))

    def upper_bound_utilization(self) -> float | None:
        """Cap-accept ``Σ a / Σ min(a*, γ)`` (a* <= γ always); None without cap-accept samples."""
        h = self.full_hist[MODES.index("cap_accept")]
        a, full = np.indices(h.shape)
        denominator = (h * full).sum()
        return float((h * a).sum() / denominator) if denominator else None

    def shadow_utilization(self) -> float | None:
        """Shadow ``Σ min(a*, w_suggested) / Σ a*``; None without shadow samples."""
        h = self.suggest_hist[MODES.index("shadow")]
        w, full = np.indices(h.shape)
        denominator = (h * full).sum()
        return float((h * np.minimum(full, w)).sum() / denominator) if denominator else None

    def to_dict(self) -> dict:
        """A JSON-ready form (nested lists); ``from_dict`` inverts it exactly."""
        out = {f"{kind}.{f.name}": getattr(getattr(self, kind), f.name).tolist()
               for kind in ("survival", "conditional") for f in fields(CalibrationStats)}
        out.update({f: getattr(self, f).tolist() for f in ("accept_hist", "full_hist", "suggest_hist")})
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Aggregate":
        def stats(kind: str) -> CalibrationStats:
            return CalibrationStats(*(np.asarray(data[f"{kind}.{f.name}"], dtype=np.float64 if f.name.startswith(
                "sum_") and f.name != "sum_y" else np.int64) for f in fields(CalibrationStats)))

        return cls(stats("survival"), stats("conditional"),
                   *(np.asarray(data[f], np.int64) for f in ("accept_hist", "full_hist", "suggest_hist")))
