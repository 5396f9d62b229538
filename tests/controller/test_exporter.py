"""The controller's Prometheus series: state, decisions and each gate's value, samples and verdict."""

from __future__ import annotations

import math

import pytest

from sparkgate.collectors.metrics import Metrics
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.exporter import ControllerMetrics
from sparkgate.controller.gates import error_verdict, judge, judge_all
from sparkgate.controller.queries import Window
from sparkgate.controller.rollout import command, start
from sparkgate.controller.rollout_state import apply
from sparkgate.policies.gate import Gate
from sparkgate.policies.rollout import parse_rollout_policy
from tests.conftest import T0, ingest_synthetic

POLICY = parse_rollout_policy({"canary_steps": [0.25]})
SHADOW_GATES = [
    Gate(metric="survival_ece", threshold=1.0, direction="at_most"),
    Gate(metric="upper_bound_utilization", threshold=2.0, direction="at_least"),
]


@pytest.fixture
def exported(store):
    """An evaluation of 20 synthetic steps, a fresh exporter, and a reader of its samples."""
    ingest_synthetic(store, 20, T0)
    metrics = Metrics()
    return evaluate(store), ControllerMetrics(metrics), metrics.registry.get_sample_value


def test_state_and_decisions_are_exported():
    metrics = Metrics()
    exporter = ControllerMetrics(metrics)
    value = metrics.registry.get_sample_value
    state = apply(None, start(POLICY, T0))
    exporter.state(state)
    assert value("sparkgate_rollout_revision") == 1 and value("sparkgate_rollout_compact_fraction") == 0.0
    assert value("sparkgate_rollout_phase", {"phase": "baseline"}) == 1
    for _ in range(2):
        decision = command(POLICY, state, "promote", "ops", T0 + 1)
        exporter.decision(decision)
        state = apply(state, decision)
    exporter.state(state)
    assert value("sparkgate_rollout_decisions_total", {"action": "promote"}) == 2
    assert value("sparkgate_rollout_revision") == 3 and value("sparkgate_rollout_compact_fraction") == 0.25
    assert value("sparkgate_rollout_phase", {"phase": "canary"}) == 1
    assert value("sparkgate_rollout_phase", {"phase": "baseline"}) == 0


def test_each_gate_exports_its_value_samples_and_verdict_code(exported):
    evaluation, exporter, value = exported
    measured = evaluation.measurements("shadow")
    gates = [*SHADOW_GATES, Gate(metric="tier_miss_rate", threshold=0.5, direction="at_most", min_samples=10**9)]
    unmeasured = Gate(metric="p99_step_ratio", threshold=1.0, direction="at_most")
    verdicts = [*judge_all(gates, measured), judge(unmeasured, None)]
    assert [v.outcome for v in verdicts] == ["pass", "fail", "inconclusive", "inconclusive"]
    exporter.evaluation(evaluation, verdicts)
    for gate, code in [("survival_ece", 1.0), ("upper_bound_utilization", 0.0), ("tier_miss_rate", -1.0)]:
        assert value("sparkgate_gate_verdict", {"gate": gate}) == code
        assert value("sparkgate_gate_value", {"gate": gate}) == pytest.approx(measured[gate].value)
        assert value("sparkgate_gate_samples", {"gate": gate}) == measured[gate].samples
    # No value: the gauge is left unset rather than reading 0; samples and verdict are still exported.
    assert value("sparkgate_gate_value", {"gate": "p99_step_ratio"}) is None
    assert value("sparkgate_gate_samples", {"gate": "p99_step_ratio"}) == 0
    assert value("sparkgate_gate_verdict", {"gate": "p99_step_ratio"}) == -1.0
    # The window's aggregate is published through the collectors' gauges.
    assert value("sparkgate_survival_ece", {"depth": "1"}) == evaluation.aggregate.survival.ece()[1]


def test_only_what_this_interval_judged_is_exported(store, exported):
    """A gate another phase judged, a value this interval lacks and the window's calibration of an earlier
    interval lose their series instead of standing beside this interval's verdicts."""
    evaluation, exporter, value = exported
    exporter.evaluation(evaluation, judge_all(SHADOW_GATES, evaluation.measurements("shadow")))
    assert value("sparkgate_gate_verdict", {"gate": "upper_bound_utilization"}) == 0.0
    assert value("sparkgate_upper_bound_utilization") == evaluation.aggregate.upper_bound_utilization()
    # Shadow's gate reads shadow's utilization: the gauge of that name carries what it judged.
    judged = evaluation.measurements("shadow")["upper_bound_utilization"].value
    assert value("sparkgate_shadow_utilization") == evaluation.aggregate.shadow_utilization() == judged
    canary = [judge(SHADOW_GATES[0], None)]  # no data yet in the new stage
    exporter.evaluation(evaluate(store, Window(since=T0 + 10**6)), canary)
    assert value("sparkgate_gate_verdict", {"gate": "survival_ece"}) == -1.0
    assert value("sparkgate_gate_value", {"gate": "survival_ece"}) is None  # not the shadow interval's value
    assert value("sparkgate_gate_verdict", {"gate": "upper_bound_utilization"}) is None  # canary does not judge it
    assert value("sparkgate_survival_ece", {"depth": "1"}) is None
    assert math.isnan(value("sparkgate_upper_bound_utilization"))
    assert math.isnan(value("sparkgate_shadow_utilization"))


def test_an_interval_that_could_not_read_the_store_exports_its_error_verdicts(exported):
    evaluation, exporter, value = exported
    exporter.evaluation(evaluation, judge_all(SHADOW_GATES[:1], evaluation.measurements("shadow")))
    exporter.evaluation(None, [error_verdict("store: IO Error"), error_verdict("poll failed", "collector")])
    assert value("sparkgate_gate_verdict", {"gate": "evaluation"}) == -2.0
    assert value("sparkgate_gate_verdict", {"gate": "collector"}) == -2.0
    assert value("sparkgate_gate_verdict", {"gate": "survival_ece"}) is None  # not the last interval's pass
    assert value("sparkgate_survival_ece", {"depth": "1"}) is None


def test_utilization_reads_nan_not_zero_before_anything_is_measured():
    # 0 is the worst utilization: an alert on a floor would fire on every restart.
    for name in ("sparkgate_upper_bound_utilization", "sparkgate_shadow_utilization"):
        assert math.isnan(Metrics().registry.get_sample_value(name))
