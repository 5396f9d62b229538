"""Store metrics over real DuckDB files: agreement with the collectors' aggregate, the censored view, tier misses,
baseline ratios and consistency checks."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.wire import flatten, from_dicts
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.queries import Slice, Window
from tests.conftest import T0, ingest_synthetic, with_columns


def test_store_metrics_equal_the_collectors_aggregate_of_the_same_records(store):
    wire = pa.concat_tables(
        [ingest_synthetic(store, 30, T0, replica="a"), ingest_synthetic(store, 20, T0, replica="b", first_step=100)]
    )
    flat = flatten(wire)
    reference = Aggregate.from_tables(flat.requests, explode(flat), 7)
    mine = evaluate(store).aggregate
    for kind in ("survival", "conditional"):
        np.testing.assert_array_equal(getattr(mine, kind).count, getattr(reference, kind).count)
        for depth, value in getattr(reference, kind).ece().items():
            assert getattr(mine, kind).ece()[depth] == pytest.approx(value, abs=1e-12)
    for hist in ("accept_hist", "full_hist", "suggest_hist"):
        np.testing.assert_array_equal(getattr(mine, hist), getattr(reference, hist))
    assert mine.upper_bound_utilization() == pytest.approx(reference.upper_bound_utilization())
    assert mine.shadow_utilization() == pytest.approx(reference.shadow_utilization())


def test_report_keeps_the_censored_compact_view_apart(store):
    ingest_synthetic(store, 40, T0)
    report = evaluate(store).report("canary")
    json.dumps(report)  # plain JSON
    censored = store.query(
        "SELECT depth, count(*) AS n FROM depth_labels WHERE status = 'censored' GROUP BY depth"
    ).to_pylist()
    view = report["calibration"]["compact"]["survival"]
    assert {r["depth"]: r["n"] for r in censored} == {int(d): v["censored"] for d, v in view.items() if v["censored"]}
    uncensored = store.query("SELECT count(*) AS n FROM requests WHERE mode != 'compact'").column("n")[0].as_py()
    for figures in report["calibration"]["survival"].values():
        assert figures["samples"] == uncensored  # every depth of a full block is observed
        lo, hi = figures["ece_interval"]
        assert 0 <= lo <= hi and {"ece", "ece_equal_mass", "brier", "auroc", "mean_p", "rate"} <= figures.keys()
    compact = report["acceptance"]["compact"]
    assert compact["mean_committed"] == pytest.approx(compact["mean_accepted"] + 1)
    assert report["gates"]["survival_ece"]["samples"] == uncensored


def test_tier_misses_padding_and_latency_beside_the_baseline(store):
    base = ingest_synthetic(store, 50, T0, phase="baseline")
    slow = with_columns(base, phase="canary", ts=T0 + 10, step_id=1000)
    slow = slow.set_column(
        slow.schema.get_field_index("step_ms"), "step_ms", pa.compute.multiply(slow.column("step_ms"), 2.0)
    )
    slow = slow.set_column(slow.schema.get_field_index("step_id"), "step_id", pa.array(np.arange(1000, 1050)))
    store.ingest(from_dicts(slow.to_pylist()), "t")
    ingest_synthetic(store, 2, T0 + 20, phase="canary", first_step=2000, graph_hit=False, miss_reason="over_max_tier")
    evaluation = evaluate(store, Window(since=T0 + 5))
    report = evaluation.report("canary")
    assert report["tiers"]["steps"] == 52 and report["tiers"]["misses"] == {"over_max_tier": 2}
    assert report["tiers"]["miss_rate"] == pytest.approx(2 / 52)
    assert report["tiers"]["padding_ratio"] == 0.0  # synthetic steps fill their tier exactly
    gates = evaluation.measurements("canary")
    assert gates["tier_miss_rate"].value == pytest.approx(2 / 52)
    base_p99 = float(np.quantile(base.column("step_ms").to_numpy(), 0.99))
    assert report["baseline"]["latency"]["32-63"]["p99_ms"] == pytest.approx(base_p99)
    # Reported beside the window, never gated: latency gates compare with a concurrent control.
    assert report["latency"]["32-63"]["p99_ms"] == pytest.approx(2 * base_p99, rel=0.1)
    assert "p99_step_ratio" not in gates and "tokens_per_s_ratio" not in gates


def test_the_tier_miss_rate_is_the_treatments_not_diluted_by_the_control_epochs(store):
    """Control epochs verify static: their layouts always hit, so counting them read a treatment missing 10%
    of its steps as 5%, under a gate of 2% one miss rate from passing a fault twice its size."""
    ingest_synthetic(store, 100, T0, phase="canary", arm="control", epoch=1)
    ingest_synthetic(store, 90, T0 + 2, phase="canary", first_step=1000, arm="treatment", epoch=0)
    ingest_synthetic(store, 10, T0 + 3, phase="canary", first_step=2000, arm="treatment", epoch=0,
                     graph_hit=False, miss_reason="over_max_tier")  # fmt: skip
    evaluation = evaluate(store, Window(since=T0 - 1))
    gate = evaluation.measurements("canary")["tier_miss_rate"]
    assert (gate.value, gate.samples) == (pytest.approx(0.1), 100)
    assert evaluation.report("canary")["tiers"]["miss_rate"] == pytest.approx(10 / 200)  # the fleet's, reported


def test_consistency_checks_are_counted_per_kind(store):
    store.record_consistency(
        [
            {"received_at": T0, "replica_id": "a", "request_id": "x", "kind": "greedy_replay", "tokens": 5},
            {
                "received_at": T0,
                "replica_id": "a",
                "request_id": "y",
                "kind": "greedy_replay",
                "tokens": 5,
                "mismatch_at": 3,
                "expected": 1,
                "got": 2,
            },
            {"received_at": T0, "replica_id": "b", "request_id": "z", "kind": "state_rollback", "tokens": 9},
        ]
    )
    gates = evaluate(store).measurements("canary")
    assert (gates["consistency_mismatches"].value, gates["consistency_mismatches"].samples) == (1.0, 2)
    assert (gates["state_rollback_failures"].value, gates["state_rollback_failures"].samples) == (0.0, 1)
    only_b = evaluate(store, slice_=Slice(replica_id="b")).measurements("canary")
    assert only_b["consistency_mismatches"].samples == 0


def test_an_empty_store_measures_nothing(store):
    gates = evaluate(store).measurements("shadow")
    assert gates["survival_ece"].value is None and gates["upper_bound_utilization"].value is None
    assert gates["consistency_mismatches"].value == 0.0 and gates["consistency_mismatches"].samples == 0
    assert evaluate(store).as_of is None
    json.dumps(evaluate(store).report("shadow"))


def _mean_full_accept(wire: pa.Table) -> float:
    rows = [r for reqs in wire.column("requests").to_pylist() for r in reqs]
    full = [r["full_accept"] for r in rows if r["mode"] != "compact" and r["full_accept"] is not None]
    return sum(full) / len(full)


def test_accepted_length_ratio_compares_the_window_with_the_shadow_reference(store):
    shadow = ingest_synthetic(store, 60, T0, phase="shadow")
    later = ingest_synthetic(store, 60, T0 + 100, phase="canary", first_step=60)
    measured = evaluate(store, Window(since=T0 + 100)).measurements("canary")["accepted_length_ratio"]
    assert measured.value == pytest.approx(_mean_full_accept(later) / _mean_full_accept(shadow))
    assert measured.samples == sum(
        r["mode"] != "compact" and r["full_accept"] is not None for reqs in later.column("requests").to_pylist()
        for r in reqs
    )  # fmt: skip
    itself = evaluate(store, Window(until=T0 + 100)).measurements("shadow")["accepted_length_ratio"]
    assert itself.value == pytest.approx(1.0)


def test_without_shadow_the_baseline_is_the_acceptance_reference_and_without_either_there_is_none(store):
    assert evaluate(store).measurements("canary")["accepted_length_ratio"].value is None
    base = ingest_synthetic(store, 40, T0, phase="baseline")
    later = ingest_synthetic(store, 40, T0 + 100, phase="compact", first_step=40)
    measured = evaluate(store, Window(since=T0 + 100)).measurements("compact")["accepted_length_ratio"]
    assert measured.value == pytest.approx(_mean_full_accept(later) / _mean_full_accept(base))


def test_every_figure_from_the_rows_equals_the_figure_from_the_sums(store):
    from sparkgate.controller.evaluate import OptionalReads

    for i, (phase, replica) in enumerate([("shadow", "r0"), ("shadow", "r1"), ("compact", "r0"), ("compact", "r1")]):
        ingest_synthetic(store, 60, T0 + 100 * (i // 2), phase, replica, first_step=1000 * i)
    reads = OptionalReads(shadow_reference=True, per_replica=True, windowed_reference=True, windowed_replicas=True,
                          fine_bins=True)  # fmt: skip
    sums, rows = (evaluate(store, Window(since=T0 + 95), resamples=20, use_sums=u, **reads) for u in (True, False))
    a, b = sums.measurements("compact"), rows.measurements("compact")
    for metric in ("survival_ece_drift", "survival_ece_debiased_replica", "windowed_ece_drift",
                   "windowed_ece_drift_replica"):  # fmt: skip
        assert a[metric].value is not None and a[metric].value == pytest.approx(b[metric].value, abs=1e-9), metric
        assert a[metric].samples == b[metric].samples, metric
