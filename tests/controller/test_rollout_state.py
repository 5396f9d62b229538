"""The rollout's state and its fold over decisions: counters from a stage's intervals, a fresh stage on a
policy change, table publications, and the ladder index of a persisted policy change."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.controller.rollout import publish_table, start
from sparkgate.controller.rollout_state import Decision, apply, replay, stage_counters, stage_of
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.policies.vocabulary import Action, Outcome, Phase

POLICY = parse_rollout_policy(
    {
        "canary_steps": [0.05, 0.5],
        "failure_window_s": 300,
        "evaluation_interval_s": 60,
        "gates": [{"metric": "survival_ece", "threshold": 0.05, "direction": "at_most"}],
    }
)
OUTCOMES = [Outcome.PASS, Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.ERROR]


def _hold(at: float, outcome: str, gate_outcome: str | None = None, dry_run: bool = False) -> Decision:
    verdicts = () if gate_outcome is None else ({"gate": "survival_ece", "outcome": gate_outcome, "dry_run": dry_run},)
    return Decision(at, 1, Phase.BASELINE, Phase.BASELINE, 0.0, Action.HOLD, outcome, ({"rule": "hold"}, *verdicts))


def _advance(at: float, revision: int) -> Decision:
    return Decision(at, revision, Phase.BASELINE, Phase.SHADOW, 0.0, Action.ADVANCE, Outcome.PASS, ({"rule": "x"},))


def test_a_ledger_that_does_not_begin_with_a_policy_change_is_refused():
    with pytest.raises(ValueError, match="action='hold': a ledger must begin with 'start'"):
        apply(None, _hold(1.0, Outcome.PASS))
    assert replay([]) is None


@given(st.lists(st.sampled_from(OUTCOMES), max_size=30))
def test_a_stages_counters_are_its_intervals_outcomes(outcomes):
    decisions = [start(POLICY, 0.0)] + [_hold(60.0 * (i + 1), o) for i, o in enumerate(outcomes)]
    state = replay(decisions)
    assert state is not None and (state.revision, state.phase, state.stage) == (1, Phase.BASELINE, 0)

    def trailing(kind: str) -> int:
        return len(outcomes) - max((i + 1 for i, o in enumerate(outcomes) if o != kind), default=0)

    assert state.evaluations == len(outcomes)
    assert state.passes == trailing(Outcome.PASS) and state.errors == trailing(Outcome.ERROR)
    assert state.failed_at == tuple(60.0 * (i + 1) for i, o in enumerate(outcomes) if o == Outcome.FAIL)
    conclusive = [60.0 * (i + 1) for i, o in enumerate(outcomes) if o in (Outcome.PASS, Outcome.FAIL)]
    assert state.last_conclusive_at == (conclusive[-1] if conclusive else 0.0)
    # A policy change starts the next stage's counters afresh, at its own revision.
    moved = apply(state, _advance(9999.0, 2))
    assert (moved.revision, moved.phase, moved.entered_at) == (2, Phase.SHADOW, 9999.0)
    assert moved.last_conclusive_at == 9999.0
    assert (moved.passes, moved.failures, moved.errors, moved.evaluations, moved.gate_streaks) == (0, 0, 0, 0, ())


def test_a_gates_streak_counts_its_own_verdicts_and_a_dry_run_counts_none():
    decisions = [start(POLICY, 0.0), _hold(60.0, Outcome.PASS, Outcome.PASS), _hold(120.0, Outcome.FAIL, Outcome.FAIL)]
    decisions += [_hold(180.0, Outcome.PASS, Outcome.PASS), _hold(240.0, Outcome.PASS, Outcome.FAIL, dry_run=True)]
    state = replay(decisions)
    assert state is not None and state.streak("survival_ece") == (1, 1) and state.streak("other") == (0, 0)
    # A failure counts for less than the window after it was decided (at 120 s: until 420 s).
    assert state.recent_failures(419.0, 300.0, "survival_ece") == 1 and state.recent_failures(419.0, 300.0) == 1
    assert state.recent_failures(420.0, 300.0) == 0 and state.recent_failures(10**9, None) == 1
    counters = stage_counters(POLICY, state, 420.0)
    assert (counters["failures"], counters["failure_window_s"], counters["passes"]) == (0, 300.0, 2)


def test_an_interval_that_judged_no_gate_starts_every_gates_pass_streak_over():
    passing = [_hold(60.0 * i, Outcome.PASS, Outcome.PASS) for i in (1, 2)]
    error = ({"rule": "measurement error"}, {"gate": "evaluation", "outcome": "error"})
    evaluation_failed = Decision(180.0, 1, Phase.BASELINE, Phase.BASELINE, 0.0, Action.HOLD, Outcome.ERROR, error)
    state = replay([start(POLICY, 0.0), *passing, evaluation_failed, _hold(240.0, Outcome.PASS, Outcome.PASS)])
    assert state is not None and state.passes == 1 and state.streak("survival_ece") == (1, 0)


def test_a_published_table_is_served_per_group_and_changes_no_counter_or_revision():
    state = replay([start(POLICY, 0.0), _hold(60.0, Outcome.PASS), _advance(120.0, 2)])
    assert state is not None
    adaptive = apply(state, Decision(180.0, 7, Phase.SHADOW, Phase.ADAPTIVE, 1.0, Action.ADVANCE, Outcome.PASS, ()))
    for group, version in [("b", "v1"), ("a", "v2"), ("b", "v3")]:
        adaptive = apply(adaptive, publish_table(adaptive, 200.0, group, version, {}))
    assert adaptive.tables == (("a", "v2"), ("b", "v3"))
    assert (adaptive.revision, adaptive.evaluations, adaptive.passes) == (7, 0, 0)


def test_a_persisted_policy_change_points_at_its_rung_and_a_lost_rung_is_named():
    for i, rung in enumerate(POLICY.stages()):
        assert stage_of(POLICY, rung.phase, rung.compact_fraction, None) == i
        assert stage_of(POLICY, Phase.PAUSED, rung.compact_fraction, rung.phase) == i
    assert stage_of(POLICY, Phase.FALLBACK, 0.0, "canary") is None
    with pytest.raises(LookupError, match="canary at compact_fraction 0.25 is not a stage"):
        stage_of(POLICY, Phase.CANARY, 0.25, None)
