"""Online metrics over an evaluation window (docs/design.md §2, §6): what gates judge and ``report`` prints.

``controller.evaluate`` reads one window and slice from the store and returns
an ``Evaluation``; ``Evaluation.report()`` is the JSON form and
``Evaluation.measurements(phase)`` the gate inputs. Every figure carries its
sample count. Calibration and utilization come from the collectors'
``Aggregate`` built from the store (so the store path and the fleet path of
``controller.fleet`` compute them identically); bootstrap intervals, equal-mass
ECE and AUROC come from ``controller.calibration``.

Gated figures use the full-block modes (static, shadow, cap_accept); the compact
view is reported apart under ``compact``: its observed labels plus those recovered
from later tokens (``collectors.recovery``), with the recovered, estimated and
still censored counts per depth. Recovered labels count as observed everywhere.
Latency and throughput are gated against a concurrent control
(``controller.comparison``); the per-bucket latency of the window and of the
baseline phase are reported beside them, never gated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.schema import MODES
from sparkgate.policies.gate import ESTIMATED_SUFFIX
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES, CheckKind

from . import queries
from .calibration import Calibration, KindStats, null_ece
from .calibration_drift import curve_drift, worst_replica_curve_drift
from .calibration_gates import debiased_ece, drift_ece, worst_replica_debiased_ece
from .compact_calibration import compact_ece
from .measurement import Measurement
from .queries import Slice, Window
from .window_sums import COMPACT_COUNTS

BOOTSTRAP_RESAMPLES = 200
# The measurement of a gate with use_estimated (``Gate.measured_as``).
ESTIMATED_KEY = "compact_survival_ece" + ESTIMATED_SUFFIX
INTERVAL_LEVEL = 0.95


@dataclass
class Evaluation:
    """Everything measured over one window and slice."""

    window: Window
    slice: Slice
    aggregate: Aggregate
    survival: KindStats
    conditional: KindStats
    windowed: KindStats | None  # survival over the windowed labels (docs/design.md §2); None: not read
    # Per status of the compact view (censored, recovered, estimated): labels per depth.
    compact_counts: dict[str, dict[int, int]]
    intervals: dict[str, dict[int, tuple[float, float, float]]]  # per kind and depth: (low, high, se)
    steps: pa.Table | None  # per load bucket; None when the slice selects requests within steps
    baseline: pa.Table | None
    misses: dict[str, int]
    consistency: dict[str, dict[str, int]]
    as_of: float | None = field(default=None)  # newest step in the window
    # (sum of a*, full-block rows) recorded in shadow (in baseline when no shadow ran): the acceptance reference
    reference_accept: tuple[int, int] = (0, 0)
    labels: int = 0  # depth labels in the window, every status
    # Per depth and bin: estimated compact labels' count, sum of S_k and of P(y = 1); None when there are none.
    estimated: np.ndarray | None = None
    # The survival calibration recorded in shadow under the judged contract (None: not asked for).
    shadow_reference: Calibration | None = None
    # Each replica's survival calibration in the window (None: not asked for).
    replicas: dict[str, Calibration] | None = None
    # The windowed labels recorded in shadow under the judged contract (None: not asked for), each
    # replica's windowed labels in the window (None: not asked for), and the (resamples, seed) their
    # drift is bootstrapped with.
    windowed_reference: KindStats | None = None
    windowed_replicas: dict[str, KindStats] | None = None
    resampling: tuple[int, int] = (BOOTSTRAP_RESAMPLES, 0)

    # -- gate inputs ---------------------------------------------------------
    def measurements(self, phase: str, looks: int = 1) -> dict[str, Measurement]:
        """One ``Measurement`` per metric of ``policies.gate.METRICS`` for a controller in ``phase``, at
        the ``looks``-th evaluation of the stage (the debiased ECE spends its error rate over looks)."""
        stats = self.aggregate.survival
        ece, samples = stats.ece(), stats.samples()
        upper = {d: hi for d, (_, hi, _) in self.intervals["survival"].items()}
        least = min(samples.values(), default=0)
        now = Calibration(ece, null_ece(stats), self.intervals["survival"], least)
        checks = {kind: self.consistency.get(kind, {"checks": 0, "mismatches": 0}) for kind in CheckKind}
        # The treatment's steps whose engine reports graph hits and misses: a control epoch's static layouts
        # would dilute a miss rate the treatment's ragged layouts cause (to half of it under switchback).
        tier_steps = self._total("treated_tier_steps")
        return {
            "survival_ece": Measurement(max(ece.values(), default=None), least),
            "survival_ece_upper": Measurement(max(upper.values(), default=None), least),
            "survival_ece_debiased": debiased_ece(now, looks, INTERVAL_LEVEL),
            "survival_ece_drift": self._drift(now, looks),
            "windowed_ece_drift": self._windowed_drift(looks, replicas=False),
            "windowed_ece_drift_replica": self._windowed_drift(looks, replicas=True),
            "survival_ece_debiased_replica": (
                worst_replica_debiased_ece(self.replicas, looks, INTERVAL_LEVEL)
                if self.replicas is not None
                else Measurement(None, 0, why="per-replica calibration not read")
            ),
            "upper_bound_utilization": self._utilization("shadow" if phase == "shadow" else "cap_accept"),
            "tier_miss_rate": Measurement(
                self._total("treated_misses") / tier_steps if tier_steps else None, tier_steps
            ),
            "compact_survival_ece": compact_ece(stats, self.compact_counts, None),
            ESTIMATED_KEY: compact_ece(stats, self.compact_counts, self._estimated()),
            "accepted_length_ratio": self._accepted_length_ratio(),
            # A count with no checks is 0 of 0: min_samples decides whether that suffices.
            "consistency_mismatches": Measurement(
                float(checks[CheckKind.GREEDY_REPLAY]["mismatches"]), checks[CheckKind.GREEDY_REPLAY]["checks"]
            ),
            "state_rollback_failures": Measurement(
                float(checks[CheckKind.STATE_ROLLBACK]["mismatches"]), checks[CheckKind.STATE_ROLLBACK]["checks"]
            ),
        }

    def _drift(self, now: Calibration, looks: int) -> Measurement:
        if self.shadow_reference is None or not self.shadow_reference.samples:
            return Measurement(None, 0, why="no shadow reference under this contract")
        return drift_ece(now, self.shadow_reference, looks, INTERVAL_LEVEL)

    def _windowed_drift(self, looks: int, replicas: bool) -> Measurement:
        reference, resamples, seed = self.windowed_reference, *self.resampling
        if reference is None or self.windowed is None:
            return Measurement(None, 0, why="windowed labels not read")
        if not replicas:
            return curve_drift(self.windowed, reference, resamples, looks, INTERVAL_LEVEL, seed)
        if self.windowed_replicas is None:
            return Measurement(None, 0, why="per-replica windowed labels not read")
        return worst_replica_curve_drift(self.windowed_replicas, reference, resamples, looks, INTERVAL_LEVEL, seed)

    def _estimated(self) -> np.ndarray:
        return self.estimated if self.estimated is not None else np.zeros((1, 1, 3))

    def _accepted_length_ratio(self) -> Measurement:
        """Mean a* of the window's full-block rows over the reference's: a drafter that got worse shows here
        in every mode alike, whatever the windows."""
        full = self.aggregate.full_hist[[MODES.index(m) for m in FULL_BLOCK_MODES]].sum(axis=(0, 1))
        rows = int(full.sum())
        total, reference_rows = self.reference_accept
        if not rows or not reference_rows or not total:
            return Measurement(None, rows)
        mean = float((full * np.arange(full.size)).sum()) / rows
        return Measurement(mean / (total / reference_rows), rows)

    def _utilization(self, mode: str) -> Measurement:
        if mode == "shadow":
            return Measurement(
                self.aggregate.shadow_utilization(), int(self.aggregate.suggest_hist[MODES.index("shadow")].sum())
            )
        return Measurement(
            self.aggregate.upper_bound_utilization(), int(self.aggregate.full_hist[MODES.index("cap_accept")].sum())
        )

    def _total(self, column: str) -> int:
        return int(sum(self.steps.column(column).to_pylist())) if self.steps is not None else 0

    # -- report --------------------------------------------------------------
    def report(self, phase: str | None = None) -> dict:
        """The JSON form: calibration per depth, acceptance, utilization, tiers, latency, throughput,
        consistency, and (with ``phase``) the gate measurements."""
        out = {
            "window": {"since": self.window.since, "until": self.window.until},
            "slice": self.slice.to_dict(),
            "as_of": self.as_of,
            "calibration": {
                "survival": self._calibration(self.survival, "survival"),
                "conditional": self._calibration(self.conditional, "conditional"),
                "compact": {
                    "survival": _compact_view(self.survival, self.compact_counts),
                    "conditional": _compact_view(self.conditional, self.compact_counts),
                },
            },
            "acceptance": acceptance(self.aggregate),
            "utilization": {
                "upper_bound": self._utilization("cap_accept").to_dict(),
                "shadow": self._utilization("shadow").to_dict(),
            },
            "consistency": {kind: self.consistency.get(kind, {"checks": 0, "mismatches": 0}) for kind in CheckKind},
        }
        if self.steps is not None:
            out.update(step_report(self.steps, self.misses))
            out["label_yield"] = self._label_yield()
            out["baseline"] = {"latency": latency(self.baseline)} if self.baseline is not None else None
        if phase is not None:
            out["gates"] = {k: m.to_dict() for k, m in self.measurements(phase).items()}
        return out

    def _label_yield(self) -> dict:
        """Uncensored labels per verified row, without and with recovery: what lowering ``observe_fraction``
        would give up (every cap_accept row pays γ + 1 rows for γ uncensored labels)."""
        unknown = {s: sum(self.compact_counts[s].values()) for s in COMPACT_COUNTS}
        observed = self.labels - sum(unknown.values())
        rows = self._total("verify_rows")
        return {
            "verify_rows": rows,
            "observed": observed,
            "recovered": unknown["recovered"],
            "per_verify_row": observed / rows if rows else None,
            "per_verify_row_with_recovery": (observed + unknown["recovered"]) / rows if rows else None,
        }

    def _calibration(self, kind: KindStats, name: str) -> dict:
        stats = kind.calibration_stats()
        ece, brier, samples, null = stats.ece(), stats.brier(), stats.samples(), null_ece(stats)
        equal_mass, auroc, curve = kind.equal_mass_ece(), kind.auroc(), kind.curve()
        return {
            str(d): {
                "samples": samples[d],
                "ece": ece[d],
                "ece_null": null[d],
                "ece_debiased": ece[d] - null[d],
                "ece_interval": self.intervals[name][d][:2] if d in self.intervals[name] else None,
                "ece_equal_mass": equal_mass[d],
                "brier": brier[d],
                "auroc": auroc.get(d),
                "mean_p": curve[d]["mean_p"],
                "rate": curve[d]["rate"],
            }
            for d in sorted(samples)
        }


def _tokens_per_s(row: dict) -> float:
    return (row["tokens"] or 0) / row["busy_s"] if row["busy_s"] else 0.0


def _compact_view(kind: KindStats, counts: dict[str, dict[int, int]]) -> dict:
    """The compact arm's figures over the labels it observed or recovered, with how many of those were
    recovered and how many stay estimated or censored; biased by what stays censored, so never gated."""
    stats = kind.calibration_stats()
    ece, samples, curve = stats.ece(("compact",)), stats.samples(("compact",)), kind.curve(("compact",))
    return {
        str(d): {
            "samples": samples[d],
            **{status: counts[status].get(d, 0) for status in COMPACT_COUNTS},
            "ece": ece[d],
            "mean_p": curve[d]["mean_p"],
            "rate": curve[d]["rate"],
        }
        for d in sorted(samples)
    }


def acceptance(aggregate: Aggregate) -> dict:
    """Per mode: request rows, mean window, mean accepted and mean committed (accepted + 1) length."""
    out = {}
    for m, mode in enumerate(MODES):
        hist = aggregate.accept_hist[m]
        n = int(hist.sum())
        if n:
            window, accepted = np.indices(hist.shape)
            mean_accepted = float((hist * accepted).sum() / n)
            out[mode] = {
                "requests": n,
                "mean_window": float((hist * window).sum() / n),
                "mean_accepted": mean_accepted,
                "mean_committed": mean_accepted + 1,
            }
    return out


def latency(buckets: pa.Table) -> dict:
    """Per load bucket: steps, step-time p50/p95/p99 (ms) and committed tokens per busy second."""
    return {
        queries.load_bucket_label(r["bucket"]): {
            "steps": r["steps"],
            "p50_ms": r["p50_ms"],
            "p95_ms": r["p95_ms"],
            "p99_ms": r["p99_ms"],
            "tokens_per_s": _tokens_per_s(r),
        }
        for r in buckets.to_pylist()
    }


def step_report(buckets: pa.Table, misses: dict[str, int]) -> dict:
    rows = buckets.to_pylist()
    steps = sum(r["steps"] for r in rows)
    reported = sum(r["tier_steps"] for r in rows)  # steps whose engine reports graph hits and misses
    missed = sum(r["misses"] for r in rows)
    tier_rows = sum(r["hit_tier_rows"] for r in rows)
    tokens, busy = sum(r["tokens"] or 0 for r in rows), sum(r["busy_s"] for r in rows)
    return {
        "tiers": {
            "steps": reported,
            "unreported_steps": steps - reported,
            "hit_rate": (reported - missed) / reported if reported else None,
            "miss_rate": missed / reported if reported else None,
            "misses": misses,
            "padding_ratio": sum(r["padding_rows"] for r in rows) / tier_rows if tier_rows else None,
        },
        "latency": latency(buckets),
        "throughput": {
            "steps": steps,
            "committed_tokens": tokens,
            "busy_s": busy,
            "tokens_per_s": tokens / busy if busy else None,
        },
    }
