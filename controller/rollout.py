"""The staged-rollout state machine (docs/design.md §6), as pure functions over immutable state.

The ladder is ``policy.stages()`` (baseline, shadow, one rung per canary step,
compact, adaptive); ``fallback`` and ``paused`` sit beside it. Every transition
is a ``Decision`` — data that the caller persists before applying it with
``rollout_state.apply`` — and a restarted controller rebuilds its state with
``rollout_state.replay`` over the persisted decisions.

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
from typing import Any

from sparkgate.policies.adaptive import TABLE_METRICS
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import (
    OPERATOR_ACTIONS,
    Action,
    Outcome,
    Phase,
)

from .contract import ContractReading
from .gates import Verdict, interval_outcome
from .rollout_state import UNJUDGED, Decision, RolloutState


class TransitionError(ValueError):
    """An operator action the current phase does not allow; the message says why."""


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
    rung = None if stage is None else policy.stages()[stage]
    if rung is None:
        phase, fraction = Phase.FALLBACK, 0.0
    else:
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
        None if rung is None else str(rung.phase),
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
    # Over two contracts no gate is judged: its failure neither reverts, nor rolls back, nor counts later.
    failed = [] if reading.mixed else [v for v in verdicts if v.decides and v.outcome == Outcome.FAIL]
    table_failed = [v.gate for v in failed if v.metric in TABLE_METRICS]
    if table_failed and len(table_failed) == len(failed) and state.phase == Phase.ADAPTIVE and state.tables:
        # Fitted tables are the one thing adaptive changes: undo them first, and fall back only when the
        # static tables fail too. A failure no table causes (calibration) beside them takes the usual path.
        rule = "a gate a cost table can fail failed on fitted tables: back to the static tables"
        return move(Action.REVERT_TABLE, state.stage, because(rule, tables=dict(state.tables), gates=table_failed))
    limits = {g.name: g for g in policy.gates}
    for v in failed:
        gate = limits.get(v.gate)
        if gate is not None and gate.failure_limit is not None:
            failures = state.recent_failures(now, policy.failure_window_s, v.gate) + 1
            if failures > gate.failure_limit:
                return move(Action.ROLLBACK, None, because("gate failure limit", gate=v.gate, failures=failures,
                                                           limit=gate.failure_limit))  # fmt: skip
    failures = state.recent_failures(now, policy.failure_window_s) + 1
    if outcome == Outcome.FAIL and failures > policy.failure_limit:
        return move(Action.ROLLBACK, None, because("failure limit", failures=failures, limit=policy.failure_limit))
    if outcome == Outcome.FAIL:
        return hold(because("failed interval", failures=failures, limit=policy.failure_limit))
    # Baseline serves the control itself, so there is nothing to roll back from: fallback, with a
    # fallback_window, would serve compact windows instead. It waits, counting the errors, as for the deadline.
    if outcome == Outcome.ERROR and state.phase != Phase.BASELINE and state.errors + 1 > policy.error_limit:
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
        return hold(because(UNJUDGED, contracts=reading.to_dict()["seen"]))
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
