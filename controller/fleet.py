"""Metrics from the collectors' mergeable aggregates (docs/design.md §7: a fleet beyond one machine).

Replicas that ship per-(mode, depth, bin) aggregates instead of raw rows are
merged here in one vectorised sum (``Aggregate.merge`` pairwise would copy
every array once per replica), and reported with the same functions the store
path uses. Aggregates carry no request groups, so this view has no bootstrap
intervals, equal-mass ECE or AUROC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from sparkgate.collectors.aggregate import HISTOGRAMS, Aggregate, CalibrationStats
from sparkgate.collectors.schema import MODES

from .metrics import acceptance


def merge_aggregates(aggregates: Sequence[Aggregate]) -> Aggregate:
    """The sum of ``aggregates`` (any depths; the result has the largest). Equals folding ``Aggregate.merge``."""
    if not aggregates:
        raise ValueError("aggregates: need at least one to merge")
    width = max(a.depths for a in aggregates) + 1

    def stats(kind: str) -> CalibrationStats:
        arrays = [[getattr(getattr(a, kind), f.name) for a in aggregates] for f in fields(CalibrationStats)]
        return CalibrationStats(*(_summed(a, (a[0].shape[0], width, a[0].shape[2])) for a in arrays))

    return Aggregate(
        stats("survival"),
        stats("conditional"),
        *(_summed([getattr(a, h) for a in aggregates], (len(MODES), width, width)) for h in HISTOGRAMS),
    )


def _summed(arrays: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """The sum of ``arrays``, each zero-padded at the end of every axis to ``shape``. Arrays of one shape
    (usually all of them: a fleet runs one γ) are summed in one stacked reduction."""
    by_shape: dict[tuple[int, ...], list[np.ndarray]] = {}
    for a in arrays:
        by_shape.setdefault(a.shape, []).append(a)
    total = np.zeros(shape, np.result_type(*arrays))
    for part_shape, parts in by_shape.items():
        total[tuple(slice(0, n) for n in part_shape)] += np.stack(parts).sum(axis=0)
    return total


def fleet_report(aggregate: Aggregate) -> dict:
    """Per-depth survival and conditional ECE and Brier with counts, acceptance and utilization."""

    def calibration(stats: CalibrationStats) -> dict:
        ece, brier, samples = stats.ece(), stats.brier(), stats.samples()
        return {str(d): {"samples": samples[d], "ece": ece[d], "brier": brier[d]} for d in sorted(samples)}

    return {
        "calibration": {"survival": calibration(aggregate.survival), "conditional": calibration(aggregate.conditional)},
        "acceptance": acceptance(aggregate),
        "utilization": {"upper_bound": aggregate.upper_bound_utilization(), "shadow": aggregate.shadow_utilization()},
    }
