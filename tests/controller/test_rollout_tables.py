"""Adaptive's table decisions in the state machine: publish changes nothing else, a failure reverts first."""

from __future__ import annotations

import pytest

from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.controller.gates import judge_all
from sparkgate.controller.measurement import Measurement
from sparkgate.controller.rollout import TransitionError, command, decide, publish_table, start
from sparkgate.controller.rollout_state import apply
from sparkgate.policies.adaptive import ADAPTIVE_METRICS, TABLE_METRICS
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.policies.vocabulary import COMPARISON_METRICS, Action, Phase

POLICY = parse_rollout_policy(
    {
        "phases": ["baseline", "compact", "adaptive"],
        "consecutive_passes": 2,
        "failure_limit": 0,
        "gates": [
            {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most", "min_samples": 10},
            {"metric": "survival_ece", "threshold": 0.05, "direction": "at_most", "min_samples": 10},
        ],
    }
)
T = 1.75e9


def verdicts(miss_rate: float, ece: float = 0.01):
    return judge_all(
        POLICY.gates, {"tier_miss_rate": Measurement(miss_rate, 100), "survival_ece": Measurement(ece, 100)}
    )


def test_every_comparison_is_a_gate_a_table_can_fail():
    assert set(COMPARISON_METRICS) | set(ADAPTIVE_METRICS) <= set(TABLE_METRICS)
    assert not {m for m in TABLE_METRICS if "ece" in m or "consistency" in m}


def test_a_calibration_failure_on_fitted_tables_is_not_the_tables_doing():
    state = apply((s := in_adaptive()), publish_table(s, T + 5, "static-a", "static-a+a1", {}))
    decision = decide(POLICY, state, verdicts(0.0, ece=0.3), T + 10)
    assert decision.action == Action.ROLLBACK and decision.phase_to == Phase.FALLBACK


def in_adaptive():
    state = apply(None, start(POLICY, T))
    for i in range(2):
        state = apply(state, command(POLICY, state, "promote", "ops", T + i + 1))
    assert state.phase == Phase.ADAPTIVE and state.revision == 3
    return state


def test_publishing_a_table_keeps_the_revision_and_every_counter():
    state = in_adaptive()
    state = apply(state, decide(POLICY, state, verdicts(0.0), T + 10))
    assert state.passes == 1
    decision = publish_table(state, T + 11, "static-a", "static-a+a1", {"error_current": 0.4})
    published = apply(state, decision)
    assert decision.action == Action.PUBLISH_TABLE and decision.revision == state.revision
    assert published.tables == (("static-a", "static-a+a1"),)
    assert (published.passes, published.failures, published.revision, published.entered_at) == (
        state.passes, state.failures, state.revision, state.entered_at,
    )  # fmt: skip
    again = apply(published, publish_table(published, T + 12, "static-a", "static-a+a2", {}))
    assert again.tables == (("static-a", "static-a+a2"),)  # one table per group, the newest


def test_a_failure_on_fitted_tables_reverts_and_a_failure_on_static_falls_back():
    state = apply((s := in_adaptive()), publish_table(s, T + 5, "static-a", "static-a+a1", {}))
    revert = decide(POLICY, state, verdicts(0.5), T + 10)
    assert revert.action == Action.REVERT_TABLE and revert.phase_to == Phase.ADAPTIVE
    assert revert.revision == state.revision + 1 and revert.reasons[0]["tables"] == {"static-a": "static-a+a1"}
    assert revert.reasons[0]["gates"] == ["tier_miss_rate"]
    reverted = apply(state, revert)
    assert reverted.tables == () and reverted.static_only and reverted.failures == 0
    with pytest.raises(TransitionError, match="adaptive before a revert"):
        publish_table(reverted, T + 11, "static-a", "static-a+a2", {})
    fallback = decide(POLICY, reverted, verdicts(0.5), T + 20)
    assert fallback.action == Action.ROLLBACK and fallback.phase_to == Phase.FALLBACK


def test_a_calibration_failure_beside_a_table_gates_takes_the_usual_path():
    state = apply((s := in_adaptive()), publish_table(s, T + 5, "static-a", "static-a+a1", {}))
    decision = decide(POLICY, state, verdicts(0.5, ece=0.3), T + 10)
    assert decision.action == Action.ROLLBACK and decision.phase_to == Phase.FALLBACK


def test_a_failure_before_any_table_is_published_counts_as_usual():
    decision = decide(POLICY, in_adaptive(), verdicts(0.5), T + 10)
    assert decision.action == Action.ROLLBACK


def test_an_operator_reverts_only_in_adaptive_and_only_once():
    state = in_adaptive()
    with pytest.raises(TransitionError, match="only in adaptive, not baseline"):
        command(POLICY, apply(None, start(POLICY, T)), "revert_table", "ops", T)
    state = apply(state, publish_table(state, T + 5, "g", "g+a1", {}))
    decision = command(POLICY, state, "revert_table", "ops", T + 6, "tables look off")
    assert decision.operator == "ops" and decision.reasons[0]["tables"] == {"g": "g+a1"}
    reverted = apply(state, decision)
    with pytest.raises(TransitionError, match="already reverted"):
        command(POLICY, reverted, "revert_table", "ops", T + 7)
    assert command(POLICY, reverted, "abort", "ops", T + 8).phase_to == Phase.FALLBACK


def test_the_ledger_replays_tables_and_a_revert(tmp_path):
    path = tmp_path / "tables.duckdb"
    state = in_adaptive()
    with Store(path) as store:
        for d in [start(POLICY, T)] + [command(POLICY, apply(None, start(POLICY, T)), "promote", "ops", T + 1)]:
            ledger.record(store, d)
        state = ledger.load_state(store, POLICY)
        promote = command(POLICY, state, "promote", "ops", T + 2)
        ledger.record(store, promote)
        state = apply(state, promote)
        decision = publish_table(state, T + 5, "g", "g+a1", {"error_current": 0.4})
        ledger.record(store, decision)
        assert ledger.load_state(store, POLICY) == apply(state, decision)
        revert = command(POLICY, apply(state, decision), "revert_table", "ops", T + 6)
        ledger.record(store, revert)
        resumed = ledger.load_state(store, POLICY)
    assert resumed.static_only and resumed.tables == () and resumed.revision == 4
