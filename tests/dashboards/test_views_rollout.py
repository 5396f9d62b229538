"""The Rollout page against the fixture store (see conftest): the phase and the verdicts that rolled back.

Reference figures come from a second path: the ledger read from the writer's
store, or the collectors' ``Aggregate`` built straight from the ingested
records, never from the dashboard's own queries.
"""

from __future__ import annotations

import pytest

from tests.dashboards.known_store import MISSES, SHADOW_STEPS, metrics, rollback, run_app, snapshot_args


def test_rollout_shows_the_phase_and_the_verdicts_that_rolled_back(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store))
    shown = metrics(app)
    assert shown["Phase"] == "fallback" and shown["Revision"] == "3" and shown["Compact fraction"] == "0%"
    # Fallback was entered by the rollback, which started its counters afresh; the window is the policy's.
    assert shown["Failed intervals (last 60 min)"].startswith("0 / limit ")
    assert "failure limit" in app.error[0].value and "resume" in app.error[0].value
    gates = app.dataframe[0].value.set_index("gate")
    decided = {r["gate"]: r for r in rollback(fixture_store)["reasons"] if "gate" in r}
    assert gates.loc["tier_miss_rate", "value"] == pytest.approx(MISSES / SHADOW_STEPS)
    # The treatment epochs' steps: half the stage's.
    assert gates.loc["tier_miss_rate", "verdict"] == "fail"
    assert gates.loc["tier_miss_rate", "samples"] == SHADOW_STEPS // 2
    assert gates.loc["survival_ece", "value"] == decided["survival_ece"]["value"]
    assert gates.loc["survival_ece", "threshold"] == "≤ 0.5" and gates.loc["survival_ece", "verdict"] == "pass"
    assert gates.loc["upper_bound_utilization", "dry run"] == "dry run"
    decisions = app.dataframe[1].value
    assert list(decisions["action"]) == ["rollback", "advance", "start"]
    assert decisions.loc[0, "gates failed"] == (
        "upper_bound_utilization (dry run), tier_miss_rate, p99_ttft_ratio (dry run)"
    )
    # The dry-run comparison gates: treatment requests took 1.5x as long in every epoch pair.
    assert gates.loc["p99_ttft_ratio", "verdict"] == "fail" and gates.loc["p99_ttft_ratio", "dry run"] == "dry run"
    assert gates.loc["p99_ttft_ratio", "samples"] == 20  # the fleet's pairs: 10 on each of two replicas
    assert gates.loc["p99_step_ratio", "verdict"] == "inconclusive"
    commands = app.code[0].value
    assert "sparkgate resume" in commands and "sparkgate abort" not in commands and "promote" not in commands


def test_a_reverted_adaptive_stage_is_not_offered_another_revert(monkeypatch, tmp_path):
    import yaml

    from sparkgate.collectors.store import Store
    from sparkgate.controller import ledger, rollout
    from sparkgate.controller.rollout_state import apply
    from sparkgate.policies.rollout import parse_rollout_policy

    spec = {"canary_steps": [0.25]}
    policy, policy_path = parse_rollout_policy(spec), tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(spec))
    with Store(tmp_path / "s.duckdb") as store:
        decision, state, at = rollout.start(policy, 1.75e9), None, 1.75e9
        while True:
            ledger.record(store, decision)
            state, at = apply(state, decision), at + 1
            if state.static_only:
                break
            action = "revert_table" if state.phase == "adaptive" else "promote"
            decision = rollout.command(policy, state, action, "ops", at)
    app = run_app(monkeypatch, "--db", str(tmp_path / "s.duckdb"), "--policy", str(policy_path))
    commands = app.code[0].value
    assert "sparkgate abort" in commands and "revert" not in commands  # the controller would refuse it
