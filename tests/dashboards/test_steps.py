"""Step-table aggregates against the fixture store (see tests/dashboards/known_store.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from sparkgate.controller import served_steps
from sparkgate.dashboards import steps
from sparkgate.dashboards.source import open_snapshot_reader
from tests.conftest import T0, ingest_synthetic
from tests.dashboards.known_store import MISSES, SHADOW_STEPS

ROWS = 16 * 8  # the fixture's steps: 16 requests at gamma 7, run in their exact tier


@pytest.fixture(scope="module")
def reader(fixture_store):
    return open_snapshot_reader(fixture_store.snapshot_dir)


def test_tier_histogram_splits_hits_by_tier_and_misses_by_reason(reader):
    everything = steps.tier_histogram(reader, reader.token, None, None).to_dict("records")
    assert [(r["tier"], r["graph_hit"], r["steps"]) for r in everything] == [
        (str(ROWS), True, 300 - MISSES),
        ("eager: over_max_tier", False, MISSES),
    ]
    assert everything[0]["mean_verify_rows"] == ROWS and everything[0]["mean_padding_rows"] == 0
    shadow = steps.tier_histogram(reader, reader.token, T0 + 4, None)
    assert shadow["steps"].sum() == SHADOW_STEPS


def test_step_cost_and_prediction_error(reader):
    cost = steps.step_cost(reader, reader.token, None, None).to_dict("records")
    assert len(cost) == 1 and (cost[0]["verify_rows"], cost[0]["cost_table_version"], cost[0]["steps"]) == (
        ROWS,
        "ct-1",
        300,
    )
    measured = reader.query("SELECT step_ms FROM steps").column("step_ms").to_numpy()
    assert [cost[0][f"p{q}_ms"] for q in (10, 50, 90)] == pytest.approx(np.quantile(measured, [0.1, 0.5, 0.9]))
    hist, summary = steps.prediction_error(reader, reader.token, None, None)
    # Synthetic steps record their plan's price alone, no table prediction at the rows they ran: no error to show
    # (the page read the plan's price, equal to the step's time here, as a perfect table).
    assert hist.empty and summary["steps"] == 0


def test_prediction_error_is_relative_to_the_measured_time_as_adaptive_reads_it(store):
    ingest_synthetic(store, 10, T0, step_ms=10.0, table_step_ms=8.0)
    hist, summary = steps.prediction_error(store, "relative-to-measured", None, None)
    assert summary["steps"] == 10 and summary["median_abs"] == pytest.approx(0.2)  # not 0.25: / measured
    assert summary["bias"] == pytest.approx(0.2)  # positive: slower than predicted
    assert hist.to_dict("records") == [{"error": 0.2, "steps": 10}]
    adaptive = served_steps.relative_errors({"predicted": [8.0] * 10, "ms": [10.0] * 10})  # the gate's definition
    assert float(np.median(adaptive)) == pytest.approx(summary["median_abs"])


def test_fleet_reports_each_replicas_newest_versions_and_rates(reader):
    fleet = steps.fleet(reader, reader.token).set_index("replica_id")
    assert list(fleet.index) == ["r0", "r1"]
    assert fleet.loc["r0", "sts_version"] == "sts-a" and pd.isna(fleet.loc["r1", "sts_version"])  # r1 runs without
    assert list(fleet["contract"]) == ["contract-1", "contract-1"]
    assert list(fleet["steps"]) == [200, 100] and list(fleet["phase"]) == ["shadow", "shadow"]
    assert list(fleet["quarantined"]) == [0, 0]
    # All of a replica's steps fall within its last minute of data, which they span in seconds: the rate is
    # over the time they span, not over the whole minute.
    for replica, n in (("r0", 200), ("r1", 100)):
        ts = reader.query("SELECT ts FROM steps WHERE replica_id = ?", [replica]).column("ts").to_numpy()
        assert ts.max() - ts.min() < steps.RATE_WINDOW_S / 10
        assert math.isclose(fleet.loc[replica, "steps_per_s"], (n - 1) / (ts.max() - ts.min()))
    assert math.isclose(fleet.loc["r1", "request_rows_per_s"], 16 * fleet.loc["r1", "steps_per_s"])


def test_the_switchback_schedule_as_it_ran(tmp_path):
    from sparkgate.collectors.store import Store
    from tests.conftest import ingest_synthetic

    with Store(tmp_path / "events.duckdb") as store:
        for epoch, arm in ((0, "treatment"), (1, "control")):
            ingest_synthetic(store, 5, T0 + epoch, replica="r0", first_step=10 * epoch, epoch=epoch, arm=arm,
                             policy_revision=3)  # fmt: skip
        ingest_synthetic(store, 5, T0 + 9, replica="r0", first_step=100, policy_revision=2)
        store.snapshot(tmp_path / "snapshots")
    reader = open_snapshot_reader(tmp_path / "snapshots")
    epochs = steps.switchback_epochs(reader, reader.token, 3)
    assert list(zip(epochs["epoch"], epochs["arm"], epochs["steps"])) == [(0, "treatment", 5), (1, "control", 5)]
    assert steps.switchback_epochs(reader, reader.token, 2).empty  # no revision up to 2 ran switchback
    after = steps.switchback_epochs(reader, reader.token, 4)  # e.g. fallback after revision 3 was judged
    assert set(after["revision"]) == {3} and len(after) == 2


def test_the_prediction_error_reads_the_tables_prediction_at_the_step_time_adaptive_measures(store):
    """The page read the scheduler's price of its plan where no table prediction was recorded, and wall time
    whatever adaptive measured: an error the gate never sees."""
    ingest_synthetic(store, 10, T0, step_ms=10.0, predicted_step_ms=5.0, table_step_ms=None)
    assert steps.prediction_error(store, "plan-price-only", None, None)[1]["steps"] == 0
    ingest_synthetic(store, 10, T0 + 5, first_step=100, step_ms=10.0, step_cpu_ms=4.0, table_step_ms=5.0)
    wall = steps.prediction_error(store, "cpu-and-wall", None, None, "wall")[1]
    cpu = steps.prediction_error(store, "cpu-and-wall", None, None, "cpu")[1]
    assert wall["steps"] == cpu["steps"] == 10
    assert wall["median_abs"] == pytest.approx(0.5) and cpu["median_abs"] == pytest.approx(0.25)
