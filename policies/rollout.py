"""The rollout policy file (docs/design.md §5, §6): phases, traffic steps, gates, timing.

One YAML file, every key optional (missing keys take the defaults below, which
``default_rollout.yaml`` spells out in full), unknown keys rejected. The file is a
pydantic model, so ``sparkgate policy schema`` can hand editors its JSON Schema;
errors name the key path and the bad value, e.g. ``gates[2].threshold: expected
a number, got 'high'``, and ``problems`` lists every one at once. Loading is
pure: the controller decides what to do with the policy; nothing here evaluates
metrics or holds state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    model_validator,
)

from sparkgate.policies.adaptive import Adaptive
from sparkgate.policies.fields import FROZEN, Bool, Float, Int
from sparkgate.policies.vocabulary import DRIFT_METRICS, LADDER, SERVING_PHASES, Phase

Direction = Literal["at_most", "at_least"]
LadderPhase = Literal["baseline", "shadow", "canary", "compact", "adaptive"]
ServingPhase = Literal["shadow", "canary", "compact", "adaptive"]
# The Literals spell the vocabulary out for the JSON Schema; they must be the vocabulary.
LADDER_PHASES: tuple[LadderPhase, ...] = get_args(LadderPhase)
SERVING_PHASE_NAMES: tuple[ServingPhase, ...] = get_args(ServingPhase)
assert tuple(LADDER) == LADDER_PHASES and tuple(SERVING_PHASES) == SERVING_PHASE_NAMES
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
    "tier_miss_rate": "steps that ran eager / all steps",
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
DEFAULT_PATH = Path(__file__).with_name("default_rollout.yaml")
# Appended to a metric's name for the measurement of a gate with use_estimated.
ESTIMATED_SUFFIX = ":estimated"
_FROZEN = FROZEN


class RolloutPolicyError(ValueError):
    """A bad rollout policy; the message starts with the key path. ``problems`` holds every one found."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def _want(key: str, value: Any, want: str) -> str:
    return f"{key}: expected {want}, got {value!r}"


def _raise_all(problems: list[str]) -> None:
    if problems:
        raise ValueError("\n".join(problems))


class Gate(BaseModel):
    """One check per evaluation interval: ``metric`` compared with ``threshold``.

    Inconclusive (neither pass nor fail) below ``min_samples``. A failing
    ``critical`` gate rolls back at once; a ``dry_run`` gate is evaluated and
    recorded but never blocks or rolls back. ``promql`` takes the value from
    a Prometheus query instead of the store, and then ``metric`` is a free label.
    """

    model_config = _FROZEN

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
        if isinstance(data, dict) and not data.get("name") and isinstance(data.get("metric"), str):
            return {**data, "name": data["metric"]}
        return data

    @model_validator(mode="after")
    def _check(self) -> Gate:
        problems = []
        if self.promql is None and self.metric not in METRICS:
            problems.append(_want("metric", self.metric, f"one of {', '.join(METRICS)} (or set promql)"))
        if self.promql is not None and not self.promql.strip():
            problems.append(_want("promql", self.promql, "a non-empty query"))
        if not math.isfinite(self.threshold):
            problems.append(_want("threshold", self.threshold, "a finite number"))
        if self.fail_threshold is not None and not (
            math.isfinite(self.fail_threshold)
            and (
                self.fail_threshold >= self.threshold
                if self.direction == "at_most"
                else self.fail_threshold <= self.threshold
            )
        ):
            side = ">=" if self.direction == "at_most" else "<="
            problems.append(_want("fail_threshold", self.fail_threshold, f"a finite number {side} threshold"))
        if self.min_samples < 0:
            problems.append(_want("min_samples", self.min_samples, "an integer >= 0"))
        if self.use_estimated and (self.metric != "compact_survival_ece" or self.promql is not None):
            problems.append(_want("use_estimated", self.use_estimated, "false unless metric is compact_survival_ece"))
        if self.failure_limit is not None and self.failure_limit < 0:
            problems.append(_want("failure_limit", self.failure_limit, "an integer >= 0"))
        if self.consecutive_passes is not None and self.consecutive_passes < 1:
            problems.append(_want("consecutive_passes", self.consecutive_passes, "an integer >= 1"))
        if self.guard and self.dry_run:
            problems.append(_want("guard", self.guard, "false on a dry_run gate (a dry run never acts)"))
        _raise_all(problems)
        return self

    @property
    def measured_as(self) -> str:
        """The key of this gate's measurement: its name for PromQL, the metric (``:estimated`` with
        ``use_estimated``) for the store."""
        if self.promql is not None:
            return self.name
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


class Webhook(BaseModel):
    """Where decisions that change the policy are announced (``notify:``), as Argo Rollouts and Flagger do.

    Exactly one of ``url`` and ``url_env`` (the name of an environment variable holding the URL: a Slack
    incoming-webhook URL is a secret and does not belong in a policy file)."""

    model_config = _FROZEN

    url: str | None = Field(None, description="http:// or https:// URL to POST each decision to.")
    url_env: str | None = Field(None, description="Environment variable that holds the URL instead.")
    format: Literal["json", "slack"] = Field("json", description="json: the decision as data; slack: a message.")
    timeout_s: Float = Field(5.0, description="Seconds one delivery attempt may take.")
    retries: Int = Field(5, description="Further attempts after a failed one, with exponential backoff.")

    @model_validator(mode="after")
    def _check(self) -> Webhook:
        problems = []
        if (self.url is None) == (self.url_env is None):
            problems.append(_want("url", self.url, "exactly one of url and url_env"))
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            problems.append(_want("url", self.url, "an http:// or https:// URL"))
        if self.url_env is not None and not self.url_env.strip():
            problems.append(_want("url_env", self.url_env, "the name of an environment variable"))
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            problems.append(_want("timeout_s", self.timeout_s, "a finite number of seconds > 0"))
        if self.retries < 0:
            problems.append(_want("retries", self.retries, "an integer >= 0"))
        _raise_all(problems)
        return self


@dataclass(frozen=True)
class Stage:
    """One rung of the ladder (derived from the file, not part of it): a phase and its compact fraction."""

    phase: Phase
    compact_fraction: float


class Comparison(BaseModel):
    """How the comparison gates get their concurrent control (``comparison:``, docs/design.md §6): each
    replica alternates treatment and control epochs of ``epoch_s`` on a schedule drawn from ``seed``; the
    first ``burn_in_s`` of every epoch is left out (the other arm's batch is still draining); intervals are
    two-sided at ``level`` over the pairs of the stage's last ``window_s`` (every pair of a shorter stage;
    None: of the whole stage); goodput counts requests within both SLOs."""

    model_config = _FROZEN

    epoch_s: Float = Field(10.0, description="Seconds per switchback epoch.")
    burn_in_s: Float = Field(1.0, description="Seconds at the start of each epoch left out of comparisons.")
    seed: Int = Field(0, description="Seed of the epoch schedule.")
    level: Float = Field(0.99, description="Two-sided confidence level of the comparison intervals.")
    window_s: Float | None = Field(
        1800.0,
        description="Seconds of the stage's newest pairs the comparisons read (a stage without end, adaptive, "
        "would otherwise dilute a new regression in its whole history); null: every pair since the stage began.",
    )
    step_time: Literal["wall", "cpu"] = Field(
        "wall", description="Step cost the step comparisons read: wall time, or the replica's CPU time (shared CPUs)."
    )
    ttft_slo_ms: Float = Field(2000.0, description="Time-to-first-token SLO of goodput.")
    tpot_slo_ms: Float = Field(200.0, description="Time-per-output-token SLO of goodput.")

    @model_validator(mode="after")
    def _check(self) -> Comparison:
        problems = []
        if not (math.isfinite(self.epoch_s) and self.epoch_s > 0):
            problems.append(_want("epoch_s", self.epoch_s, "a finite number of seconds > 0"))
        if not (0 <= self.burn_in_s < self.epoch_s):
            problems.append(_want("burn_in_s", self.burn_in_s, f"seconds in [0, epoch_s={self.epoch_s})"))
        if not (0.5 <= self.level < 1):
            problems.append(_want("level", self.level, "a confidence level in [0.5, 1)"))
        if self.window_s is not None and not (math.isfinite(self.window_s) and self.window_s >= 2 * self.epoch_s):
            problems.append(_want("window_s", self.window_s, f"null or seconds >= 2 x epoch_s={self.epoch_s} (a pair)"))
        for key in ("ttft_slo_ms", "tpot_slo_ms"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                problems.append(_want(key, getattr(self, key), "a finite number of milliseconds > 0"))
        _raise_all(problems)
        return self


class RolloutPolicy(BaseModel):
    """The whole file. Invariants (checked on construction):

    - ``phases`` is ``baseline`` followed by ladder phases in ladder order;
    - ``canary_steps`` strictly increasing in (0, 1), non-empty when canary runs;
    - ``0 < observe_fraction < 1``; ``fallback_window`` in [0, gamma] or None (static);
    - advance after ``consecutive_passes`` all-pass intervals; roll back when a
      phase's failed intervals of the last ``failure_window_s`` exceed ``failure_limit``, or when a serving phase
      stays inconclusive for ``progress_deadline_s``; data older than
      ``stale_after_s`` makes a gate inconclusive;
    - ``max_lookback_s`` is null or at least one interval;
    - gate names are unique.
    """

    model_config = _FROZEN

    gamma: Int = Field(7, description="Draft tokens per request per step.")
    phases: tuple[LadderPhase, ...] = Field(LADDER_PHASES, description="The ladder, in order; baseline first.")
    canary_steps: tuple[Float, ...] = Field((0.05, 0.25, 0.5), description="Compact fractions of the canary rungs.")
    observe_fraction: Float = Field(0.05, description="Fraction of compact traffic verified in full (cap_accept).")
    consecutive_passes: Int = Field(3, description="All-pass intervals in a row that advance a stage.")
    failure_limit: Int = Field(2, description="Failed intervals a phase may have; one more rolls back.")
    failure_window_s: Float | None = Field(
        3600.0,
        description="Seconds a failed interval counts towards failure_limit and a gate's failure_limit (null: the "
        "whole stage); in a stage without end (adaptive) the limits then bound false rollbacks per unit of time.",
    )
    error_limit: Int = Field(
        3, description="Consecutive intervals with a gate that could not be measured; one more rolls back."
    )
    evaluation_interval_s: Float = Field(60.0, description="Seconds between evaluations.")
    progress_deadline_s: Float = Field(
        3600.0, description="Act (on_progress_deadline) when a serving phase stays inconclusive this long."
    )
    on_progress_deadline: Literal["rollback", "pause"] = Field(
        "rollback", description="What a stage inconclusive for progress_deadline_s does: roll back, or pause."
    )
    max_lookback_s: Float | None = Field(
        1800.0,
        description="When the newest five intervals hold fewer labels than the calibration gates' min_samples, "
        "the gates read further back, one interval at a time, at most this far (never before the stage began; "
        "null: never).",
    )
    min_dwell_s: Float = Field(0.0, description="Seconds a stage is held before it may advance, whatever its passes.")
    stale_after_s: Float = Field(300.0, description="Data older than this makes a gate inconclusive.")
    fallback_window: Int | None = Field(None, description="Window served in fallback; null: static (gamma).")
    gates: tuple[Gate, ...] = Field(DEFAULT_GATES, description="The checks every evaluation interval runs.")
    notify: tuple[Webhook, ...] = Field((), description="Webhooks told of every decision that changes the policy.")
    comparison: Comparison = Field(Comparison(), description="Switchback epochs and SLOs of the comparison gates.")
    adaptive: Adaptive = Field(Adaptive(), description="How the adaptive phase updates the cost tables.")

    @model_validator(mode="after")
    def _check(self) -> RolloutPolicy:
        problems = self._phase_problems()
        if self.gamma < 1:
            problems.append(_want("gamma", self.gamma, "an integer >= 1"))
        if "canary" in self.phases and not self.canary_steps:
            problems.append(_want("canary_steps", list(self.canary_steps), "at least one step when canary runs"))
        for i, step in enumerate(self.canary_steps):
            low = self.canary_steps[i - 1] if i else 0.0
            if not (low < step < 1.0):
                problems.append(_want(f"canary_steps[{i}]", step, f"a fraction in ({low}, 1), increasing"))
        if not (0.0 < self.observe_fraction < 1.0):
            problems.append(_want("observe_fraction", self.observe_fraction, "a fraction in (0, 1)"))
        if self.consecutive_passes < 1:
            problems.append(_want("consecutive_passes", self.consecutive_passes, "an integer >= 1"))
        if self.failure_limit < 0:
            problems.append(_want("failure_limit", self.failure_limit, "an integer >= 0"))
        if self.error_limit < 0:
            problems.append(_want("error_limit", self.error_limit, "an integer >= 0"))
        for key in ("evaluation_interval_s", "stale_after_s"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                problems.append(_want(key, getattr(self, key), "a finite number of seconds > 0"))
        if self.failure_window_s is not None and not (
            math.isfinite(self.failure_window_s) and self.failure_window_s >= self.evaluation_interval_s
        ):
            want = f"null or seconds >= evaluation_interval_s ({self.evaluation_interval_s})"
            problems.append(_want("failure_window_s", self.failure_window_s, want))
        if self.max_lookback_s is not None and not (
            math.isfinite(self.max_lookback_s) and self.max_lookback_s >= self.evaluation_interval_s
        ):
            want = f"null or seconds >= evaluation_interval_s ({self.evaluation_interval_s})"
            problems.append(_want("max_lookback_s", self.max_lookback_s, want))
        if not (math.isfinite(self.min_dwell_s) and self.min_dwell_s >= 0):
            problems.append(_want("min_dwell_s", self.min_dwell_s, "a finite number of seconds >= 0"))
        if not (self.progress_deadline_s >= self.evaluation_interval_s):
            problems.append(
                _want(
                    "progress_deadline_s",
                    self.progress_deadline_s,
                    f"at least evaluation_interval_s ({self.evaluation_interval_s})",
                )
            )
        if self.fallback_window is not None and not (0 <= self.fallback_window <= self.gamma):
            problems.append(
                _want("fallback_window", self.fallback_window, f"an integer in [0, gamma={self.gamma}] or null")
            )
        names = [g.name for g in self.gates]
        problems += [
            _want(f"gates[{i}].name", name, "a name no other gate uses")
            for i, name in enumerate(names)
            if name in names[:i]
        ]
        _raise_all(problems)
        return self

    def _phase_problems(self) -> list[str]:
        if not self.phases or Phase(self.phases[0]) != Phase.BASELINE:
            return [_want("phases", list(self.phases), "a list starting with baseline")]
        return [
            _want(f"phases[{i}]", phase, f"a phase after {self.phases[i - 1]} in {' -> '.join(LADDER)}")
            for i, phase in enumerate(self.phases)
            if i and LADDER.index(Phase(phase)) <= LADDER.index(Phase(self.phases[i - 1]))
        ]

    @property
    def fallback_window_value(self) -> int:
        """The window fallback serves: ``fallback_window``, or γ (static) when unset."""
        return self.gamma if self.fallback_window is None else self.fallback_window

    def stages(self) -> tuple[Stage, ...]:
        """The ladder the controller walks, one rung per canary step."""
        fractions = {
            "baseline": (0.0,),
            "shadow": (0.0,),
            "canary": self.canary_steps,
            "compact": (1.0,),
            "adaptive": (1.0,),
        }
        return tuple(Stage(Phase(phase), f) for phase in self.phases for f in fractions[phase])

    def gates_for(self, phase: str) -> tuple[Gate, ...]:
        return tuple(g for g in self.gates if phase in g.phases)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, not tuples) that ``parse_rollout_policy`` reads back."""
        return self.model_dump(mode="json")

    def replace(self, **changes: Any) -> RolloutPolicy:
        """A copy with ``changes``, validated like a file."""
        return parse_rollout_policy({**self.to_dict(), **changes})


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Mapping[str, Any]) -> list[str]:
    """Our wording of one pydantic error: ``key.path: what was expected, got what``."""
    loc, kind, value = tuple(error["loc"]), error["type"], error.get("input")
    key = _path(loc)
    if kind == "value_error":  # our own checks: each line already names its key relative to the model
        return [f"{key}.{line}" if key else line for line in str(error["ctx"]["error"]).split("\n")]
    if kind == "missing":
        return [f"{key}: missing"]
    if kind == "extra_forbidden":
        nested: dict[str, type[BaseModel]] = {"gates": Gate, "notify": Webhook, "comparison": Comparison}
        model = nested.get(str(loc[0]), RolloutPolicy) if len(loc) > 1 else RolloutPolicy
        return [f"{key}: unknown key (known: {', '.join(model.model_fields)})"]
    if kind == "literal_error":
        want = "one of " + error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
    else:
        want = {
            "float_type": "a number",
            "int_type": "an integer",
            "bool_type": "true or false",
            "string_type": "a string",
            "tuple_type": "a list",
            "model_type": "a mapping",
            "finite_number": "a finite number",
        }.get(kind, error["msg"])
    return [_want(key or "rollout policy", value, want)]


def problems(raw: Any) -> list[str]:
    """Every problem of decoded YAML as a rollout policy, each naming its key and value; [] when valid."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [_want("rollout policy", raw, "a mapping")]
    try:
        RolloutPolicy.model_validate(raw)
    except ValidationError as exc:
        return [line for error in exc.errors() for line in _message(error)]
    return []


def parse_rollout_policy(raw: Mapping[str, Any] | None) -> RolloutPolicy:
    """A validated policy from decoded YAML; ``None`` (an empty file) gives the defaults."""
    found = problems(raw)
    if found:
        raise RolloutPolicyError(found)
    return RolloutPolicy.model_validate({} if raw is None else raw)


def read_yaml(path: str | Path) -> Any:
    """Decoded YAML of a policy file; RolloutPolicyError naming the file when it is not YAML."""
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise RolloutPolicyError(f"{path}: not valid YAML ({exc})") from exc


def load_rollout_policy(path: str | Path = DEFAULT_PATH) -> RolloutPolicy:
    """Read and validate a policy file (the packaged defaults when no path is given)."""
    raw = read_yaml(path)
    found = problems(raw)
    if found:
        raise RolloutPolicyError([f"{path}: {line}" for line in found])
    return RolloutPolicy.model_validate({} if raw is None else raw)


def json_schema() -> dict[str, Any]:
    """The policy file's JSON Schema (editors use it for YAML completion and checks)."""
    schema = RolloutPolicy.model_json_schema()
    schema["title"] = "sparkgate rollout policy"
    return schema
