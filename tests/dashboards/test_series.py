"""Time series over a window: summed over the buckets they equal the controller's window evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.queries import Window
from sparkgate.dashboards import series
from sparkgate.dashboards.source import open_snapshot_reader
from tests.dashboards.known_store import MISSES, SHADOW_STEPS


def test_series_sum_to_the_window_evaluation(fixture_store):

    reader = open_snapshot_reader(fixture_store.snapshot_dir)
    since, until = 1.75e9 + 4, 1.75e9 + 10
    one = series.calibration(reader, reader.token, since, until, since, until - since)
    reference = evaluate(reader, Window(since, until))
    ece, samples = reference.aggregate.survival.ece(), reference.aggregate.survival.samples()
    assert dict(zip(one["depth"], one["ece"])) == pytest.approx(ece, abs=1e-12)
    many = series.calibration(reader, reader.token, since, until, since, 0.5)
    assert many.groupby("depth")["samples"].sum().to_dict() == samples
    utilization = series.acceptance_series(reader, reader.token, since, until, since, until - since)
    row = utilization[utilization["series"].str.startswith("upper-bound")].iloc[0]
    assert row["value"] == pytest.approx(reference.aggregate.upper_bound_utilization())
    tiers = series.tier_series(reader, reader.token, since, until, since, 1.0)
    misses = tiers[tiers["series"] == "miss rate (all reasons)"]
    assert (misses["value"] * misses["samples"]).sum() == pytest.approx(MISSES)
    assert np.isclose(misses["samples"].sum(), SHADOW_STEPS)
