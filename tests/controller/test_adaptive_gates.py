"""The adaptive gates' inputs over a real DuckDB file: each says what it measured, with an interval and n."""

from __future__ import annotations

from sparkgate.collectors.synth import RowModel, synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.controller.adaptive_gates import window_oscillation
from tests.conftest import T0, with_columns

COMPACT_ONLY = (0.0, 0.0, 1.0, 0.0)  # static, shadow, compact, cap_accept


def ingest_epochs(store, thresholds: dict[str, list[float]]) -> None:
    """One epoch of compact steps per threshold, per arm, alternating arms, 0.5 s apart."""
    step = 0
    for epoch in range(len(thresholds["treatment"])):
        for arm in ("treatment", "control"):
            model = RowModel(mode_weights=COMPACT_ONLY, window_threshold=thresholds[arm][epoch])
            wire = synthetic_wire(20, 8, 7, "r0", first_step=step, seed=step, ts=T0 + step * 0.01, model=model)
            store.ingest(from_wire(with_columns(wire, phase="adaptive", epoch=epoch, arm=arm)), "test")
            step += 20


def test_windows_that_swing_with_the_fitted_tables_show_as_oscillation(store):
    steady, swinging = [0.5] * 12, [0.2, 0.8] * 6
    ingest_epochs(store, {"treatment": swinging, "control": steady})
    m = window_oscillation(store, T0, None, 0.95)
    assert m.samples == 12 and m.value > 0.05 and m.low > 0.05  # wholly above the default threshold
    assert "MOVER, 12 treatment and 12 control epochs" in m.method


def test_the_same_windows_in_both_arms_show_none(store):
    ingest_epochs(store, {"treatment": [0.5] * 12, "control": [0.5] * 12})
    m = window_oscillation(store, T0, None, 0.95)
    few = window_oscillation(store, T0, T0 + 0.5, 0.95)
    assert m.low < 0 < m.high and abs(m.value) < 0.05
    assert few.value is None and "fewer than 3 epochs" in few.why
