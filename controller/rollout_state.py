"""Where a rollout stands, and the decisions that move it (docs/design.md §6): ``RolloutState``,
the ``Decision`` record the ledger persists, ``apply`` and ``replay``.

Invariants: state changes only through ``apply``, and ``replay`` over the persisted decisions gives the
state the controller held when it made the last of them, so a restarted controller resumes where it
stood. A policy change (``CHANGES_POLICY``) starts its stage's counters afresh; any other decision keeps
the stage and adds one interval (or, for a table publication, one table) to its counters.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import CHANGES_POLICY, Action, Outcome, Phase

# The rule of an interval whose window mixes contracts: its figures judge neither, so no gate was judged.
UNJUDGED = "contracts mixed in the window: nothing is judged"


@dataclass(frozen=True)
class RolloutState:
    """Where the rollout stands. ``stage`` indexes ``policy.stages()`` (None in fallback; in paused, the
    stage to resume). ``passes``/``failures`` count intervals since ``entered_at`` (``recent_failures`` those
    within a failure window);
    ``last_conclusive_at`` is the latest pass or fail (or entry), for the progress deadline; ``errors``
    counts consecutive intervals whose gates could not be measured; ``evaluations`` counts the stage's
    intervals decided so far, whatever their outcome (the next one is its look ``evaluations + 1``)."""

    revision: int
    phase: str
    stage: int | None
    compact_fraction: float
    entered_at: float
    passes: int = 0
    failed_at: tuple[float, ...] = ()  # when the stage's failed intervals were decided
    last_conclusive_at: float = 0.0
    errors: int = 0  # consecutive error intervals
    evaluations: int = 0
    # Per gate that has decided in the stage: (name, consecutive passes, when its failed intervals were decided).
    gate_streaks: tuple[tuple[str, int, tuple[float, ...]], ...] = ()
    contract: str | None = None
    # Adaptive: the fitted cost table each replica group serves, as sorted (group, version) pairs (empty: the
    # static tables); ``static_only`` once the stage was entered by a revert, which no fitted table follows.
    tables: tuple[tuple[str, str], ...] = ()
    static_only: bool = False

    @property
    def failures(self) -> int:
        """Failed intervals of the stage."""
        return len(self.failed_at)

    def _gate(self, gate: str) -> tuple[int, tuple[float, ...]]:
        return next(((p, f) for name, p, f in self.gate_streaks if name == gate), (0, ()))

    def streak(self, gate: str) -> tuple[int, int]:
        """(consecutive passes, failed intervals) of ``gate`` in the stage."""
        passes, failed = self._gate(gate)
        return passes, len(failed)

    def recent_failures(self, now: float, window_s: float | None, gate: str | None = None) -> int:
        """Failed intervals of the stage (or of ``gate``) that count at ``now``: those decided less than
        ``window_s`` before it (None: every one of the stage)."""
        times = self.failed_at if gate is None else self._gate(gate)[1]
        return len(times) if window_s is None else sum(1 for t in times if now - t < window_s)


def stage_counters(policy: RolloutPolicy, state: RolloutState, now: float) -> dict[str, Any]:
    """The stage's counters against their limits, as ``GET /v1/status`` and the Rollout page show them: the
    failures that count at ``now`` (those within ``failure_window_s``)."""
    return {
        "stage": state.stage,
        "entered_at": state.entered_at,
        "passes": state.passes,
        "needed_passes": policy.consecutive_passes,
        "failures": state.recent_failures(now, policy.failure_window_s),
        "failure_window_s": policy.failure_window_s,
        "failure_limit": policy.failure_limit,
        "last_conclusive_at": state.last_conclusive_at,
    }


@dataclass(frozen=True)
class Decision:
    """One decision: ``revision``/``phase_to``/``compact_fraction`` describe the policy in effect after it.
    ``reasons`` hold one entry with ``rule`` (why this action) and one per gate verdict."""

    decided_at: float
    revision: int
    phase_from: str | None
    phase_to: str
    compact_fraction: float
    action: str
    outcome: str | None
    reasons: tuple[dict[str, Any], ...]
    operator: str | None = None
    stage: int | None = None
    contract: str | None = None
    # The phase of the ladder rung ``stage`` is (None: fallback, or a decision that changes no policy): what
    # a restart finds the stage by, since a paused rollout's own phase names no rung.
    rung: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "decided_at": self.decided_at,
            "revision": self.revision,
            "phase_from": self.phase_from,
            "phase_to": self.phase_to,
            "compact_fraction": self.compact_fraction,
            "action": self.action,
            "outcome": self.outcome,
            "reasons": list(self.reasons),
            "operator": self.operator,
            "contract": self.contract,
        }


def apply(state: RolloutState | None, decision: Decision) -> RolloutState:
    """The state after ``decision`` (which ``decide``/``command``/``start``/``publish_table`` made from
    ``state``)."""
    if decision.action in CHANGES_POLICY:
        return RolloutState(
            decision.revision,
            decision.phase_to,
            decision.stage,
            decision.compact_fraction,
            decision.decided_at,
            last_conclusive_at=decision.decided_at,
            contract=decision.contract,
            static_only=decision.action == Action.REVERT_TABLE,
        )
    if state is None:
        raise ValueError(f"action={str(decision.action)!r}: a ledger must begin with {str(Action.START)!r}")
    if decision.action == Action.PUBLISH_TABLE:
        rule = decision.reasons[0]
        tables = dict(state.tables) | {rule["group"]: rule["version"]}
        return replace(state, tables=tuple(sorted(tables.items())))
    conclusive = decision.outcome in (Outcome.PASS, Outcome.FAIL)
    return replace(
        state,
        passes=state.passes + 1 if decision.outcome == Outcome.PASS else 0,
        failed_at=state.failed_at + ((decision.decided_at,) if decision.outcome == Outcome.FAIL else ()),
        errors=state.errors + 1 if decision.outcome == Outcome.ERROR else 0,
        evaluations=state.evaluations + 1,
        gate_streaks=_streaks(state, decision.reasons, decision.decided_at),
        last_conclusive_at=decision.decided_at if conclusive else state.last_conclusive_at,
        contract=decision.contract,
    )


def _streaks(
    state: RolloutState, reasons: tuple[dict[str, Any], ...], at: float
) -> tuple[tuple[str, int, tuple[float, ...]], ...]:
    """Per-gate streaks after an interval decided ``at`` whose verdicts are ``reasons[1:]`` (a dry run's leaves
    its gate's alone). A gate's pass streak grows only by its pass: any other verdict, or none (an interval
    whose evaluation failed), starts it over, as the interval's own streak does. An interval that judged no
    gate (``UNJUDGED``) adds no failure."""
    unjudged = bool(reasons) and reasons[0].get("rule") == UNJUDGED
    judged = () if unjudged else reasons[1:]
    verdicts = {v["gate"]: v["outcome"] for v in judged if "gate" in v and not v.get("dry_run")}
    dry = {v["gate"] for v in reasons[1:] if "gate" in v and v.get("dry_run")}
    streaks: dict[str, tuple[int, tuple[float, ...]]] = {name: (p, f) for name, p, f in state.gate_streaks}
    for name in (set(streaks) - dry) | set(verdicts):
        passes, failed = streaks.get(name, (0, ()))
        outcome = verdicts.get(name)
        failed += (at,) if outcome == Outcome.FAIL else ()
        streaks[name] = (passes + 1 if outcome == Outcome.PASS else 0, failed)
    return tuple((name, p, f) for name, (p, f) in sorted(streaks.items()))


def stage_of(
    policy: RolloutPolicy, phase: str, compact_fraction: float, phase_from: str | None, rung: str | None = None
) -> int | None:
    """The ladder index a persisted policy change points at: the rung it names (``rung``), or for a decision
    persisted before rungs were (None) the phase it changed to (paused: the phase it paused from).
    Raises ``LookupError`` when the policy file no longer has that stage."""
    if phase == Phase.FALLBACK:
        return None
    rung_phase = rung or (phase_from if phase == Phase.PAUSED else phase)
    for i, stage in enumerate(policy.stages()):
        if stage.phase == rung_phase and abs(stage.compact_fraction - compact_fraction) < 1e-9:
            return i
    raise LookupError(f"{rung_phase} at compact_fraction {compact_fraction} is not a stage of this rollout policy")


def replay(decisions: Iterable[Decision]) -> RolloutState | None:
    """The state after persisted ``decisions`` in order (None for an empty ledger)."""
    state = None
    for decision in decisions:
        state = apply(state, decision)
    return state
