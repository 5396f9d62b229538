"""The windowed drift compares reliability curves bin by bin: zero when the curve stays, whatever the sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.schema import MODES
from sparkgate.controller.calibration import WINDOWED, Calibration, KindStats
from sparkgate.controller.calibration_drift import curve_drift, worst_replica_curve_drift
from sparkgate.controller.calibration_gates import drift_ece
from sparkgate.controller.gates import judge
from sparkgate.policies.binning import REQUEST_GROUPS
from sparkgate.policies.gate import Gate

CAP_ACCEPT = MODES.index("cap_accept")  # windowed and full-block: both statistics read it


def _kind(rng, n: int, curve, depths: int = 3) -> KindStats:
    """``n`` labels per depth of cap-accept rows whose outcome follows ``curve(p)``."""
    depth = np.repeat(np.arange(1, depths + 1), n)
    p = rng.uniform(0.05, 0.95, len(depth))
    y = (rng.random(len(p)) < np.clip(curve(p), 0, 1)).astype(np.int64)
    groups = rng.integers(0, REQUEST_GROUPS, len(p))
    return KindStats.from_rows(np.full(len(p), CAP_ACCEPT), depth, p, y, groups, depths, grouped=WINDOWED)


def _overconfident(p):
    return p**1.6  # the same miscalibration now and then: the shipped drafter is not perfectly calibrated


def test_an_unchanged_miscalibrated_curve_reads_no_drift_at_very_different_sizes():
    rng = np.random.default_rng(0)
    curve, ece = [], []
    for seed in range(12):
        window, reference = _kind(rng, 20000, _overconfident), _kind(rng, 2500, _overconfident)
        curve.append(curve_drift(window, reference, 40, 1, 0.95, seed).value)
        ece.append(drift_ece(Calibration.of(window, 40, 0.95), Calibration.of(reference, 40, 0.95), 1, 0.95).value)
    assert abs(np.mean(curve)) < 0.006
    # Subtracting two debiased ECEs reads the larger set's gap higher: a drift where nothing moved.
    assert np.mean(ece) > np.mean(curve) + 0.01


@pytest.mark.parametrize(
    "name, curve",
    [("overconfident", lambda p: 0.5 + 0.3 * (p - 0.5)), ("underconfident at the top", lambda p: p**4)],
)
def test_the_noise_floor_is_the_outcomes_so_a_badly_miscalibrated_unmoved_curve_reads_no_drift(name, curve):
    # Where predictions and acceptance rates differ widely, a floor from the predictions' spread was off by
    # 0.016 to 0.025 against a small reference (500 labels per depth), in either direction. One depth: the
    # worst of several reads above zero by their noise alone.
    rng = np.random.default_rng(1)
    drifts = [curve_drift(_kind(rng, 20000, curve, 1), _kind(rng, 500, curve, 1), 40, 1, 0.95, seed).value
              for seed in range(30)]  # fmt: skip
    assert abs(np.mean(drifts)) < 0.006, name


def test_a_shifted_curve_fails_and_an_unchanged_one_passes():
    rng = np.random.default_rng(1)
    gate = Gate(metric="windowed_ece_drift", threshold=0.03, direction="at_most")
    reference = _kind(rng, 3000, _overconfident)
    same = curve_drift(_kind(rng, 20000, _overconfident), reference, 100, 1, 0.95)
    # The pass side starts from the curves' distance with its noise left in, so 3,000 reference labels per
    # depth cannot show a drift under 0.03: never a failure, and a pass once the reference is larger.
    assert judge(gate, same).outcome == "inconclusive" and same.samples == 3000
    larger = curve_drift(_kind(rng, 20000, _overconfident), _kind(rng, 20000, _overconfident), 100, 1, 0.95)
    assert judge(gate, larger).outcome == "pass"
    shifted = curve_drift(_kind(rng, 20000, lambda p: _overconfident(p) - 0.08), reference, 100, 1, 0.95)
    assert judge(gate, shifted).outcome == "fail" and 0.05 < shifted.value < 0.11, shifted
    assert "per bin" in shifted.method and "worst of 3 depths" in shifted.method


def test_nothing_to_compare_has_no_value_and_says_why():
    rng = np.random.default_rng(2)
    empty = _kind(rng, 0, _overconfident)
    assert curve_drift(_kind(rng, 100, _overconfident), empty, 10, 1, 0.95).why
    assert curve_drift(empty, _kind(rng, 100, _overconfident), 10, 1, 0.95).value is None


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 400), seed=st.integers(0, 10_000))
def test_a_set_against_itself_reads_only_minus_its_noise(n, seed):
    kind = _kind(np.random.default_rng(seed), n, _overconfident, depths=2)
    m = curve_drift(kind, kind, 5, 1, 0.95, seed)
    assert m.value is not None and m.value <= 0.0


def test_the_worst_replica_finds_the_one_drifting_replica_the_fleet_figure_dilutes():
    rng = np.random.default_rng(3)
    gate = Gate(metric="windowed_ece_drift_replica", threshold=0.03, direction="at_most")
    reference = _kind(rng, 30000, _overconfident)
    healthy = {f"r{i}": _kind(rng, 30000, _overconfident) for i in range(3)}
    m = worst_replica_curve_drift(healthy, reference, 100, 1, 0.95)
    assert judge(gate, m).outcome == "pass" and m.samples == 30000 and "9 (replica, depth) cells" in m.method
    one_off = {**healthy, "r2": _kind(rng, 6000, lambda p: _overconfident(p) - 0.10)}
    assert judge(gate, worst_replica_curve_drift(one_off, reference, 100, 1, 0.95)).outcome == "fail"
    # The fleet's labels: the same drift diluted by the two healthy replicas' labels.
    fleet = sum(one_off.values(), start=_kind(rng, 0, _overconfident))
    assert curve_drift(fleet, reference, 100, 1, 0.95).value < 0.045
    assert worst_replica_curve_drift({}, reference, 10, 1, 0.95).why
