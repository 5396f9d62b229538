"""Mergeable sufficient statistics: how a fleet reports calibration without shipping rows.

Per (mode, depth, bin) an ``Aggregate`` keeps the count, Σp, Σy and Σ(p−y)², for
survival (S_k against y_k over observed rows) and conditional calibration (c_k
against 1[a* >= k] over rows at risk), plus window/accept histograms. Counts and
Σy are integers, so merging is exact; Σp and Σ(p−y)² are float sums, so a merged
figure equals the single-pass one up to float rounding. ECE, Brier and the
reliability diagram derive from these sums alone (docs/design.md §2): 15 equal-width
bins ``[k/15, (k+1)/15)``, the last one closed so that p = 1 lands in it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgate.collectors.labels import ACCEPTED, CENSORED, REJECTED, mode_codes
from sparkgate.collectors.schema import MODES, Problem
from sparkgate.collectors.validate import MAX_GAMMA
from sparkgate.policies.binning import EDGES, N_BINS, bin_index
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

HISTOGRAMS = ("accept_hist", "full_hist", "suggest_hist")


@dataclass
class CalibrationStats:
    """Arrays shaped [len(MODES), depths + 1, N_BINS]; depth index 0 is unused (depths start at 1)."""

    count: np.ndarray
    sum_p: np.ndarray
    sum_y: np.ndarray
    sum_sq: np.ndarray

    @classmethod
    def empty(cls, depths: int) -> CalibrationStats:
        shape = (len(MODES), depths + 1, N_BINS)
        return cls(np.zeros(shape, np.int64), np.zeros(shape), np.zeros(shape, np.int64), np.zeros(shape))

    @classmethod
    def from_rows(
        cls, mode: np.ndarray, depth: np.ndarray, p: np.ndarray, y: np.ndarray, depths: int
    ) -> CalibrationStats:
        stats = cls.empty(depths)
        index = np.ravel_multi_index((mode, depth, bin_index(p)), stats.count.shape)
        size = stats.count.size
        stats.count += np.bincount(index, minlength=size).reshape(stats.count.shape)
        stats.sum_p += np.bincount(index, p, minlength=size).reshape(stats.count.shape)
        stats.sum_y += np.bincount(index, y, minlength=size).astype(np.int64).reshape(stats.count.shape)
        stats.sum_sq += np.bincount(index, (p - y) ** 2, minlength=size).reshape(stats.count.shape)
        return stats

    def padded(self, depths: int) -> CalibrationStats:
        extra = depths + 1 - self.count.shape[1]
        return CalibrationStats(*(np.pad(a, ((0, 0), (0, extra), (0, 0))) for a in self._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.count, self.sum_p, self.sum_y, self.sum_sq

    def merge(self, other: CalibrationStats) -> CalibrationStats:
        depths = max(self.count.shape[1], other.count.shape[1]) - 1
        a, b = self.padded(depths), other.padded(depths)
        return CalibrationStats(*(x + y for x, y in zip(a._arrays(), b._arrays())))

    def select(self, modes: tuple[str, ...]) -> CalibrationStats:
        """Statistics summed over ``modes`` (still with a mode axis of length 1)."""
        keep = [MODES.index(m) for m in modes]
        return CalibrationStats(*(a[keep].sum(axis=0, keepdims=True) for a in self._arrays()))

    def ece(self, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> dict[int, float]:
        """Expected calibration error per depth with samples (depths without samples are left out)."""
        s = self.select(modes)
        n = s.count[0].sum(axis=1)
        gap = np.abs(s.sum_p[0] - s.sum_y[0]).sum(axis=1)
        return {d: float(gap[d] / n[d]) for d in range(1, len(n)) if n[d]}

    def brier(self, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> dict[int, float]:
        s = self.select(modes)
        n = s.count[0].sum(axis=1)
        return {d: float(s.sum_sq[0, d].sum() / n[d]) for d in range(1, len(n)) if n[d]}

    def samples(self, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> dict[int, int]:
        n = self.select(modes).count[0].sum(axis=1)
        return {d: int(n[d]) for d in range(1, len(n)) if n[d]}

    def reliability(self, depth: int, modes: tuple[str, ...] = FULL_BLOCK_MODES) -> list[dict]:
        """Per non-empty bin: its edges, count, mean prediction and observed frequency."""
        s = self.select(modes)
        return [
            {
                "lo": float(EDGES[b]),
                "hi": float(EDGES[b + 1]),
                "count": int(s.count[0, depth, b]),
                "mean_p": float(s.sum_p[0, depth, b] / s.count[0, depth, b]),
                "freq_y": float(s.sum_y[0, depth, b] / s.count[0, depth, b]),
            }
            for b in range(N_BINS)
            if s.count[0, depth, b]
        ]


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
    def from_tables(cls, requests: pa.Table, labels: pa.Table, depths: int) -> Aggregate:
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
    def observed_labels(self) -> int:
        """Depth labels with an outcome (every one but the censored) behind this aggregate."""
        return int(self.survival.count.sum())

    @property
    def depths(self) -> int:
        return self.accept_hist.shape[-1] - 1

    def merge(self, other: Aggregate) -> Aggregate:
        width = max(self.depths, other.depths) + 1
        return Aggregate(
            self.survival.merge(other.survival),
            self.conditional.merge(other.conditional),
            *(_pad_hist(getattr(self, f), width) + _pad_hist(getattr(other, f), width) for f in HISTOGRAMS),
        )

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
        out = {
            f"{kind}.{f.name}": getattr(getattr(self, kind), f.name).tolist()
            for kind in ("survival", "conditional")
            for f in fields(CalibrationStats)
        }
        out.update({f: getattr(self, f).tolist() for f in HISTOGRAMS})
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Aggregate:
        """Inverse of ``to_dict``; raises ``AggregateError`` listing every problem (field and value)."""
        arrays, problems = _parse_arrays(data)
        if problems:
            raise AggregateError(problems)
        stats = {
            kind: CalibrationStats(*(arrays[f"{kind}.{f.name}"] for f in fields(CalibrationStats)))
            for kind in ("survival", "conditional")
        }
        return cls(stats["survival"], stats["conditional"], *(arrays[h] for h in HISTOGRAMS))


# One report covers one replica's interval. The bound keeps every count exact in
# float64 and leaves a million reports' sum far inside int64.
MAX_REPORT_COUNT = 2**40
_STATS_KEYS = tuple(f"{kind}.{f.name}" for kind in ("survival", "conditional") for f in fields(CalibrationStats))


class AggregateError(ValueError):
    """A reported aggregate that cannot be merged; ``problems`` names every field at fault."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


def _numbers(value: Any) -> np.ndarray | None:
    """float64 of a rectangular nested list of JSON numbers; None for anything else (ragged
    lists, booleans, strings, nulls, or numbers too large for a float)."""
    try:
        objects = np.asarray(value, dtype=object)
        if all(type(x) in (int, float) for x in objects.flat):  # type(): a bool is no count
            return objects.astype(np.float64)
    except (ValueError, OverflowError):
        pass
    return None


def _parse_arrays(data: Any) -> tuple[dict[str, np.ndarray], list[Problem]]:
    """Typed arrays of a ``to_dict`` payload, and every reason it is not one."""
    if not isinstance(data, dict):
        return {}, [Problem("<aggregate>", type(data).__name__, "expected an object of arrays")]
    problems = [Problem(k, None, "missing") for k in _STATS_KEYS + HISTOGRAMS if k not in data]
    problems += [Problem(k, None, "unknown key") for k in sorted(set(data) - set(_STATS_KEYS + HISTOGRAMS))]
    arrays = {}
    for key in (k for k in _STATS_KEYS + HISTOGRAMS if k in data):
        numbers = _numbers(data[key])
        if numbers is None:
            problems.append(Problem(key, "<array>", "expected a rectangular array of numbers"))
        else:
            arrays[key] = numbers
    if problems:
        return {}, problems
    width = arrays["accept_hist"].shape[-1] if arrays["accept_hist"].ndim == 3 else -1
    if not 2 <= width <= MAX_GAMMA + 1:
        return {}, [
            Problem(
                "accept_hist",
                list(arrays["accept_hist"].shape),
                f"expected shape [{len(MODES)}, depths + 1, depths + 1] with 1 <= depths <= {MAX_GAMMA}",
            )
        ]
    for key, a in arrays.items():
        shape = (len(MODES), width, N_BINS if key in _STATS_KEYS else width)
        integral = not key.endswith(("sum_p", "sum_sq"))
        if a.shape != shape:
            problems.append(Problem(key, list(a.shape), f"expected shape {list(shape)}"))
        elif not np.isfinite(a).all() or (a < 0).any():
            problems.append(Problem(key, "<array>", "values must be finite and >= 0"))
        elif integral and (a != np.round(a)).any():
            problems.append(Problem(key, "<array>", "counts must be integers"))
        elif integral and a.sum() > MAX_REPORT_COUNT:
            problems.append(Problem(key, float(a.sum()), f"counts above {MAX_REPORT_COUNT} in one report"))
        else:
            arrays[key] = a.astype(np.int64) if integral else a
    for kind in ("survival", "conditional"):
        count = arrays[f"{kind}.count"]
        for name in ("sum_p", "sum_y", "sum_sq"):  # each term lies in [0, 1]
            total = arrays[f"{kind}.{name}"]
            if count.shape == total.shape and count.dtype == np.int64 and (total > count + 1e-9 * count).any():
                problems.append(Problem(f"{kind}.{name}", "<array>", f"exceeds {kind}.count in some bin"))
    return arrays, problems
