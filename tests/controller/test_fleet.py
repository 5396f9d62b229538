"""Fleet aggregates: the vectorised merge equals the pairwise fold."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten
from sparkgate.controller.fleet import fleet_report, merge_aggregates


def aggregate(seed: int, gamma: int) -> Aggregate:
    flat = flatten(synthetic_wire(3, 8, gamma, seed=seed))
    return Aggregate.from_tables(flat.requests, explode(flat), gamma)


def test_merge_equals_folding_pairwise_merges_across_depths():
    parts = [aggregate(seed, gamma) for seed, gamma in enumerate([4, 7, 5, 7, 3])]
    merged, folded = merge_aggregates(parts), functools.reduce(Aggregate.merge, parts)
    assert merged.depths == 7
    for kind in ("survival", "conditional"):
        for field in ("count", "sum_y"):
            np.testing.assert_array_equal(getattr(getattr(merged, kind), field), getattr(getattr(folded, kind), field))
        np.testing.assert_allclose(getattr(merged, kind).sum_p, getattr(folded, kind).sum_p, rtol=1e-12)
    for hist in ("accept_hist", "full_hist", "suggest_hist"):
        np.testing.assert_array_equal(getattr(merged, hist), getattr(folded, hist))
    report = fleet_report(merged)
    assert report["calibration"]["survival"]["7"]["samples"] == folded.survival.samples()[7]
    assert report["utilization"]["upper_bound"] == pytest.approx(folded.upper_bound_utilization())
    with pytest.raises(ValueError, match="aggregates"):
        merge_aggregates([])
