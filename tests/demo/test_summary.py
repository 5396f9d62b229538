"""What the demo reports, read back from a store that holds a known walk."""

from __future__ import annotations

from sparkgate.collectors.store import Store
from sparkgate.controller import ledger, rollout, rollout_state
from sparkgate.controller.gates import judge_all, judge_baseline
from sparkgate.controller.measurement import Measurement
from sparkgate.demo.command import demo_policy
from sparkgate.demo.summary import (
    fallback_reason,
    phases_entered,
    stages_of,
    summarize,
)
from tests.conftest import T0, ingest_synthetic


def _walk(store: Store, policy, start: float):
    """Ledger of a rollout that climbs to compact on passing intervals, then fails ECE twice."""
    now = start
    decision = rollout.start(policy, now)
    decisions = [decision]
    state = rollout_state.apply(None, decision)
    good = {
        g.metric: Measurement(0.9 if "util" in g.metric or "tokens" in g.metric else 0.0, 10_000) for g in policy.gates
    }
    while state.phase != "compact" or state.passes < 1:
        now += policy.evaluation_interval_s
        phase = policy.stages()[state.stage].phase
        verdicts = [judge_baseline(policy, 10_000)] if phase == "baseline" else judge_all(policy.gates_for(phase), good)
        decision = rollout.decide(policy, state, verdicts, now)
        decisions.append(decision)
        state = rollout_state.apply(state, decision)
    fault_at = now + 0.5
    bad = {**good, "survival_ece": Measurement(0.4, 5_000)}
    while state.phase != "fallback":
        now += policy.evaluation_interval_s
        decision = rollout.decide(policy, state, judge_all(policy.gates_for("compact"), bad), now)
        decisions.append(decision)
        state = rollout_state.apply(state, decision)
    for d in decisions:
        ledger.record(store, d)
    return fault_at, now


def test_the_summary_reads_the_walk_the_fault_and_the_reason_back_from_the_store(tmp_path):
    policy = demo_policy(None, quick=True)
    with Store(tmp_path / "demo.duckdb") as store:
        fault_at, end = _walk(store, policy, T0)
        ingest_synthetic(store, 50, T0 + 1, phase="baseline", replica="a")
        ingest_synthetic(store, 50, fault_at + 1, phase="fallback", replica="a", first_step=50)
        summary = summarize(store, T0, end + 1, "drift", fault_at)
        decisions = ledger.decisions(store)
    assert summary["phases"] == phases_entered(decisions) == ["baseline", "shadow", "canary", "compact", "fallback"]
    assert [s["stage"] for s in summary["stages"]] == [
        "baseline",
        "shadow",
        "canary 5%",
        "canary 25%",
        "canary 50%",
        "compact",
        "compact + fault",
        "fallback",
    ]
    assert [s["fault"] for s in summary["stages"]] == [False] * 6 + [True, True]
    assert summary["fallback_reason"].startswith("failure limit (2 failed intervals > limit 1): survival_ece 0.4 >")
    assert summary["fallback_reason"] == fallback_reason(decisions)
    assert set(summary["tokens_per_s_by_phase"]) == {"baseline", "fallback"}
    labels = summary["labels"]
    assert labels["censored"] > 0 and labels["observed"] > 0  # synthetic traffic mixes every mode
    assert summary["decisions"][-1]["action"] == "rollback" and summary["decisions"][-1]["failing"]


def test_stages_split_at_the_fault():
    policy = demo_policy(None, quick=True)
    store_free = [rollout.start(policy, T0)]
    stages = stages_of(store_free, T0 + 10, fault_at=T0 + 4)
    assert [(s.label, s.start, s.end, s.faulted) for s in stages] == [
        ("baseline", T0, T0 + 4, False),
        ("baseline + fault", T0 + 4, T0 + 10, True),
    ]
