"""What an evaluation reads: only what a stage's gates measure, and at the bins they read."""

from __future__ import annotations

import pytest

from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.queries import Window
from tests.conftest import T0, ingest_synthetic


def test_a_stage_reads_what_its_gates_measure_and_nothing_more():
    from sparkgate.controller.evaluate import optional_reads
    from sparkgate.policies.gate import Gate
    from sparkgate.policies.rollout import load_rollout_policy

    policy = load_rollout_policy()
    compact = optional_reads(policy.gates_for("compact"))  # what bench controller's tick reads
    assert compact.pop("fine_bins") is False and all(compact.values())  # no gate reads the fine bins
    assert not any(optional_reads(policy.gates_for("baseline")).values())
    only = optional_reads([Gate(metric="windowed_ece_drift_replica", threshold=0.03, direction="at_most")])
    assert only == {"shadow_reference": False, "per_replica": False, "windowed_reference": False,
                    "windowed_replicas": True, "fine_bins": False}  # fmt: skip


def test_every_gate_measures_the_same_at_the_equal_width_bins_and_the_report_asks_for_the_fine(store):
    from sparkgate.controller.evaluate import optional_reads
    from sparkgate.policies.rollout import load_rollout_policy

    for i, (phase, replica) in enumerate([("shadow", "r0"), ("shadow", "r1"), ("compact", "r0"), ("compact", "r1")]):
        ingest_synthetic(store, 60, T0 + 100 * (i // 2), phase, replica, first_step=1000 * i)
    reads = {**optional_reads(load_rollout_policy().gates_for("compact")), "fine_bins": True}
    for use_sums in (True, False):  # the window starts mid-bucket: its edges come from the rows either way
        fine, coarse = (evaluate(store, Window(since=T0 + 95), resamples=20, use_sums=use_sums,
                                 **{**reads, "fine_bins": f}) for f in (True, False))  # fmt: skip
        got, want = coarse.measurements("compact"), fine.measurements("compact")
        assert got.keys() == want.keys()
        read = ("survival_ece", "survival_ece_debiased", "survival_ece_drift", "survival_ece_debiased_replica",
                "windowed_ece_drift", "windowed_ece_drift_replica")  # fmt: skip
        assert all(got[name].value is not None for name in read)
        for name, m in got.items():
            w = want[name]
            assert (m.samples, m.error, m.why) == (w.samples, w.error, w.why), name
            for a, b in ((m.value, w.value), (m.low, w.low), (m.high, w.high)):
                assert a == b if a is None or b is None else a == pytest.approx(b, rel=1e-9, abs=1e-12), name
        assert not coarse.survival.fine and fine.survival.fine
        assert fine.report("compact")["calibration"]
        with pytest.raises(ValueError, match="equal-mass ECE needs the fine bins"):
            coarse.report("compact")
