"""The staged-rollout state machine (docs/design.md §6), as pure functions over immutable state.

The ladder is ``policy.stages()`` (baseline, shadow, one rung per canary step,
compact, adaptive); ``fallback`` and ``paused`` sit beside it. Every transition
is a ``Decision`` — data that the caller persists before applying it with
``apply`` — and a restarted controller rebuilds its state with ``replay`` over
the persisted decisions.

Invariants:
- ``revision`` grows by one exactly when the served policy changes (advance,
  rollback, promote, abort, pause, resume, revert_table); holds and table
  publications keep it.
- ``fallback`` is left only by ``resume``; nothing automatic leaves it.
- An advance needs ``consecutive_passes`` all-pass intervals in the current
  stage; a failed or inconclusive interval resets the streak, so a value that
  oscillates around a threshold never advances, and its failures accumulate
  until the failure limit sends the rollout to the sticky fallback: no flapping.
  A failed interval counts towards the limits for ``failure_window_s`` (the
  whole stage when None), so a stage without end (adaptive) rolls back on
  failures that come close together, not on a few spread over weeks.
- ``paused`` holds the stage it paused at (``stage``), never advances, and still
  rolls back on a critical failure.
- In ``adaptive`` a failed interval while fitted cost tables are served, failed by
  gates a table can fail (``TABLE_METRICS``) only, reverts to the static tables (a new
  revision of the same stage, judged afresh); only a failure on the static tables,
  or of another gate, counts towards fallback. Publishing a fitted table
  changes no counter and no revision.
- One contract is judged at a time (``controller.contract``): a window that mixes
  contracts is inconclusive, and a window on a new one re-evaluates (back to shadow,
  or to baseline when the new contract has no baseline steps); every decision
  carries the contract in force after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sparkgate.policies.adaptive import TABLE_METRICS
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import (
    CHANGES_POLICY,
    OPERATOR_ACTIONS,
    Action,
    Outcome,
    Phase,
)

from .contract import ContractReading
from .gates import Verdict, interval_outcome


class TransitionError(ValueError):
    """An operator action the current phase does not allow; the message says why."""


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


def _move(
    policy: RolloutPolicy,
    state: RolloutState | None,
    now: float,
    action: str,
    stage: int | None,
    reasons: tuple[dict[str, Any], ...],
    outcome: str | None = None,
    operator: str | None = None,
    paused: bool = False,
    contract: str | None = None,
) -> Decision:
    """A decision that changes the served policy to ladder ``stage`` (None: fallback); ``contract`` is the one
    in force after it (default: the state's)."""
    if stage is None:
        phase, fraction = Phase.FALLBACK, 0.0
    else:
        rung = policy.stages()[stage]
        phase, fraction = (Phase.PAUSED if paused else rung.phase), rung.compact_fraction
    return Decision(
        now,
        (state.revision if state else 0) + 1,
        state.phase if state else None,
        phase,
        fraction,
        action,
        outcome,
        reasons,
        operator,
        stage,
        contract if contract is not None else (state.contract if state else None),
    )


def _hold(
    state: RolloutState, now: float, outcome: str, reasons: tuple[dict[str, Any], ...], contract: str | None = None
) -> Decision:
    return Decision(
        now,
        state.revision,
        state.phase,
        state.phase,
        state.compact_fraction,
        Action.HOLD,
        outcome,
        reasons,
        None,
        state.stage,
        contract if contract is not None else state.contract,
    )


def start(policy: RolloutPolicy, now: float) -> Decision:
    """The first decision of a new ledger: the bottom of the ladder."""
    return _move(policy, None, now, Action.START, 0, ({"rule": "start"},))


def fall_back(policy: RolloutPolicy, state: RolloutState, now: float, rule: str, **detail: object) -> Decision:
    """A rollback decided outside the gates (e.g. the persisted stage left the policy file)."""
    return _move(policy, state, now, Action.ROLLBACK, None, ({"rule": rule, **detail},))


def decide(
    policy: RolloutPolicy,
    state: RolloutState,
    verdicts: Iterable[Verdict],
    now: float,
    contract: ContractReading | None = None,
) -> Decision:
    """The automatic decision after one evaluation interval with ``verdicts`` over a window whose contracts
    ``contract`` read (None: contracts are not checked)."""
    verdicts = list(verdicts)
    reading = contract or ContractReading(state.contract)
    outcome = interval_outcome(verdicts)
    if reading.mixed and outcome != Outcome.CRITICAL:
        outcome = Outcome.INCONCLUSIVE  # figures over two contracts judge neither
    gates = tuple(v.to_dict() for v in verdicts)
    judged = reading.judged

    def because(rule: str, **detail: object) -> tuple[dict[str, Any], ...]:
        return ({"rule": rule, **detail},) + gates

    def move(action: str, stage: int | None, reasons: tuple[dict[str, Any], ...], paused: bool = False) -> Decision:
        return _move(policy, state, now, action, stage, reasons, outcome, paused=paused, contract=judged)

    def hold(reasons: tuple[dict[str, Any], ...]) -> Decision:
        return _hold(state, now, outcome, reasons, judged)

    if state.phase == Phase.FALLBACK:
        return _hold(state, now, outcome, because("fallback is left only by resume"))
    if outcome == Outcome.CRITICAL:
        return move(Action.ROLLBACK, None, because("critical gate failed"))
    if reading.changed:
        assert state.stage is not None, "only fallback has no stage, and fallback holds above"
        target = min(state.stage, 1 if reading.in_baseline else 0)
        detail = {"contract_from": state.contract, "contract_to": judged, "differs": list(reading.differs)}
        rule = "contract changed: evaluate again from " + str(policy.stages()[target].phase)
        return move(Action.REEVALUATE, target, because(rule, **detail), paused=state.phase == Phase.PAUSED)
    if state.phase == Phase.PAUSED:
        return hold(because("paused"))
    failed = [v for v in verdicts if v.decides and v.outcome == Outcome.FAIL]
    table_failed = [v.gate for v in failed if v.metric in TABLE_METRICS]
    if table_failed and len(table_failed) == len(failed) and state.phase == Phase.ADAPTIVE and state.tables:
        # Fitted tables are the one thing adaptive changes: undo them first, and fall back only when the
        # static tables fail too. A failure no table causes (calibration) beside them takes the usual path.
        rule = "a gate a cost table can fail failed on fitted tables: back to the static tables"
        return move(Action.REVERT_TABLE, state.stage, because(rule, tables=dict(state.tables), gates=table_failed))
    limits = {g.name: g for g in policy.gates}
    for v in verdicts:
        gate = limits.get(v.gate)
        if v.decides and v.outcome == Outcome.FAIL and gate is not None and gate.failure_limit is not None:
            failures = state.recent_failures(now, policy.failure_window_s, v.gate) + 1
            if failures > gate.failure_limit:
                return move(Action.ROLLBACK, None, because("gate failure limit", gate=v.gate, failures=failures,
                                                           limit=gate.failure_limit))  # fmt: skip
    failures = state.recent_failures(now, policy.failure_window_s) + 1
    if outcome == Outcome.FAIL and failures > policy.failure_limit:
        return move(Action.ROLLBACK, None, because("failure limit", failures=failures, limit=policy.failure_limit))
    if outcome == Outcome.FAIL:
        return hold(because("failed interval", failures=failures, limit=policy.failure_limit))
    if outcome == Outcome.ERROR and state.errors + 1 > policy.error_limit:
        return move(Action.ROLLBACK, None, because("error limit", errors=state.errors + 1, limit=policy.error_limit))
    if outcome == Outcome.ERROR:
        return hold(because("measurement error", errors=state.errors + 1, limit=policy.error_limit))
    inconclusive_for = now - state.last_conclusive_at
    if outcome == Outcome.INCONCLUSIVE and state.phase != "baseline" and inconclusive_for >= policy.progress_deadline_s:
        late = {"inconclusive_s": inconclusive_for, "deadline_s": policy.progress_deadline_s}
        if policy.on_progress_deadline == "pause":
            return move(Action.PAUSE, state.stage, because("progress deadline: paused for an operator", **late), True)
        return move(Action.ROLLBACK, None, because("progress deadline", **late))
    if outcome == Outcome.INCONCLUSIVE and reading.mixed:
        return hold(because("contracts mixed in the window: nothing is judged", contracts=reading.to_dict()["seen"]))
    if outcome == Outcome.INCONCLUSIVE:
        return hold(because("inconclusive", inconclusive_s=inconclusive_for, deadline_s=policy.progress_deadline_s))
    passes = state.passes + 1
    if passes < policy.consecutive_passes:
        return hold(because("passing", passes=passes, needed=policy.consecutive_passes))
    assert state.stage is not None, "only fallback has no stage, and fallback holds above"
    if state.stage == len(policy.stages()) - 1:
        return hold(because("top of the ladder", passes=passes))
    for v in verdicts:
        gate = limits.get(v.gate)
        if v.decides and gate is not None and gate.consecutive_passes is not None:
            # As ``_streaks`` counts it: anything but a pass (a guard's inconclusive, too) starts it over.
            streak = state.streak(v.gate)[0] + 1 if v.outcome == Outcome.PASS else 0
            if streak < gate.consecutive_passes:
                return hold(because("gate streak", gate=v.gate, passes=streak, needed=gate.consecutive_passes))
    dwelt = now - state.entered_at
    if dwelt < policy.min_dwell_s:
        return hold(because("minimum dwell", passes=passes, dwelt_s=dwelt, min_dwell_s=policy.min_dwell_s))
    return move(
        Action.ADVANCE,
        state.stage + 1,
        because("consecutive passes", passes=passes, needed=policy.consecutive_passes),
    )


def command(
    policy: RolloutPolicy, state: RolloutState, action: str, operator: str, now: float, note: str = ""
) -> Decision:
    """An operator's ``promote`` (one rung up, skipping gates), ``abort`` (to fallback), ``pause`` or
    ``resume`` (from fallback to the first serving stage; from paused to the paused stage)."""
    if action not in OPERATOR_ACTIONS:
        raise TransitionError(f"action={action!r}: expected one of {', '.join(OPERATOR_ACTIONS)}")
    if not operator:
        raise TransitionError("operator: required for a manual action")
    reasons: tuple[dict[str, Any], ...] = ({"rule": f"operator {action}", "note": note},)
    last = len(policy.stages()) - 1
    if action == Action.REVERT_TABLE:
        if state.phase != Phase.ADAPTIVE or state.static_only:
            why = "already reverted in this stage" if state.static_only else f"only in adaptive, not {state.phase}"
            raise TransitionError(f"revert_table: {why}")
        reasons = ({**reasons[0], "tables": dict(state.tables)},)
        return _move(policy, state, now, Action.REVERT_TABLE, state.stage, reasons, operator=operator)
    if action == Action.ABORT:
        if state.phase == Phase.FALLBACK:
            raise TransitionError("abort: already in fallback")
        return _move(policy, state, now, Action.ABORT, None, reasons, operator=operator)
    if action == Action.RESUME:
        if state.phase == Phase.FALLBACK:
            return _move(policy, state, now, Action.RESUME, min(1, last), reasons, operator=operator)
        if state.phase == Phase.PAUSED:
            return _move(policy, state, now, Action.RESUME, state.stage, reasons, operator=operator)
        raise TransitionError(f"resume: only from fallback or paused, not {state.phase}")
    if state.phase in (Phase.FALLBACK, Phase.PAUSED):
        raise TransitionError(f"{action}: not from {state.phase} (resume first)")
    if action == Action.PAUSE:
        return _move(policy, state, now, Action.PAUSE, state.stage, reasons, operator=operator, paused=True)
    assert state.stage is not None, "only fallback has no stage, and it was refused above"
    if state.stage == last:
        raise TransitionError(f"promote: {state.phase} is the top of the ladder")
    return _move(policy, state, now, Action.PROMOTE, state.stage + 1, reasons, operator=operator)


def publish_table(state: RolloutState, now: float, group: str, version: str, detail: dict[str, Any]) -> Decision:
    """Replica group ``group`` serves fitted table ``version`` from now on (adaptive only); ``detail`` says
    why the update rule published it."""
    if state.phase != Phase.ADAPTIVE or state.static_only:
        raise TransitionError(f"publish_table: only in adaptive before a revert, not {state.phase}")
    reasons = ({"rule": "cost table published", "group": group, "version": version, **detail},)
    return Decision(now, state.revision, state.phase, state.phase, state.compact_fraction, Action.PUBLISH_TABLE,
                    None, reasons, None, state.stage, state.contract)  # fmt: skip


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
        raise ValueError(f"action={decision.action!r}: a ledger must begin with {str(Action.START)!r}")
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
    """Per-gate streaks after an interval decided ``at`` whose verdicts are ``reasons[1:]`` (dry runs do not
    count)."""
    streaks: dict[str, tuple[int, tuple[float, ...]]] = {name: (p, f) for name, p, f in state.gate_streaks}
    for v in reasons[1:]:
        if "gate" in v and not v.get("dry_run"):
            passes, failed = streaks.get(v["gate"], (0, ()))
            streaks[v["gate"]] = (
                passes + 1 if v["outcome"] == Outcome.PASS else 0,
                failed + ((at,) if v["outcome"] == Outcome.FAIL else ()),
            )
    return tuple((name, p, f) for name, (p, f) in sorted(streaks.items()))


def stage_of(policy: RolloutPolicy, phase: str, compact_fraction: float, phase_from: str | None) -> int | None:
    """The ladder index a persisted policy change points at (paused: the stage it paused from).
    Raises ``LookupError`` when the policy file no longer has that stage."""
    if phase == Phase.FALLBACK:
        return None
    rung_phase = phase_from if phase == Phase.PAUSED else phase
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
