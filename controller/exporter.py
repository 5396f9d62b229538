"""The controller's Prometheus series, beside the collectors' ingest series in the same registry.

``sparkgate_rollout_phase`` (one-hot) and the calibration/utilization gauges are
the collectors' (``Metrics.set_phase`` / ``Metrics.publish``); this adds the
revision, the compact fraction, each gate's value and verdict, and decisions.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from sparkgate.collectors.metrics import Metrics
from sparkgate.policies.vocabulary import Outcome

from .gates import Verdict
from .metrics import Evaluation
from .rollout_state import Decision, RolloutState

VERDICT_CODES: dict[str, float] = {
    Outcome.PASS: 1.0,
    Outcome.FAIL: 0.0,
    Outcome.INCONCLUSIVE: -1.0,
    Outcome.ERROR: -2.0,
}


class ControllerMetrics:
    """Gauges and counters the controller updates after each decision."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics
        r = metrics.registry
        self.revision = Gauge("sparkgate_rollout_revision", "Revision of the served rollout policy.", registry=r)
        self.fraction = Gauge("sparkgate_rollout_compact_fraction", "Fraction of traffic served compact.", registry=r)
        self.gate_value = Gauge("sparkgate_gate_value", "Last measured value of each gate.", ("gate",), registry=r)
        self.gate_samples = Gauge("sparkgate_gate_samples", "Samples behind each gate's value.", ("gate",), registry=r)
        self.gate_verdict = Gauge(
            "sparkgate_gate_verdict", "Last verdict: 1 pass, 0 fail, -1 inconclusive, -2 error.", ("gate",), registry=r
        )
        self.decisions = Counter(
            "sparkgate_rollout_decisions_total", "Rollout decisions taken.", ("action",), registry=r
        )
        self._gates: set[str] = set()

    def state(self, state: RolloutState) -> None:
        self.metrics.set_phase(state.phase)
        self.revision.set(state.revision)
        self.fraction.set(state.compact_fraction)

    def decision(self, decision: Decision) -> None:
        self.decisions.labels(decision.action).inc()

    def evaluation(self, evaluation: Evaluation | None, verdicts: list[Verdict]) -> None:
        """The interval's verdicts and its window's aggregate (``evaluation`` None: the store could not be
        read, and its ``error`` verdicts are exported all the same). Only what this interval judged is
        exported: a gate it did not judge (another phase's) loses its series, and a gate with no value its
        value series, rather than show an older interval's figure beside this one's verdict."""
        self.metrics.publish(None if evaluation is None else evaluation.aggregate)
        judged = {v.gate for v in verdicts}
        for gate in self._gates - judged:
            for gauge in (self.gate_value, self.gate_samples, self.gate_verdict):
                gauge.remove(gate)
        for v in verdicts:
            if v.value is None:
                self.gate_value.remove(v.gate)
            else:
                self.gate_value.labels(v.gate).set(v.value)
            self.gate_samples.labels(v.gate).set(v.samples)
            self.gate_verdict.labels(v.gate).set(VERDICT_CODES[v.outcome])
        self._gates = judged
