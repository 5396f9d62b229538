"""A rollout policy's gates (docs/design.md §5): what each evaluation interval checks, and the defaults.

A gate compares one measured metric (``METRICS``, or a PromQL query's value) with its threshold; the
controller measures and judges (``controller.gates``), nothing here evaluates metrics.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from sparkgate.policies.fields import FROZEN, SERVING_PHASE_NAMES, Bool, Float, Int, ServingPhase, raise_all, want
from sparkgate.policies.vocabulary import DRIFT_METRICS

Direction = Literal["at_most", "at_least"]
METRICS = {
    "survival_ece": "worst per-depth survival ECE on uncensored traffic",
    "survival_ece_upper": "bootstrap upper bound of survival_ece",
    "survival_ece_drift": "worst per-depth debiased survival ECE now minus shadow's under the same contract, "
    "judged by bounds that pay for repeated looks",
    "windowed_ece_drift": "worst per-depth change of the reliability curve of the windowed labels (depths within "
    "each row's scheduler window: compact and cap-accept rows now, shadow's suggested windows then), bin by bin "
    "less its noise, judged by bounds that pay for repeated looks; compact traffic supplies these labels without "
    "full verification",
    "windowed_ece_drift_replica": "windowed_ece_drift of the worst replica against the fleet's shadow reference, "
    "bounds paying for every (replica, depth) cell and repeated looks",
    "survival_ece_debiased": "worst per-depth survival ECE minus what a calibrated predictor shows at the same "
    "bin counts (its noise floor; zero in expectation when calibrated), judged by bounds that pay for "
    "repeated looks",
    "survival_ece_debiased_replica": "survival_ece_debiased of the worst replica, bounds paying for every "
    "(replica, depth) cell and repeated looks",
    "upper_bound_utilization": "sum(a) / sum(min(a*, gamma)) over cap-accept samples (shadow: suggested)",
    "tier_miss_rate": "steps that ran eager / steps, of the treatment's (a switchback control epoch's left out)",
    "compact_survival_ece": "worst per-depth survival ECE of compact traffic over observed and recovered labels "
    "(no value while > 5% of a depth's labels stay censored)",
    "p99_step_ratio": "p99 step time, treatment / control switchback epochs (with its interval)",
    "tokens_per_s_ratio": "committed tokens per busy second, treatment / control epochs (with its interval)",
    "p99_tpot_ratio": "p99 time per output token, treatment / control epochs (with its interval)",
    "p99_ttft_ratio": "p99 time to first token, treatment / control epochs (with its interval)",
    "goodput_ratio": "requests meeting comparison.ttft_slo_ms and tpot_slo_ms, treatment / control epochs",
    **{
        drift: f"{ratio} over the stage's newest comparison.window_s / over the window before it (a stage "
        "without end getting worse while still ahead of its control), with its rank-sum interval"
        for drift, ratio in DRIFT_METRICS.items()
    },
    "accepted_length_ratio": "mean full-block a* / the shadow reference's (baseline's without shadow)",
    "cost_prediction_error": "adaptive: median |predicted - measured| / measured step time of treatment steps "
    "served on fitted cost tables (adaptive.step_time), with its interval",
    "window_oscillation": "adaptive: coefficient of variation of the per-epoch mean window, treatment minus "
    "control (the static tables), with its interval",
    "consistency_mismatches": "greedy compact-vs-static replay mismatches",
    "state_rollback_failures": "state-after-rollback check failures",
}
# Appended to a metric's name for the measurement of a gate with use_estimated.
ESTIMATED_SUFFIX = ":estimated"
# The key prefix of a PromQL gate's measurement (``Gate.measured_as``).
PROMQL_PREFIX = "promql:"


class Gate(BaseModel):
    """One check per evaluation interval: ``metric`` compared with ``threshold``.

    Inconclusive (neither pass nor fail) below ``min_samples``. A failing
    ``critical`` gate rolls back at once; a ``dry_run`` gate is evaluated and
    recorded but never blocks or rolls back. ``promql`` takes the value from
    a Prometheus query instead of the store, and then ``metric`` is a free label.
    """

    model_config = FROZEN

    metric: str = Field(
        description="What is measured: "
        + "; ".join(f"{k}: {v}" for k, v in METRICS.items())
        + " (any label when promql is set)."
    )
    threshold: Float = Field(description="The value compared with; equality passes.")
    fail_threshold: Float | None = Field(
        None,
        description="A second threshold on the bad side: the gate fails only beyond it, and between the two "
        "it is inconclusive (a grey zone) [default: threshold].",
    )
    direction: Direction = Field(description="at_most: pass when value <= threshold; at_least: value >= threshold.")
    name: str = Field("", description="Unique gate name [default: the metric].")
    min_samples: Int = Field(0, description="Below this many samples the gate is inconclusive.")
    critical: Bool = Field(False, description="A failure rolls back at once.")
    dry_run: Bool = Field(False, description="Evaluated and recorded, never acts.")
    guard: Bool = Field(
        False, description="Acts on a failure only: inconclusive never holds the rollout back (a failure condition)."
    )
    phases: tuple[ServingPhase, ...] = Field(SERVING_PHASE_NAMES, description="Serving phases the gate judges.")
    promql: str | None = Field(None, description="Read the value from this Prometheus query instead of the store.")
    use_estimated: Bool = Field(
        False,
        description="compact_survival_ece only: count estimated labels (sampled requests) as soft outcomes.",
    )
    failure_limit: Int | None = Field(
        None, description="Failed intervals of this gate a stage tolerates; one more rolls back [default: none]."
    )
    consecutive_passes: Int | None = Field(
        None, description="Consecutive passes of this gate a stage needs before it advances [default: none]."
    )

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_metric(cls, data: Any) -> Any:
        # Only an absent or empty name: a name of the wrong type is refused, not replaced.
        if isinstance(data, dict) and data.get("name") in (None, "") and isinstance(data.get("metric"), str):
            return {**data, "name": data["metric"]}
        return data

    @model_validator(mode="after")
    def _check(self) -> Gate:
        problems = []
        if self.promql is None and self.metric not in METRICS:
            problems.append(want("metric", self.metric, f"one of {', '.join(METRICS)} (or set promql)"))
        if self.promql is not None and not self.promql.strip():
            problems.append(want("promql", self.promql, "a non-empty query"))
        if not math.isfinite(self.threshold):
            problems.append(want("threshold", self.threshold, "a finite number"))
        if self.fail_threshold is not None and not (
            math.isfinite(self.fail_threshold)
            and (
                self.fail_threshold >= self.threshold
                if self.direction == "at_most"
                else self.fail_threshold <= self.threshold
            )
        ):
            side = ">=" if self.direction == "at_most" else "<="
            problems.append(want("fail_threshold", self.fail_threshold, f"a finite number {side} threshold"))
        if self.min_samples < 0:
            problems.append(want("min_samples", self.min_samples, "an integer >= 0"))
        if self.use_estimated and (self.metric != "compact_survival_ece" or self.promql is not None):
            problems.append(want("use_estimated", self.use_estimated, "false unless metric is compact_survival_ece"))
        if self.failure_limit is not None and self.failure_limit < 0:
            problems.append(want("failure_limit", self.failure_limit, "an integer >= 0"))
        if self.consecutive_passes is not None and self.consecutive_passes < 1:
            problems.append(want("consecutive_passes", self.consecutive_passes, "an integer >= 1"))
        if self.guard and self.dry_run:
            problems.append(want("guard", self.guard, "false on a dry_run gate (a dry run never acts)"))
        if self.critical and self.dry_run:
            problems.append(want("critical", self.critical, "false on a dry_run gate (a dry run never acts)"))
        if not self.phases:
            problems.append(want("phases", list(self.phases), "at least one serving phase (a gate judged nowhere)"))
        raise_all(problems)
        return self

    @property
    def measured_as(self) -> str:
        """The key of this gate's measurement: ``promql:`` and its name for PromQL (apart from the store's
        keys, so a PromQL gate named like a store metric never replaces that metric for its gates), the metric
        (``:estimated`` with ``use_estimated``) for the store."""
        if self.promql is not None:
            return PROMQL_PREFIX + self.name
        return self.metric + ESTIMATED_SUFFIX if self.use_estimated else self.metric

    def passes(self, value: float) -> bool:
        """Whether ``value`` is on the good side of the threshold (equality passes)."""
        return value <= self.threshold if self.direction == "at_most" else value >= self.threshold

    @property
    def fail_limit(self) -> float:
        """What a value must be beyond to fail: ``fail_threshold``, or ``threshold`` without a grey zone."""
        return self.threshold if self.fail_threshold is None else self.fail_threshold

    def fails(self, value: float) -> bool:
        """Whether ``value`` is beyond ``fail_limit``."""
        return value > self.fail_limit if self.direction == "at_most" else value < self.fail_limit


DEFAULT_GATES = (
    Gate(metric="survival_ece_debiased", threshold=0.08, direction="at_most", min_samples=2000, failure_limit=1),
    Gate(
        metric="survival_ece_drift",
        threshold=0.03,
        direction="at_most",
        min_samples=2000,
        failure_limit=1,
        phases=["canary", "compact", "adaptive"],
    ),
    *(
        Gate(
            metric=metric,
            threshold=0.03,
            direction="at_most",
            min_samples=samples,
            failure_limit=1,
            guard=True,
            phases=["compact", "adaptive"],
        )
        for metric, samples in (("windowed_ece_drift", 2000), ("windowed_ece_drift_replica", 500))
    ),
    Gate(metric="survival_ece_debiased_replica", threshold=0.09, direction="at_most", min_samples=500, failure_limit=1),
    Gate(metric="upper_bound_utilization", threshold=0.85, direction="at_least", min_samples=500, guard=True),
    Gate(metric="tier_miss_rate", threshold=0.02, direction="at_most", min_samples=200),
    Gate(metric="tokens_per_s_ratio", threshold=0.97, direction="at_least", min_samples=10, guard=True),
    Gate(metric="p99_tpot_ratio", threshold=1.10, direction="at_most", min_samples=10, guard=True),
    Gate(metric="p99_ttft_ratio", threshold=1.20, direction="at_most", min_samples=10, guard=True),
    Gate(metric="goodput_ratio", threshold=0.95, direction="at_least", min_samples=10, guard=True),
    # Adaptive's own guards judge the fitted tables only (no value before one is served): a failure reverts.
    *(
        Gate(metric=metric, threshold=threshold, direction="at_most", min_samples=n, guard=True, phases=["adaptive"])
        for metric, threshold, n in (("cost_prediction_error", 0.25, 500), ("window_oscillation", 0.05, 10))
    ),
    Gate(metric="consistency_mismatches", threshold=0, direction="at_most", critical=True),
    Gate(metric="state_rollback_failures", threshold=0, direction="at_most", critical=True),
)
