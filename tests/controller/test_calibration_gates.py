"""The calibration gates' inputs: each fails a calibrated stage no more often than its level over the
cells and looks it spends α on, passes a drafter miscalibrated by the threshold no more often, and finds
one replica's drift that the fleet's figure dilutes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.schema import MODES
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.controller.calibration import REQUEST_GROUPS, Calibration, KindStats, bootstrap_ece, null_ece
from sparkgate.controller.calibration_gates import (
    ALARM_PERIOD_S,
    debiased_ece,
    drift_ece,
    look_index,
    worst_replica_debiased_ece,
)
from sparkgate.controller.gates import judge
from sparkgate.policies.gate import Gate

STATIC = MODES.index("static")


def test_the_debiased_gate_fails_a_calibrated_stage_no_more_often_than_its_level_over_depths_and_looks():
    gate = Gate(metric="survival_ece_debiased", threshold=0.0, direction="at_most")  # the strictest threshold
    rng = np.random.default_rng(3)
    depths, runs, looks, failed_stages, caught = 3, 150, 4, 0, 0
    for run in range(runs):
        failed = False
        for shift, look in [(0.0, k) for k in range(1, looks + 1)] + [(0.12, 1)]:
            n = 3000 if shift else 600  # a miscalibration is caught once the evidence says so
            mode = np.full(n * depths, STATIC)
            depth = np.repeat(np.arange(1, depths + 1), n)
            p = rng.uniform(0.05, 0.9, len(depth))
            y = (rng.random(len(p)) < p + shift).astype(np.int64)
            group = rng.integers(0, REQUEST_GROUPS, len(p))
            kind = KindStats.from_rows(mode, depth, p, y, group, depths)
            stats = kind.calibration_stats()
            bounds = bootstrap_ece(kind, 100, seed=run)
            m = debiased_ece(Calibration(stats.ece(), null_ece(stats, seed=run), bounds, 600), look, 0.95)
            outcome = judge(gate.model_copy(update={"threshold": 0.05 if shift else 0.0}), m).outcome
            if shift:
                caught += outcome == "fail"  # a 0.12 gap against a 0.05 threshold
            else:
                failed |= outcome == "fail"
        failed_stages += failed
    assert failed_stages / runs <= 0.025 + 0.02  # one side of the level, over 3 depths and 4 looks, + sampling
    assert caught / runs >= 0.9


@pytest.mark.parametrize("metric", ["survival_ece_debiased", "survival_ece_drift"])
def test_a_drafter_miscalibrated_by_the_threshold_passes_no_more_often_than_its_level(metric):
    # A gap of 0.08 in every bin against a threshold of 0.08 (for the drift: 0.08 more than a calibrated
    # shadow's). The debiased ECE reads such a gap about a noise floor low, so a pass side built on it
    # passed this drafter in about 0.87 of runs at 2,000 labels; the plug-in ECE reads it at least 0.08.
    gate = Gate(metric=metric, threshold=0.08, direction="at_most")
    rng = np.random.default_rng(11)

    def calibration(n: int, gap: float) -> Calibration:
        p = rng.uniform(0.1, 0.95, n)  # p - 0.08 stays a probability: the gap is exact in every bin
        y = (rng.random(n) < p - gap).astype(np.int64)
        kind = KindStats.from_rows(np.full(n, STATIC), np.ones(n, np.int64), p, y, rng.integers(0, 200, n), 1)
        return Calibration.of(kind, 100, 0.95, int(rng.integers(1 << 30)))

    reference = calibration(20000, 0.0)
    runs = [calibration(2000, 0.08) for _ in range(120)]
    measured = [debiased_ece(c, 1, 0.95) if metric == "survival_ece_debiased" else drift_ece(c, reference, 1, 0.95)
                for c in runs]  # fmt: skip
    passed = sum(judge(gate, m).outcome == "pass" for m in measured)
    assert passed / len(runs) <= 0.025 + 0.04  # one side at α = 0.025, + sampling over 120 runs
    assert np.mean([m.value for m in measured]) < 0.08  # while the reported value still reads the gap low


def test_no_drift_fails_no_more_often_than_its_level_when_the_window_holds_more_labels_than_shadow():
    # The same 0.045 gap now and in shadow, the window ten times shadow's size: shadow's debiased ECE reads
    # the gap lower than the window's, so a fail side on the debiased difference would read a drift where
    # none is. Where the reference is the noisier set, the fail side starts from its plug-in ECE.
    gate = Gate(metric="survival_ece_drift", threshold=0.0, direction="at_most")  # the strictest threshold
    rng = np.random.default_rng(12)

    def calibration(n: int) -> Calibration:
        p = rng.uniform(0.1, 0.95, n)
        y = (rng.random(n) < p - 0.045).astype(np.int64)
        kind = KindStats.from_rows(np.full(n, STATIC), np.ones(n, np.int64), p, y, rng.integers(0, 200, n), 1)
        return Calibration.of(kind, 100, 0.95, int(rng.integers(1 << 30)))

    measured = [drift_ece(calibration(20000), calibration(2000), 1, 0.95) for _ in range(100)]
    assert np.mean([m.value for m in measured]) > 0.005  # the debiased difference alone reads a drift
    assert sum(judge(gate, m).outcome == "fail" for m in measured) / len(measured) <= 0.025 + 0.04


def test_the_look_index_is_the_stages_evaluation_until_its_cap():
    # One-minute intervals and a five-minute window: looks 1, 2, … until the thirtieth, whose share spent
    # at every look of a day adds up to the error rate (√(6/π² × 1440) = 29.6); every later look pays it.
    looks = [0, 1, 2, 5, 6, 29, 30, 31, 43200]
    assert [look_index(k, 60.0, 300.0) for k in looks] == [1, 1, 2, 5, 6, 29, 30, 30, 30]
    # Hourly looks: a day's share from the fourth (√(6/π² × 24) = 3.8), unless the window fills later.
    assert look_index(10**6, 3600.0, 3600.0) == 4 and look_index(10**6, 3600.0, 36000.0) == 11


@given(st.integers(0, 10**7), st.floats(1, 1e4), st.floats(1, 1e5), st.integers(0, 10**7))
def test_a_late_look_never_asks_more_than_the_caps_and_spends_at_most_alpha_per_period(look, interval, window, later):
    first, second = look_index(look, interval, window), look_index(look + later, interval, window)
    cap = look_index(10**12, interval, window)
    assert 1 <= first <= second <= cap  # never stricter than the cap's, whatever the stage's age
    assert cap >= 1 + math.ceil(window / interval)  # the growing window's looks are spent as a stage's
    # Every look past the cap spends its share; a period's looks spend at most the error rate in all.
    assert 6 / (math.pi**2 * cap**2) * (ALARM_PERIOD_S / interval) <= 1 + 1e-9
    assert sum(6 / (math.pi**2 * k**2) for k in range(1, min(cap, 10_000) + 1)) < 1


def test_a_drift_late_in_a_long_stage_is_judged_as_at_the_cap_not_deafened_by_age():
    gate = Gate(metric="survival_ece_debiased", threshold=0.05, direction="at_most")
    rng = np.random.default_rng(11)
    drifted = _calibration(rng, 3000, 0.10)
    at_cap = debiased_ece(drifted, look_index(30, 60.0, 300.0), 0.95)
    month = debiased_ece(drifted, look_index(86400 * 30 // 60, 60.0, 300.0), 0.95)
    assert month.low == at_cap.low and "look 30" in month.method
    assert judge(gate, month).outcome == "fail"
    # Counting every look from the stage's start, a month in, the same evidence would not fail it.
    uncapped = debiased_ece(drifted, 1 + 86400 * 30 // 60, 0.95)
    assert uncapped.low < month.low and judge(gate, uncapped).outcome != "fail"


def _calibration(rng, n: int, shift: float, depths: int = 2) -> Calibration:
    depth = np.repeat(np.arange(1, depths + 1), n)
    p = rng.uniform(0.05, 0.85, len(depth))
    y = (rng.random(len(p)) < p + shift).astype(np.int64)
    kind = KindStats.from_rows(np.full(len(p), STATIC), depth, p, y, rng.integers(0, REQUEST_GROUPS, len(p)), depths)
    return Calibration.of(kind, 100, 0.95, int(rng.integers(1 << 30)))


def test_the_worst_replica_gate_finds_the_one_drifting_replica_the_fleet_figure_dilutes():
    # 0.04: at 3,000 labels a calibrated replica's plug-in ECE (the pass side's start) is about 0.02.
    gate = Gate(metric="survival_ece_debiased_replica", threshold=0.04, direction="at_most")
    rng = np.random.default_rng(5)
    healthy = {f"r{i}": _calibration(rng, 3000, 0.0) for i in range(3)}
    m = worst_replica_debiased_ece(healthy, 1, 0.95)
    assert judge(gate, m).outcome == "pass" and m.samples == 3000 and "6 (replica, depth) cells" in m.method
    one_off = {**healthy, "r2": _calibration(rng, 3000, 0.1)}
    assert judge(gate, worst_replica_debiased_ece(one_off, 1, 0.95)).outcome == "fail"
    # The same drift diluted by two healthy replicas: the fleet-wide figure stays under the threshold.
    fleet = debiased_ece(_calibration(rng, 9000, 0.1 / 3), 1, 0.95)
    assert fleet.value < 0.04 and judge(gate, fleet).outcome != "fail"
    assert judge(gate, worst_replica_debiased_ece(one_off, 30, 0.95)).outcome == "fail"
    assert worst_replica_debiased_ece({}, 1, 0.95).value is None


def _scaled_survival(wire, factor: float):
    """``wire`` with every request's survivals times ``factor`` (still non-increasing, in [0, 1])."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = wire.column("requests").combine_chunks()
    rows = lists.values
    fields = list(rows.type)
    columns = []
    for i, f in enumerate(fields):
        column = rows.field(i)
        if f.name == "survival":
            column = pa.ListArray.from_arrays(column.offsets, pc.multiply(column.values, factor))
        columns.append(column)
    rebuilt = pa.ListArray.from_arrays(lists.offsets, pa.StructArray.from_arrays(columns, fields=fields))
    return wire.set_column(wire.schema.get_field_index("requests"), "requests", rebuilt)


@pytest.mark.parametrize("metric", ["survival_ece_drift", "windowed_ece_drift"])
@pytest.mark.parametrize(("factor", "outcome"), [(1.0, "pass"), (0.6, "fail")])
def test_drift_from_shadow_passes_the_same_calibration_and_fails_a_shifted_one(store, factor, outcome, metric):
    from sparkgate.collectors.wire import from_wire
    from sparkgate.controller.evaluate import evaluate
    from sparkgate.controller.queries import Window
    from tests.conftest import T0, with_columns

    for i, (phase, scale) in enumerate([("shadow", 1.0), ("canary", factor)]):
        wire = with_columns(synthetic_wire(400, 16, 5, "r0", first_step=1000 * i, seed=i, ts=T0 + 100 * i), phase=phase)
        assert store.ingest(from_wire(_scaled_survival(wire, scale)), "test").quarantined == 0
    window = Window(since=T0 + 100)
    evaluation = evaluate(store, window, resamples=100, shadow_reference=True, windowed_reference=True)
    gate = Gate(metric=metric, threshold=0.05, direction="at_most")
    m = evaluation.measurements("canary")[metric]
    assert judge(gate, m).outcome == outcome, m
    assert evaluate(store, window, resamples=10).measurements("canary")[metric].why
