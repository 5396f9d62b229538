"""The compact-traffic ECE gate input: recovered labels count, what stays censored bounds it, and estimated
labels enter only as soft outcomes when asked."""

from __future__ import annotations

import numpy as np
import pytest

from sparkgate.collectors.aggregate import CalibrationStats
from sparkgate.collectors.schema import MODES
from sparkgate.controller.compact_calibration import MAX_CENSORED_SHARE, compact_ece
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.gates import judge
from sparkgate.controller.metrics import ESTIMATED_KEY
from sparkgate.policies.binning import N_BINS
from sparkgate.policies.gate import Gate
from tests.collectors.test_recovery import ingest_in, simulate

COMPACT = MODES.index("compact")


def stats(p: float, y: list[int], depth: int = 1) -> CalibrationStats:
    n = len(y)
    return CalibrationStats.from_rows(np.full(n, COMPACT), np.full(n, depth), np.full(n, p), np.array(y), depth)


def counts(censored: int = 0, estimated: int = 0) -> dict[str, dict[int, int]]:
    return {"censored": {1: censored}, "estimated": {1: estimated}, "recovered": {}}


def test_the_ece_of_compact_labels_is_the_gap_between_prediction_and_outcome():
    m = compact_ece(stats(0.8, [1] * 60 + [0] * 40), counts(), None)
    assert m.value == pytest.approx(0.2) and m.samples == 100


def test_too_many_labels_still_censored_leave_no_value_and_say_why():
    labels = stats(0.8, [1] * 80 + [0] * 20)
    assert compact_ece(labels, counts(censored=5), None).value is not None  # 5 of 105 < 5%
    m = compact_ece(labels, counts(censored=10), None)
    assert m.value is None and m.samples == 100 and f"{MAX_CENSORED_SHARE:.0%}" in m.why
    verdict = judge(Gate(metric="compact_survival_ece", threshold=0.05, direction="at_most"), m)
    assert verdict.outcome == "inconclusive" and "still censored" in verdict.note


def test_a_depth_whose_labels_are_all_still_censored_leaves_no_value_rather_than_dropping_out():
    # Depth 1 observed and calibrated; depth 2 only censored: one observed label there or none, no value either way.
    shallow = CalibrationStats.from_rows(np.full(100, COMPACT), np.ones(100, int), np.full(100, 0.8),
                                         np.array([1] * 80 + [0] * 20), 2)  # fmt: skip
    wholly = {"censored": {2: 1500}, "estimated": {}, "recovered": {}}
    one_seen = shallow.merge(stats(0.5, [0], depth=2))
    assert compact_ece(one_seen, wholly, None).value is None
    none_seen = compact_ece(shallow, wholly, None)
    assert none_seen.value is None and none_seen.samples == 0 and "100.0% of depth 2" in none_seen.why


def test_estimated_labels_are_soft_outcomes_with_use_estimated_and_unknown_without():
    labels = stats(0.5, [1] * 50 + [0] * 50)
    estimated = np.zeros((2, N_BINS, 3))
    estimated[1, int(0.5 * N_BINS)] = (100, 50.0, 90.0)  # predicted 0.5, the target gave them 0.9
    without = compact_ece(labels, counts(estimated=100), None)
    assert without.value is None and "censored" in without.why  # half the labels are not observations
    soft = compact_ece(labels, counts(estimated=100), estimated)
    assert soft.value == pytest.approx(abs(100 - 140) / 200) and soft.samples == 200


def test_use_estimated_belongs_to_the_compact_gate_only():
    with pytest.raises(ValueError, match="use_estimated"):
        Gate(metric="survival_ece", threshold=0.05, direction="at_most", use_estimated=True)
    gate = Gate(metric="compact_survival_ece", threshold=0.05, direction="at_most", use_estimated=True)
    assert gate.measured_as == ESTIMATED_KEY


def test_recovered_greedy_traffic_gives_the_store_gate_a_value(tmp_path):
    from sparkgate.collectors.store import Store

    sim = simulate(7, requests=6, steps=40)
    with Store(tmp_path / "events.duckdb") as store:
        ingest_in(store, sim.records, list(range(len(sim.records))), [])
        measured = evaluate(store, resamples=10).measurements("compact")
        rows = store.query("SELECT depth, survival, label FROM depth_labels WHERE mode = 'compact' "
                           "AND label IS NOT NULL").to_pylist()  # fmt: skip
    m = measured["compact_survival_ece"]
    assert m.value is not None and m.samples > 0, m  # only the requests' last steps stay censored
    # The worst depth's plug-in ECE (15 equal-width bins) of the compact labels observed or recovered,
    # recounted from the stored rows; samples: the fewest of any depth.
    eces, sizes = [], []
    for depth in sorted({r["depth"] for r in rows}):
        p = np.array([r["survival"] for r in rows if r["depth"] == depth])
        y = np.array([r["label"] for r in rows if r["depth"] == depth], dtype=float)
        bins = np.minimum((p * N_BINS).astype(int), N_BINS - 1)
        eces.append(sum(abs(p[bins == b].sum() - y[bins == b].sum()) for b in set(bins.tolist())) / len(p))
        sizes.append(len(p))
    assert m.value == pytest.approx(max(eces)) and m.samples == min(sizes)
