"""Scripted metric streams through the real gates, state machine and ledger (a DuckDB file)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.controller.contract import ContractReading
from sparkgate.controller.gates import error_verdict, judge_all, judge_baseline
from sparkgate.controller.measurement import Measurement
from sparkgate.controller.rollout import TransitionError, command, decide, fall_back, start
from sparkgate.controller.rollout_state import RolloutState, apply, stage_of
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.policies.vocabulary import Phase

# The state machine's rules, on gates of every kind (a level, a bound, comparisons with intervals, critical
# counts), fixed here rather than taken from the shipped defaults.
GATES = [
    {"metric": "survival_ece", "threshold": 0.05, "direction": "at_most", "min_samples": 2000},
    {"metric": "survival_ece_upper", "threshold": 0.08, "direction": "at_most", "min_samples": 2000},
    {"metric": "upper_bound_utilization", "threshold": 0.85, "direction": "at_least", "min_samples": 500},
    {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most", "min_samples": 200},
    {"metric": "p99_tpot_ratio", "threshold": 1.10, "direction": "at_most", "min_samples": 10},
    {"metric": "p99_ttft_ratio", "threshold": 1.20, "direction": "at_most", "min_samples": 10},
    {"metric": "tokens_per_s_ratio", "threshold": 0.98, "direction": "at_least", "min_samples": 10},
    {"metric": "goodput_ratio", "threshold": 0.95, "direction": "at_least", "min_samples": 10},
    {"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True},
    {"metric": "state_rollback_failures", "threshold": 0, "direction": "at_most", "critical": True},
]
POLICY = parse_rollout_policy(
    {
        "canary_steps": [0.05, 0.5],
        "consecutive_passes": 2,
        "failure_limit": 1,
        "evaluation_interval_s": 60,
        "progress_deadline_s": 300,
        "gates": GATES,
    }
)
GOOD = {
    "survival_ece": Measurement(0.02, 5000),
    "survival_ece_upper": Measurement(0.04, 5000),
    "upper_bound_utilization": Measurement(0.95, 1000),
    "tier_miss_rate": Measurement(0.0, 1000),
    # Comparisons with their intervals, wholly on the good side of every default threshold.
    "p99_tpot_ratio": Measurement(1.0, 40, 0.97, 1.04, "sign test"),
    "p99_ttft_ratio": Measurement(1.0, 40, 0.95, 1.08, "sign test"),
    "tokens_per_s_ratio": Measurement(1.1, 40, 1.05, 1.15, "sign test"),
    "goodput_ratio": Measurement(1.0, 40, 0.98, 1.02, "sign test"),
    "consistency_mismatches": Measurement(0.0, 10),
    "state_rollback_failures": Measurement(0.0, 10),
}


def good(**changes) -> dict[str, Measurement]:
    return {**GOOD, **changes}


class Script:
    """Drives the state machine one interval at a time, persisting each decision before applying it."""

    def __init__(self, store: Store, policy=POLICY, now: float = 0.0):
        self.store, self.policy, self.now = store, policy, now
        self.state = ledger.load_state(store, policy)
        if self.state is None:
            self._commit(start(policy, now))

    def _commit(self, decision):
        ledger.record(self.store, decision)
        self.state = apply(self.state, decision)
        return decision

    def interval(self, measurements: dict[str, Measurement] | None = None, stale: str | None = None):
        self.now += self.policy.evaluation_interval_s
        measurements = GOOD if measurements is None else measurements
        phase = self.policy.stages()[self.state.stage].phase if self.state.stage is not None else "shadow"
        verdicts = (
            judge_all(self.policy.gates_for(phase), measurements, stale)
            if phase != "baseline"
            else [
                judge_baseline(self.policy, measurements.get("baseline_steps", Measurement(1000, 1000)).samples, stale)
            ]
        )
        return self._commit(decide(self.policy, self.state, verdicts, self.now))

    def act(self, action: str, operator: str = "alice", note: str = ""):
        return self._commit(command(self.policy, self.state, action, operator, self.now, note))

    def climb_to(self, phase: str, fraction: float | None = None):
        while not (self.state.phase == phase and (fraction is None or self.state.compact_fraction == fraction)):
            assert self.interval().action in ("hold", "advance")


@pytest.fixture
def script(store):
    return Script(store)


def test_advances_after_consecutive_passes_through_the_whole_ladder(script):
    actions = [script.interval().action for _ in range(2 * (len(POLICY.stages()) - 1) + 2)]
    assert actions == ["hold", "advance"] * (len(POLICY.stages()) - 1) + ["hold", "hold"]
    assert (script.state.phase, script.state.compact_fraction) == ("adaptive", 1.0)
    assert script.state.revision == len(POLICY.stages())  # one revision per policy change
    changes = ledger.decisions(script.store, changes_only=True)
    assert [(d.phase_to, d.compact_fraction) for d in changes] == [
        (s.phase, s.compact_fraction) for s in POLICY.stages()
    ]


def test_holds_while_inconclusive_and_an_inconclusive_interval_resets_the_streak(script):
    script.climb_to("shadow")
    few = good(survival_ece=Measurement(0.01, 10))
    assert script.interval().action == "hold"
    decision = script.interval(few)
    assert (decision.action, decision.outcome, decision.revision) == ("hold", "inconclusive", 2)
    assert any(r.get("gate") == "survival_ece" and "min_samples" in r["note"] for r in decision.reasons)
    assert script.state.passes == 0
    assert script.interval().action == "hold"  # the streak starts again
    assert script.interval().action == "advance"


def test_stale_data_is_inconclusive(script):
    script.climb_to("shadow")
    decision = script.interval(stale="newest step is 900 s old")
    assert decision.outcome == "inconclusive"
    assert all(r["outcome"] == "inconclusive" for r in decision.reasons[1:])
    # A critical failure is evidence however old the steps are.
    assert script.interval(good(consistency_mismatches=Measurement(1.0, 1)), stale="old").action == "rollback"


def test_rolls_back_when_failures_exceed_the_limit_and_records_why(script):
    script.climb_to("canary", 0.05)
    bad = good(tier_miss_rate=Measurement(0.1, 1000))
    first = script.interval(bad)
    assert (first.action, first.phase_to) == ("hold", "canary")
    assert script.interval().action == "hold"  # a pass in between does not forgive the failure
    rollback = script.interval(bad)
    assert (rollback.action, rollback.phase_from, rollback.phase_to) == ("rollback", "canary", Phase.FALLBACK)
    assert rollback.reasons[0] == {"rule": "failure limit", "failures": 2, "limit": 1}
    gate = next(r for r in rollback.reasons if r.get("gate") == "tier_miss_rate")
    assert (gate["outcome"], gate["value"], gate["threshold"], gate["samples"]) == ("fail", 0.1, 0.02, 1000)
    stored = ledger.decisions(script.store, limit=1)[0]
    assert stored.to_dict() == rollback.to_dict()


def test_a_critical_gate_rolls_back_at_once(script):
    script.climb_to("canary", 0.5)
    decision = script.interval(good(consistency_mismatches=Measurement(1.0, 3)))
    assert (decision.action, decision.outcome, decision.phase_to) == ("rollback", "critical", Phase.FALLBACK)
    assert decision.reasons[0]["rule"] == "critical gate failed"


def test_progress_deadline_sends_an_inconclusive_phase_to_fallback(script):
    script.climb_to("shadow")
    silent = {}
    actions = [script.interval(silent).action for _ in range(5)]
    assert actions == ["hold"] * 4 + ["rollback"]
    assert ledger.decisions(script.store, limit=1)[0].reasons[0]["rule"] == "progress deadline"


def test_baseline_waits_without_a_deadline(script):
    for _ in range(10):
        script.interval(stale="no steps in the window")
    assert script.state.phase == "baseline"


def test_baseline_waits_out_errors_and_never_falls_back(store):
    """Baseline serves the control: falling back from it on a collector outage would serve fallback's
    windows instead, and a resume would skip baseline's reference check."""
    script = Script(store, POLICY.replace(error_limit=1))
    outage = [error_verdict("poll of http://sglang-0 failed", "collector")]
    for errors in (1, 2, 3):
        script.now += POLICY.evaluation_interval_s
        decision = script._commit(decide(script.policy, script.state, outage, script.now))
        assert (decision.action, decision.outcome, script.state.phase) == ("hold", "error", "baseline")
        assert decision.reasons[0] == {"rule": "measurement error", "errors": errors, "limit": 1}
    assert script.interval().outcome == "pass" and script.state.errors == 0


def test_fallback_is_left_only_by_resume(script):
    script.climb_to("canary", 0.05)
    script.act("abort", note="pager")
    for _ in range(6):
        assert script.interval().action == "hold"
    assert script.state.phase == Phase.FALLBACK
    resumed = script.act("resume", operator="bob", note="fixed")
    assert (resumed.phase_from, resumed.phase_to, resumed.operator) == (Phase.FALLBACK, "shadow", "bob")
    assert resumed.reasons == ({"rule": "operator resume", "note": "fixed"},)


def test_oscillation_around_a_threshold_does_not_flap(script):
    script.climb_to("shadow")
    revisions = []
    for i in range(20):
        value = 0.051 if i % 2 else 0.049
        script.interval(good(survival_ece=Measurement(value, 5000)))
        revisions.append((script.state.revision, script.state.phase))
    phases = [phase for _, phase in revisions]
    assert "canary" not in phases  # never two passes in a row, so never an advance
    assert phases[-1] == Phase.FALLBACK and len(set(revisions)) == 2  # shadow, then one rollback that sticks


def test_dry_run_gates_are_recorded_but_never_decide(store):
    policy = parse_rollout_policy(
        {
            **POLICY.to_dict(),
            "gates": [
                {"metric": "survival_ece", "threshold": 0.05, "direction": "at_most"},
                {
                    "metric": "tier_miss_rate",
                    "threshold": 0.0,
                    "direction": "at_most",
                    "dry_run": True,
                },
            ],
        }
    )
    script = Script(store, policy)
    script.climb_to("shadow")
    decision = script.interval(good(tier_miss_rate=Measurement(0.5, 100)))
    assert decision.outcome == "pass"
    assert next(r for r in decision.reasons if r.get("gate") == "tier_miss_rate")["outcome"] == "fail"


def test_restart_mid_canary_resumes_phase_revision_and_counters(tmp_path):
    path = tmp_path / "ledger.duckdb"
    with Store(path) as store:
        script = Script(store)
        script.climb_to("canary", 0.5)
        script.interval(good(tier_miss_rate=Measurement(0.5, 1000)))
        script.interval()
        before = script.state
    with Store(path) as store:
        resumed = Script(store, now=script.now)
        assert resumed.state == before
        assert (before.phase, before.compact_fraction, before.failures, before.passes) == ("canary", 0.5, 1, 1)
        assert resumed.interval().action == "advance"  # the streak survived the restart
        assert resumed.state.revision == before.revision + 1


def test_a_stage_counts_its_evaluations_whatever_their_outcome_from_zero_at_entry(script):
    # The calibration gates' look index is this count plus one: the stage's first evaluation pays the
    # first look's share, however late its tick, and a restart replays the count from the ledger.
    script.climb_to("shadow")
    assert script.state.evaluations == 0
    script.now += 100  # a late tick (inside the progress deadline) is still the stage's first look
    script.interval(good(survival_ece=Measurement(0.01, 10)))  # inconclusive
    script.interval(stale="no steps")
    assert script.state.evaluations == 2 and script.state.phase == "shadow"
    assert ledger.load_state(script.store, POLICY).evaluations == 2
    script.act("pause")
    assert script.state.evaluations == 0


def test_pause_holds_the_stage_and_resume_returns_to_it(script):
    script.climb_to("canary", 0.5)
    paused = script.act("pause")
    assert (paused.phase_to, paused.compact_fraction) == (Phase.PAUSED, 0.5)
    for _ in range(4):
        assert script.interval().action == "hold"
    assert ledger.load_state(script.store, POLICY) == script.state
    resumed = script.act("resume")
    assert (resumed.phase_to, resumed.compact_fraction) == ("canary", 0.5)
    script.act("pause")
    assert script.interval(good(state_rollback_failures=Measurement(1.0, 1))).action == "rollback"


def test_promote_skips_the_gates_and_operator_errors_are_clear(script):
    assert script.act("promote", note="skip baseline").phase_to == "shadow"
    with pytest.raises(TransitionError, match="resume: only from fallback or paused"):
        command(POLICY, script.state, "resume", "alice", script.now)
    with pytest.raises(TransitionError, match="operator"):
        command(POLICY, script.state, "abort", "", script.now)
    with pytest.raises(TransitionError, match="action='jump'"):
        command(POLICY, script.state, "jump", "alice", script.now)
    script.act("abort")
    with pytest.raises(TransitionError, match="already in fallback"):
        command(POLICY, script.state, "abort", "alice", script.now)
    with pytest.raises(TransitionError, match="resume first"):
        command(POLICY, script.state, "promote", "alice", script.now)
    script.act("resume")
    script.climb_to("adaptive")
    with pytest.raises(TransitionError, match="top of the ladder"):
        command(POLICY, script.state, "promote", "alice", script.now)


def test_a_stage_the_policy_file_lost_is_reported(script):
    script.climb_to("canary", 0.5)
    narrower = parse_rollout_policy({**POLICY.to_dict(), "canary_steps": [0.1]})
    with pytest.raises(LookupError, match="canary at compact_fraction 0.5"):
        ledger.load_state(script.store, narrower)
    decision = fall_back(narrower, script.state, script.now, "stage not in the policy file")
    assert (decision.phase_to, decision.revision) == (Phase.FALLBACK, script.state.revision + 1)
    assert stage_of(narrower, Phase.FALLBACK, 0.0, "canary") is None


def test_a_contract_change_keeps_a_pause_and_yields_to_a_critical_failure_and_to_fallback(script):
    script.climb_to("canary")
    script.act("pause")
    paused = replace(script.state, contract="A")
    changed = ContractReading("A", ("B",), (10,), ("drafter_version: a -> b",), in_baseline=True)
    verdicts = judge_all(POLICY.gates_for("canary"), GOOD)
    decision = decide(POLICY, paused, verdicts, script.now + 60, changed)
    assert (decision.action, decision.phase_to, decision.stage, decision.contract) == ("reevaluate", "paused", 1, "B")
    assert apply(paused, decision).contract == "B"
    critical = judge_all(POLICY.gates_for("canary"), good(consistency_mismatches=Measurement(1.0, 1)))
    rollback = decide(POLICY, paused, critical, script.now + 60, changed)
    assert rollback.action == "rollback" and rollback.contract == "B"
    fallback = apply(paused, decide(POLICY, paused, critical, script.now + 60))
    held = decide(POLICY, fallback, verdicts, script.now + 120, changed)
    assert (held.action, held.contract) == ("hold", "A")  # fallback is left only by resume


def test_a_minimum_dwell_holds_a_passing_stage_until_it_has_lasted(store):
    script = Script(store, POLICY.replace(min_dwell_s=300))  # five intervals of 60 s
    script.climb_to("shadow")
    decisions = [script.interval() for _ in range(5)]
    assert [d.action for d in decisions] == ["hold", "hold", "hold", "hold", "advance"]
    assert decisions[1].reasons[0] == {"rule": "minimum dwell", "passes": 2, "dwelt_s": 120.0, "min_dwell_s": 300.0}


def test_an_inconclusive_stage_past_its_deadline_pauses_for_an_operator_when_the_policy_says_so(store):
    script = Script(store, POLICY.replace(on_progress_deadline="pause"))
    script.climb_to("canary", 0.05)
    few = good(survival_ece=Measurement(0.01, 10))
    decisions = [script.interval(few) for _ in range(5)]
    assert [d.action for d in decisions] == ["hold"] * 4 + ["pause"]
    assert decisions[-1].reasons[0]["rule"] == "progress deadline: paused for an operator"
    assert (script.state.phase, script.state.stage) == ("paused", 2)
    assert script.act("resume").phase_to == "canary"  # the operator decides, nothing rolled back


def test_a_grey_zone_between_two_thresholds_is_inconclusive_not_a_failure(store):
    gates = [{"metric": "tier_miss_rate", "threshold": 0.02, "fail_threshold": 0.05, "direction": "at_most"}]
    script = Script(store, POLICY.replace(gates=gates))
    script.climb_to("shadow")
    grey = script.interval({"tier_miss_rate": Measurement(0.03, 1000)})
    assert grey.outcome == "inconclusive" and "grey zone between 0.02 and 0.05" in grey.reasons[1]["note"]
    assert script.interval({"tier_miss_rate": Measurement(0.06, 1000)}).outcome == "fail"
    assert script.interval({"tier_miss_rate": Measurement(0.01, 1000)}).outcome == "pass"
    with pytest.raises(ValueError, match="fail_threshold"):
        POLICY.replace(gates=[{**gates[0], "fail_threshold": 0.01}])  # on the good side of the threshold


def test_gates_that_cannot_be_measured_are_errors_counted_apart_with_their_own_limit(store):
    script = Script(store, POLICY.replace(error_limit=2))
    script.climb_to("shadow")
    broken = good(tier_miss_rate=Measurement(None, 0, error="promql 'x': connection refused"))
    first = script.interval(broken)
    assert (first.action, first.outcome) == ("hold", "error") and script.state.errors == 1
    assert next(r for r in first.reasons if r.get("gate") == "tier_miss_rate")["note"].startswith("promql")
    assert script.interval(good(tier_miss_rate=Measurement(None, 0))).outcome == "inconclusive"  # no data
    assert script.state.errors == 0  # errors count consecutive intervals
    assert [script.interval(broken).action for _ in range(3)] == ["hold", "hold", "rollback"]
    assert ledger.decisions(store)[-1].reasons[0] == {"rule": "error limit", "errors": 3, "limit": 2}


def test_a_gates_own_failure_limit_rolls_back_before_the_policys(store):
    gates = [g.model_dump(mode="json") for g in POLICY.gates]
    gates = [dict(g, failure_limit=0) if g["metric"] == "tier_miss_rate" else g for g in gates]
    script = Script(store, POLICY.replace(failure_limit=5, gates=gates))
    script.climb_to("canary", 0.05)
    slow = good(upper_bound_utilization=Measurement(0.5, 1000))  # a gate without a limit of its own
    assert script.interval(slow).action == "hold" and script.state.streak("upper_bound_utilization") == (0, 1)
    decision = script.interval(good(tier_miss_rate=Measurement(0.1, 1000)))
    assert decision.action == "rollback"
    assert decision.reasons[0] == {"rule": "gate failure limit", "gate": "tier_miss_rate", "failures": 1, "limit": 0}


def test_a_gates_own_streak_holds_an_advance_the_interval_streak_would_allow(store):
    gates = [g.model_dump(mode="json") for g in POLICY.gates]
    gates = [dict(g, consecutive_passes=4) if g["metric"] == "survival_ece" else g for g in gates]
    script = Script(store, POLICY.replace(gates=gates))  # intervals need 2 passes in a row
    script.climb_to("shadow")
    decisions = [script.interval() for _ in range(2)]
    # The streaks live in the ledger: a restarted controller reads them back.
    assert ledger.load_state(store, script.policy).streak("survival_ece") == (2, 0)
    decisions += [script.interval() for _ in range(2)]
    assert [d.action for d in decisions] == ["hold", "hold", "hold", "advance"]
    assert decisions[1].reasons[0] == {"rule": "gate streak", "gate": "survival_ece", "passes": 2, "needed": 4}
    assert script.state.gate_streaks == ()  # a new stage starts its streaks again


def test_a_guards_inconclusive_interval_starts_its_own_streak_over_before_an_advance(store):
    # A guard's inconclusive verdict does not hold the interval, but it breaks the guard's streak: the
    # stage may not advance on the very interval whose verdict reset it.
    gates = [g.model_dump(mode="json") for g in POLICY.gates]
    gates = [dict(g, guard=True, consecutive_passes=2) if g["metric"] == "tier_miss_rate" else g for g in gates]
    script = Script(store, POLICY.replace(gates=gates))
    script.climb_to("shadow")
    assert script.interval().action == "hold" and script.interval().action == "advance"
    script.interval()
    decision = script.interval(good(tier_miss_rate=Measurement(0.0, 10)))  # too few samples: inconclusive
    assert decision.action == "hold"
    assert decision.reasons[0] == {"rule": "gate streak", "gate": "tier_miss_rate", "passes": 0, "needed": 2}


def test_a_guard_that_cannot_be_measured_counts_towards_the_error_limit(store):
    # Unlike its inconclusive verdicts: a guard whose query fails cannot fail, so what it guards is unwatched.
    gates = [g.model_dump(mode="json") for g in POLICY.gates]
    gates = [dict(g, guard=True) if g["metric"] == "tier_miss_rate" else g for g in gates]
    script = Script(store, POLICY.replace(error_limit=1, gates=gates))
    script.climb_to("shadow")
    broken = good(tier_miss_rate=Measurement(None, 0, error="promql 'x': connection refused"))
    assert [script.interval(broken).outcome for _ in range(2)] == ["error", "error"]
    assert ledger.decisions(store)[-1].reasons[0] == {"rule": "error limit", "errors": 2, "limit": 1}


def test_failures_count_within_the_failure_window_so_a_stage_without_end_rolls_back_on_a_burst_not_on_stragglers(
    store,
):
    gates = [g.model_dump(mode="json") for g in POLICY.gates]
    gates = [dict(g, failure_limit=1) if g["metric"] == "tier_miss_rate" else g for g in gates]
    # Failed intervals count for five intervals: a policy limit of 1 (two tolerated) and a gate limit of 1.
    script = Script(store, POLICY.replace(failure_window_s=300, gates=gates))
    script.climb_to("adaptive")
    slow, misses = good(upper_bound_utilization=Measurement(0.5, 1000)), good(tier_miss_rate=Measurement(0.1, 1000))
    for failing in [slow, misses] * 4:  # a failure, then five good intervals: it has aged out before the next
        assert [script.interval(m).action for m in [failing] + [GOOD] * 5] == ["hold"] * 6
    assert script.state.phase == "adaptive" and script.state.failures == 8  # the stage's count is kept
    assert script.state.recent_failures(script.now, 300) == 0
    # Stored and replayed, the failure times come back: a restarted controller counts the same.
    assert ledger.load_state(store, script.policy).failed_at == script.state.failed_at
    assert script.interval(misses).action == "hold"
    decision = script.interval(misses)  # two of the gate's failures within the window
    assert decision.action == "rollback"
    assert decision.reasons[0] == {"rule": "gate failure limit", "gate": "tier_miss_rate", "failures": 2, "limit": 1}


def test_without_a_failure_window_every_failure_of_the_stage_counts(store):
    script = Script(store, POLICY.replace(failure_window_s=None))
    script.climb_to("adaptive")
    slow = good(upper_bound_utilization=Measurement(0.5, 1000))
    assert script.interval(slow).action == "hold"
    assert [script.interval().action for _ in range(50)] == ["hold"] * 50
    decision = script.interval(slow)  # the policy's failure_limit 1: the second failed interval of the stage
    assert decision.action == "rollback" and decision.reasons[0] == {"rule": "failure limit", "failures": 2, "limit": 1}


def test_a_failure_window_shorter_than_an_interval_is_refused():
    with pytest.raises(ValueError, match="failure_window_s"):
        POLICY.replace(failure_window_s=30)


@given(st.lists(st.tuples(st.integers(1, 8), st.booleans()), max_size=40), st.integers(0, 3), st.integers(1, 10))
def test_a_stage_rolls_back_exactly_when_one_failure_window_holds_more_failures_than_the_limit(steps, limit, window):
    policy = POLICY.replace(failure_limit=limit, failure_window_s=60.0 * window)
    top = len(policy.stages()) - 1
    state = RolloutState(1, "adaptive", top, 1.0, entered_at=0.0)
    slow = good(upper_bound_utilization=Measurement(0.5, 1000))
    verdicts = {failed: judge_all(policy.gates_for("adaptive"), slow if failed else GOOD) for failed in (False, True)}
    now, failed_at = 0.0, []
    for gap, failed in steps:
        now += 60.0 * gap
        decision = decide(policy, state, verdicts[failed], now)
        counted = [t for t in failed_at if now - t < policy.failure_window_s] + ([now] if failed else [])
        assert (decision.action == "rollback") == (failed and len(counted) > limit)
        if decision.action == "rollback":
            return
        state = apply(state, decision)
        failed_at += [now] if failed else []
