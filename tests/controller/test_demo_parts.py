"""The pieces of ``sparkgate demo``: its policy, the arrival process, the fleet's cleanup, the summary."""
from __future__ import annotations

import sys

import pytest

from collectors.store import Store
from controller import ledger, rollout
from controller.demo import DEMO_POLICY, demo_policy, prepare_out
from controller.demo_fleet import Fleet, FleetError
from controller.demo_member import Arrivals, swing
from controller.demo_summary import fallback_reason, gate_table, phases_entered, stages_of, summarize
from controller.gates import judge_all, judge_baseline
from controller.metrics import Measurement
from policies.rollout import load_rollout_policy

from .conftest import T0, ingest_synthetic


def test_the_demo_policy_loads_and_walks_the_ladder_up_to_compact():
    policy = load_rollout_policy(DEMO_POLICY)
    assert [(s.phase, s.compact_fraction) for s in policy.stages()] == [
        ("baseline", 0.0), ("shadow", 0.0), ("canary", 0.05), ("canary", 0.25), ("canary", 0.5), ("compact", 1.0)]
    assert {"survival_ece", "consistency_mismatches", "state_rollback_failures"} <= {g.metric for g in policy.gates}
    assert policy.progress_deadline_s < 600  # a stalled demo falls back within minutes, not an hour
    quick = demo_policy(None, quick=True)
    assert quick.evaluation_interval_s < policy.evaluation_interval_s
    assert quick.consecutive_passes < policy.consecutive_passes and quick.gates == policy.gates


def test_prepare_out_refuses_a_directory_it_did_not_make(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(Exception, match="not made by sparkgate demo"):
        prepare_out(tmp_path)
    assert (tmp_path / "mine.txt").exists()
    out = tmp_path / "demo"
    prepare_out(out)
    (out / "old.duckdb").write_text("from the last run")
    prepare_out(out)
    assert not (out / "old.duckdb").exists()


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def requests():
    from itertools import count

    class R:
        def __init__(self, i):
            self.request_id, self.temperature = f"r{i}", 0.0

    return (R(i) for i in count())


def test_arrivals_hand_out_only_what_arrived_and_shed_beyond_the_backlog():
    clock = FakeClock()
    arrivals = Arrivals(requests(), lambda t: 20.0, clock, seed=1, backlog=40)
    assert list(arrivals) == []  # nothing has arrived at t=0
    clock.now += 1.0
    first = list(arrivals)
    assert 5 <= len(first) <= 40 and arrivals.shed == 0  # a Poisson second at 20/s
    assert [r.request_id for r in first] == [f"r{i}" for i in range(len(first))]
    clock.now += 10.0
    assert arrivals.pending() and len(arrivals.waiting) == 40
    assert arrivals.shed == arrivals.arrived - len(first) - 40 > 0
    arrivals.temperature = 1.0
    assert next(arrivals).temperature == 1.0


def test_swing_moves_the_rate_around_its_mean():
    rate = swing(6.0, 0.5, 20.0, 0.0)
    assert rate(0) == pytest.approx(6.0) and rate(5) == pytest.approx(9.0) and rate(15) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        swing(6.0, 1.0, 20.0, 0.0)


def test_the_fleet_stops_its_children_even_when_the_caller_fails(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with Fleet(tmp_path) as fleet:
            child = fleet.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
            raise RuntimeError("boom")
    assert child.process.poll() is not None


def test_a_child_that_exits_early_is_reported_with_its_log(tmp_path):
    with Fleet(tmp_path) as fleet:
        fleet.spawn("broken", [sys.executable, "-c", "print('cannot bind'); raise SystemExit(3)"])
        with pytest.raises(FleetError, match="broken exited with status 3(.|\n)*cannot bind"):
            fleet.wait(lambda: False, 30.0, "something", "broken")


def _walk(store: Store, policy, start: float):
    """Ledger of a rollout that climbs to compact on passing intervals, then fails ECE twice."""
    now = start
    decision = rollout.start(policy, now)
    decisions = [decision]
    state = rollout.apply(None, decision)
    good = {g.metric: Measurement(0.9 if "util" in g.metric or "tokens" in g.metric else 0.0, 10_000)
            for g in policy.gates}
    while state.phase != "compact" or state.passes < 1:
        now += policy.evaluation_interval_s
        phase = policy.stages()[state.stage].phase
        verdicts = [judge_baseline(policy, 10_000)] if phase == "baseline" else \
            judge_all(policy.gates_for(phase), good)
        decision = rollout.decide(policy, state, verdicts, now)
        decisions.append(decision)
        state = rollout.apply(state, decision)
    fault_at = now + 0.5
    bad = {**good, "survival_ece": Measurement(0.4, 5_000)}
    while state.phase != "fallback":
        now += policy.evaluation_interval_s
        decision = rollout.decide(policy, state, judge_all(policy.gates_for("compact"), bad), now)
        decisions.append(decision)
        state = rollout.apply(state, decision)
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
        "baseline", "shadow", "canary 5%", "canary 25%", "canary 50%", "compact", "compact + fault", "fallback"]
    assert [s["fault"] for s in summary["stages"]] == [False] * 6 + [True, True]
    assert summary["fallback_reason"].startswith("failure limit (2 failed intervals > limit 1): survival_ece 0.4 >")
    assert summary["fallback_reason"] == fallback_reason(decisions)
    assert set(summary["tokens_per_s_by_phase"]) == {"baseline", "fallback"}
    labels = summary["labels"]
    assert labels["censored"] > 0 and labels["observed"] > 0  # synthetic traffic mixes every mode
    assert summary["decisions"][-1]["action"] == "rollback" and summary["decisions"][-1]["failing"]


def test_stages_split_at_the_fault_and_tables_align():
    policy = demo_policy(None, quick=True)
    store_free = [rollout.start(policy, T0)]
    stages = stages_of(store_free, T0 + 10, fault_at=T0 + 4)
    assert [(s.label, s.start, s.end, s.faulted) for s in stages] == [
        ("baseline", T0, T0 + 4, False), ("baseline + fault", T0 + 4, T0 + 10, True)]
    verdicts = [v.to_dict() for v in judge_all(policy.gates, {"survival_ece": Measurement(0.31, 5000)})]
    table = gate_table(verdicts).splitlines()
    assert table[0].split()[:2] == ["gate", "value"] and len(table) == len(policy.gates) + 1
    assert "0.310" in table[1] and "fail" in table[1]
    assert len({len(line.split("  ")[0]) for line in table}) == 1  # the gate column is padded to one width
