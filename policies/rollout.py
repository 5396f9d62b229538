"""The rollout policy file (DESIGN §5, §6): phases, traffic steps, gates, timing.

One YAML file, every key optional (missing keys take the defaults below, which
``default_rollout.yaml`` spells out in full), unknown keys rejected. Errors
name the key path and the bad value, e.g. ``gates[2].threshold: expected a
number, got 'high'``. Loading is pure: the controller decides what to do with
the policy; nothing here evaluates metrics or holds state.
"""
from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Union, get_args, get_origin, get_type_hints

import yaml

PHASES = ("baseline", "shadow", "canary", "compact", "adaptive")
SERVING_PHASES = PHASES[1:]  # phases gates judge; baseline only measures the reference
DIRECTIONS = ("at_most", "at_least")
METRICS = {
    "survival_ece": "worst per-depth survival ECE on uncensored traffic",
    "survival_ece_upper": "bootstrap upper bound of survival_ece",
    "upper_bound_utilization": "sum(a) / sum(min(a*, gamma)) over cap-accept samples (shadow: suggested)",
    "tier_miss_rate": "steps that ran eager / all steps",
    "p99_step_ratio": "p99 step time / baseline p99 at matched batch size",
    "tokens_per_s_ratio": "committed tokens per second / baseline",
    "consistency_mismatches": "greedy compact-vs-static replay mismatches",
    "state_rollback_failures": "state-after-rollback check failures",
}
DEFAULT_PATH = Path(__file__).with_name("default_rollout.yaml")


class RolloutPolicyError(ValueError):
    """A bad rollout policy; the message starts with the key path."""

    def at(self, prefix: str) -> RolloutPolicyError:
        return RolloutPolicyError(f"{prefix}.{self}" if prefix else str(self))


def _fail(key: str, value: Any, want: str) -> RolloutPolicyError:
    return RolloutPolicyError(f"{key}: expected {want}, got {value!r}")


@dataclass(frozen=True)
class Gate:
    """One check per evaluation interval: ``metric`` compared with ``threshold``.

    Inconclusive (neither pass nor fail) below ``min_samples``. A failing
    ``critical`` gate rolls back at once; a ``dry_run`` gate is evaluated and
    recorded but never blocks or rolls back. ``promql`` takes the value from
    a Prometheus query instead of the store, and then ``metric`` is a free label.
    """

    metric: str
    threshold: float
    direction: str
    name: str = ""
    min_samples: int = 0
    critical: bool = False
    dry_run: bool = False
    phases: tuple[str, ...] = SERVING_PHASES
    promql: str | None = None

    def __post_init__(self) -> None:
        if self.promql is None and self.metric not in METRICS:
            raise _fail("metric", self.metric, f"one of {', '.join(METRICS)} (or set promql)")
        if self.promql is not None and not self.promql.strip():
            raise _fail("promql", self.promql, "a non-empty query")
        if not math.isfinite(self.threshold):
            raise _fail("threshold", self.threshold, "a finite number")
        if self.direction not in DIRECTIONS:
            raise _fail("direction", self.direction, f"one of {', '.join(DIRECTIONS)}")
        if self.min_samples < 0:
            raise _fail("min_samples", self.min_samples, "an integer >= 0")
        for i, phase in enumerate(self.phases):
            if phase not in SERVING_PHASES:
                raise _fail(f"phases[{i}]", phase, f"one of {', '.join(SERVING_PHASES)}")
        if not self.name:
            object.__setattr__(self, "name", self.metric)

    def passes(self, value: float) -> bool:
        """Whether ``value`` is on the good side of the threshold (equality passes)."""
        return value <= self.threshold if self.direction == "at_most" else value >= self.threshold


DEFAULT_GATES = (
    Gate("survival_ece", 0.05, "at_most", min_samples=2000),
    Gate("survival_ece_upper", 0.08, "at_most", min_samples=2000),
    Gate("upper_bound_utilization", 0.85, "at_least", min_samples=500),
    Gate("tier_miss_rate", 0.02, "at_most", min_samples=200),
    Gate("p99_step_ratio", 1.10, "at_most", min_samples=200),
    Gate("tokens_per_s_ratio", 0.98, "at_least", min_samples=200),
    Gate("consistency_mismatches", 0, "at_most", critical=True),
    Gate("state_rollback_failures", 0, "at_most", critical=True),
)


@dataclass(frozen=True)
class Stage:
    """One rung of the ladder: a phase and the fraction of traffic served compact."""

    phase: str
    compact_fraction: float


@dataclass(frozen=True)
class RolloutPolicy:
    """The whole file. Invariants (checked on construction):

    - ``phases`` is ``baseline`` followed by phases of ``PHASES`` in that order;
    - ``canary_steps`` strictly increasing in (0, 1), non-empty when canary runs;
    - ``0 < observe_fraction < 1``; ``fallback_window`` in [0, gamma] or None (static);
    - advance after ``consecutive_passes`` all-pass intervals; roll back when a
      phase's failed intervals exceed ``failure_limit``, or when a serving phase
      stays inconclusive for ``progress_deadline_s``; data older than
      ``stale_after_s`` makes a gate inconclusive;
    - gate names are unique.
    """

    gamma: int = 7
    phases: tuple[str, ...] = PHASES
    canary_steps: tuple[float, ...] = (0.05, 0.25, 0.5)
    observe_fraction: float = 0.05
    consecutive_passes: int = 3
    failure_limit: int = 2
    evaluation_interval_s: float = 60.0
    progress_deadline_s: float = 3600.0
    stale_after_s: float = 300.0
    fallback_window: int | None = None
    gates: tuple[Gate, ...] = field(default=DEFAULT_GATES)

    def __post_init__(self) -> None:
        if self.gamma < 1:
            raise _fail("gamma", self.gamma, "an integer >= 1")
        self._check_phases()
        if "canary" in self.phases and not self.canary_steps:
            raise _fail("canary_steps", list(self.canary_steps), "at least one step when canary runs")
        for i, step in enumerate(self.canary_steps):
            low = self.canary_steps[i - 1] if i else 0.0
            if not (low < step < 1.0):
                raise _fail(f"canary_steps[{i}]", step, f"a fraction in ({low}, 1), increasing")
        if not (0.0 < self.observe_fraction < 1.0):
            raise _fail("observe_fraction", self.observe_fraction, "a fraction in (0, 1)")
        if self.consecutive_passes < 1:
            raise _fail("consecutive_passes", self.consecutive_passes, "an integer >= 1")
        if self.failure_limit < 0:
            raise _fail("failure_limit", self.failure_limit, "an integer >= 0")
        for key in ("evaluation_interval_s", "stale_after_s"):
            if not (math.isfinite(getattr(self, key)) and getattr(self, key) > 0):
                raise _fail(key, getattr(self, key), "a finite number of seconds > 0")
        if not (self.progress_deadline_s >= self.evaluation_interval_s):
            raise _fail("progress_deadline_s", self.progress_deadline_s,
                        f"at least evaluation_interval_s ({self.evaluation_interval_s})")
        if self.fallback_window is not None and not (0 <= self.fallback_window <= self.gamma):
            raise _fail("fallback_window", self.fallback_window,
                        f"an integer in [0, gamma={self.gamma}] or null")
        names = [g.name for g in self.gates]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise _fail(f"gates[{i}].name", name, "a name no other gate uses")

    def _check_phases(self) -> None:
        if not self.phases or self.phases[0] != "baseline":
            raise _fail("phases", list(self.phases), "a list starting with baseline")
        for i, phase in enumerate(self.phases):
            if phase not in PHASES:
                raise _fail(f"phases[{i}]", phase, f"one of {', '.join(PHASES)}")
            if i and PHASES.index(phase) <= PHASES.index(self.phases[i - 1]):
                raise _fail(f"phases[{i}]", phase,
                            f"a phase after {self.phases[i - 1]} in {' -> '.join(PHASES)}")

    @property
    def fallback_window_value(self) -> int:
        """The window fallback serves: ``fallback_window``, or γ (static) when unset."""
        return self.gamma if self.fallback_window is None else self.fallback_window

    def stages(self) -> tuple[Stage, ...]:
        """The ladder the controller walks, one rung per canary step."""
        fractions = {"baseline": (0.0,), "shadow": (0.0,), "canary": self.canary_steps,
                     "compact": (1.0,), "adaptive": (1.0,)}
        return tuple(Stage(phase, f) for phase in self.phases for f in fractions[phase])

    def gates_for(self, phase: str) -> tuple[Gate, ...]:
        return tuple(g for g in self.gates if phase in g.phases)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, not tuples) that ``parse_rollout_policy`` reads back."""
        return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` checked against the annotated type (bools are never numbers)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        return _coerce(value, next(a for a in get_args(hint) if a is not type(None)), key)
    if origin is tuple:
        if not isinstance(value, list):
            raise _fail(key, value, "a list")
        return tuple(_coerce(v, get_args(hint)[0], f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, key)
    if hint is bool and isinstance(value, bool):
        return value
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint is str and isinstance(value, str):
        return value
    want = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[hint]
    raise _fail(key, value, want)


def _build(cls: type, raw: Any, key: str) -> Any:
    if not isinstance(raw, dict):
        raise _fail(key or "rollout policy", raw, "a mapping")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for name in raw:
        if name not in names:
            where = f"{key}.{name}" if key else str(name)
            raise RolloutPolicyError(f"{where}: unknown key (known: {', '.join(names)})")
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in raw
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise RolloutPolicyError(f"{key}.{missing[0]}: missing" if key else f"{missing[0]}: missing")
    kwargs = {n: _coerce(v, hints[n], f"{key}.{n}" if key else n) for n, v in raw.items()}
    try:
        return cls(**kwargs)
    except RolloutPolicyError as exc:
        raise exc.at(key) from None


def parse_rollout_policy(raw: Mapping[str, Any] | None) -> RolloutPolicy:
    """A validated policy from decoded YAML; ``None`` (an empty file) gives the defaults."""
    return _build(RolloutPolicy, {} if raw is None else raw, "")


def load_rollout_policy(path: str | Path = DEFAULT_PATH) -> RolloutPolicy:
    """Read and validate a policy file (the packaged defaults when no path is given)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise RolloutPolicyError(f"{path}: not valid YAML ({exc})") from exc
    try:
        return parse_rollout_policy(raw)
    except RolloutPolicyError as exc:
        raise RolloutPolicyError(f"{path}: {exc}") from None
