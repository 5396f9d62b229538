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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    model_validator,
)

from sparkgate.policies import yaml_text
from sparkgate.policies.adaptive import Adaptive
from sparkgate.policies.errors import InputError
from sparkgate.policies.fields import (
    FROZEN,
    LADDER_PHASES,
    Float,
    Int,
    LadderPhase,
    raise_all,
    want,
)
from sparkgate.policies.gate import DEFAULT_GATES, Gate
from sparkgate.policies.vocabulary import LADDER, Phase

DEFAULT_PATH = Path(__file__).with_name("default_rollout.yaml")


class RolloutPolicyError(InputError):
    """A bad rollout policy; the message starts with the key path. ``problems`` holds every one found."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class Webhook(BaseModel):
    """Where decisions that change the policy are announced (``notify:``), as Argo Rollouts and Flagger do.

    Exactly one of ``url`` and ``url_env`` (the name of an environment variable holding the URL: a Slack
    incoming-webhook URL is a secret and does not belong in a policy file)."""

    model_config = FROZEN

    url: str | None = Field(None, description="http:// or https:// URL to POST each decision to.")
    url_env: str | None = Field(None, description="Environment variable that holds the URL instead.")
    format: Literal["json", "slack"] = Field("json", description="json: the decision as data; slack: a message.")
    timeout_s: Float = Field(5.0, description="Seconds one delivery attempt may take.")
    retries: Int = Field(5, description="Further attempts after a failed one, with exponential backoff.")

    @model_validator(mode="after")
    def _check(self) -> Webhook:
        problems = []
        if (self.url is None) == (self.url_env is None):
            problems.append(want("url", self.url, "exactly one of url and url_env"))
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            problems.append(want("url", self.url, "an http:// or https:// URL"))
        if self.url_env is not None and not self.url_env.strip():
            problems.append(want("url_env", self.url_env, "the name of an environment variable"))
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            problems.append(want("timeout_s", self.timeout_s, "a finite number of seconds > 0"))
        if self.retries < 0:
            problems.append(want("retries", self.retries, "an integer >= 0"))
        raise_all(problems)
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

    model_config = FROZEN

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
            problems.append(want("epoch_s", self.epoch_s, "a finite number of seconds > 0"))
        if not (0 <= self.burn_in_s < self.epoch_s):
            problems.append(want("burn_in_s", self.burn_in_s, f"seconds in [0, epoch_s={self.epoch_s})"))
        if not (0.5 <= self.level < 1):
            problems.append(want("level", self.level, "a confidence level in [0.5, 1)"))
        if self.window_s is not None and not (math.isfinite(self.window_s) and self.window_s >= 2 * self.epoch_s):
            problems.append(want("window_s", self.window_s, f"null or seconds >= 2 x epoch_s={self.epoch_s} (a pair)"))
        for key in ("ttft_slo_ms", "tpot_slo_ms"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                problems.append(want(key, getattr(self, key), "a finite number of milliseconds > 0"))
        raise_all(problems)
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

    model_config = FROZEN

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
            problems.append(want("gamma", self.gamma, "an integer >= 1"))
        if "canary" in self.phases and not self.canary_steps:
            problems.append(want("canary_steps", list(self.canary_steps), "at least one step when canary runs"))
        for i, step in enumerate(self.canary_steps):
            low = self.canary_steps[i - 1] if i else 0.0
            if not (low < step < 1.0):
                problems.append(want(f"canary_steps[{i}]", step, f"a fraction in ({low}, 1), increasing"))
        if not (0.0 < self.observe_fraction < 1.0):
            problems.append(want("observe_fraction", self.observe_fraction, "a fraction in (0, 1)"))
        if self.consecutive_passes < 1:
            problems.append(want("consecutive_passes", self.consecutive_passes, "an integer >= 1"))
        if self.failure_limit < 0:
            problems.append(want("failure_limit", self.failure_limit, "an integer >= 0"))
        if self.error_limit < 0:
            problems.append(want("error_limit", self.error_limit, "an integer >= 0"))
        for key in ("evaluation_interval_s", "stale_after_s"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                problems.append(want(key, getattr(self, key), "a finite number of seconds > 0"))
        if self.failure_window_s is not None and not (
            math.isfinite(self.failure_window_s) and self.failure_window_s >= self.evaluation_interval_s
        ):
            what = f"null or seconds >= evaluation_interval_s ({self.evaluation_interval_s})"
            problems.append(want("failure_window_s", self.failure_window_s, what))
        if self.max_lookback_s is not None and not (
            math.isfinite(self.max_lookback_s) and self.max_lookback_s >= self.evaluation_interval_s
        ):
            what = f"null or seconds >= evaluation_interval_s ({self.evaluation_interval_s})"
            problems.append(want("max_lookback_s", self.max_lookback_s, what))
        if not (math.isfinite(self.min_dwell_s) and self.min_dwell_s >= 0):
            problems.append(want("min_dwell_s", self.min_dwell_s, "a finite number of seconds >= 0"))
        if not (self.progress_deadline_s >= self.evaluation_interval_s):
            problems.append(
                want(
                    "progress_deadline_s",
                    self.progress_deadline_s,
                    f"at least evaluation_interval_s ({self.evaluation_interval_s})",
                )
            )
        if self.fallback_window is not None and not (0 <= self.fallback_window <= self.gamma):
            problems.append(
                want("fallback_window", self.fallback_window, f"an integer in [0, gamma={self.gamma}] or null")
            )
        names = [g.name for g in self.gates]
        problems += [
            want(f"gates[{i}].name", name, "a name no other gate uses")
            for i, name in enumerate(names)
            if name in names[:i]
        ]
        raise_all(problems)
        return self

    def _phase_problems(self) -> list[str]:
        if not self.phases or Phase(self.phases[0]) != Phase.BASELINE:
            return [want("phases", list(self.phases), "a list starting with baseline")]
        return [
            want(f"phases[{i}]", phase, f"a phase after {self.phases[i - 1]} in {' -> '.join(LADDER)}")
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


_EXPONENT_WITHOUT_DOT = re.compile(r"[-+]?[0-9]+[eE][-+]?[0-9]+")


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
        nested: dict[str, type[BaseModel]] = {
            "gates": Gate,
            "notify": Webhook,
            "comparison": Comparison,
            "adaptive": Adaptive,
        }
        model = nested.get(str(loc[0]), RolloutPolicy) if len(loc) > 1 else RolloutPolicy
        return [f"{key}: unknown key (known: {', '.join(model.model_fields)})"]
    if kind == "invalid_key":  # the input is the key, and loc ends with it
        return [want(_path(loc[:-1]) or "rollout policy", value, "keys that are strings")]
    if kind == "literal_error":
        what = "one of " + error["ctx"]["expected"].replace("'", "").replace(" or ", ", ")
    else:
        what = {
            "float_type": "a number",
            "int_type": "an integer",
            "bool_type": "true or false",
            "string_type": "a string",
            "tuple_type": "a list",
            "model_type": "a mapping",
            "finite_number": "a finite number",
        }.get(kind, error["msg"])
    line = want(key or "rollout policy", value, what)
    if kind == "float_type" and isinstance(value, str) and _EXPONENT_WITHOUT_DOT.fullmatch(value):
        # PyYAML reads YAML 1.1, whose floats need a dot: 1e-3 is text there, a number in JSON and YAML 1.2.
        line += f" (YAML 1.1 reads {value} as text: write it with a dot, as in 1.0e-3)"
    return [line]


def problems(raw: Any) -> list[str]:
    """Every problem of decoded YAML as a rollout policy, each naming its key and value; [] when valid."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [want("rollout policy", raw, "a mapping")]
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
        return yaml_text.load_file(path)
    except yaml_text.NotUTF8Error as exc:
        raise RolloutPolicyError(f"{path}: {exc}") from exc
    except yaml_text.YAMLTextError as exc:
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
