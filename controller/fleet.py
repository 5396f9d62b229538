"""Metrics from the collectors' mergeable aggregates (DESIGN §7: a fleet beyond one machine).

Replicas that ship per-(mode, depth, bin) aggregates instead of raw rows are
merged here in one vectorised sum (``Aggregate.merge`` pairwise would copy
every array once per replica), and reported with the same functions the store
path uses. Aggregates carry no request groups, so this view has no bootstrap
intervals, equal-mass ECE or AUROC.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Sequence

import numpy as np

from collectors.aggregate import Aggregate, CalibrationStats

from .metrics import acceptance

_HISTOGRAMS = ("accept_hist", "full_hist", "suggest_hist")


def merge_aggregates(aggregates: Sequence[Aggregate]) -> Aggregate:
    """The sum of ``aggregates`` (any depths; the result has the largest). Equals folding ``Aggregate.merge``."""
    if not aggregates:
        raise ValueError("aggregates: need at least one to merge")
    width = max(a.depths for a in aggregates) + 1

    def stats(kind: str) -> CalibrationStats:
        return CalibrationStats(*(_pad_depths([getattr(getattr(a, kind), f.name) for a in aggregates], width)
                                  for f in fields(CalibrationStats)))

    return Aggregate(stats("survival"), stats("conditional"),
                     *(_pad_hist([getattr(a, h) for a in aggregates], width) for h in _HISTOGRAMS))


def _pad_depths(arrays: list[np.ndarray], width: int) -> np.ndarray:
    """[modes, depths+1, bins] arrays padded on the depth axis, summed."""
    return np.sum(np.stack([np.pad(a, ((0, 0), (0, width - a.shape[1]), (0, 0))) for a in arrays]), axis=0)


def _pad_hist(arrays: list[np.ndarray], width: int) -> np.ndarray:
    """[modes, depths+1, depths+1] histograms padded on both depth axes, summed."""
    return np.sum(np.stack([np.pad(a, ((0, 0), (0, width - a.shape[1]), (0, width - a.shape[2])))
                            for a in arrays]), axis=0)


def fleet_report(aggregate: Aggregate) -> dict:
    """Per-depth survival and conditional ECE and Brier with counts, acceptance and utilization."""
    def calibration(stats: CalibrationStats) -> dict:
        ece, brier, samples = stats.ece(), stats.brier(), stats.samples()
        return {str(d): {"samples": samples[d], "ece": ece[d], "brier": brier[d]} for d in sorted(samples)}

    return {"calibration": {"survival": calibration(aggregate.survival),
                            "conditional": calibration(aggregate.conditional)},
            "acceptance": acceptance(aggregate),
            "utilization": {"upper_bound": aggregate.upper_bound_utilization(),
                            "shadow": aggregate.shadow_utilization()}}
