"""The controller over a real DuckDB file: restarts, policy-file changes, staleness, failing actuators."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.label_sums import SUM_BUCKET_S
from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.controller.actuators import arms
from sparkgate.controller.supervisor import Controller, lookback_start
from sparkgate.policies.rollout import parse_rollout_policy
from tests.conftest import T0, Clock, ingest_synthetic, ingest_wire, synthetic_steps

POLICY = parse_rollout_policy(
    {
        "canary_steps": [0.1, 0.5],
        "stale_after_s": 120,
        "gates": [
            {"metric": "survival_ece", "threshold": 0.5, "direction": "at_most", "min_samples": 10},
            {
                "metric": "tier_miss_rate",
                "threshold": 0.1,
                "direction": "at_most",
                "name": "prom_misses",
                "promql": "max(rate(sparkgate_tier_misses_total[5m]))",
            },
        ],
    }
)


def controller(store, policy=POLICY, now=T0, **kw) -> Controller:
    return Controller(store, policy, clock=lambda: now, resamples=10, **kw)


def test_a_restarted_controller_serves_the_same_policy(tmp_path):
    path = tmp_path / "restart.duckdb"
    with Store(path) as store:
        first = controller(store)
        for _ in range(3):
            first.act("promote", "ops")
        payload, state = first.policy_payload(), first.state
    assert (payload.phase, payload.compact_fraction, payload.revision) == ("canary", 0.5, 4)
    with Store(path) as store:
        second = controller(store, now=T0 + 600)
        assert second.policy_payload() == payload and second.state == state
        assert [d.action for d in ledger.decisions(store)] == ["start"] + ["promote"] * 3


def test_a_stage_missing_from_a_new_policy_file_falls_back_with_the_reason_and_the_pinned_contract(tmp_path):
    """The contract goes on with the fallback: without it, one changed before a resume was pinned silently
    instead of evaluated again."""
    path = tmp_path / "policy-change.duckdb"
    with Store(path) as store:
        old = controller(store)
        for _ in range(3):
            old.act("promote", "ops")
        ingest_synthetic(store, 20, T0 + 1, contract="c0ffee00c0ffee00")
        old.clock = lambda: T0 + 60
        assert old.tick().contract == "c0ffee00c0ffee00"
    narrower = parse_rollout_policy({**POLICY.to_dict(), "canary_steps": [0.2]})
    with Store(path) as store:
        new = controller(store, narrower, now=T0 + 120)
        assert new.state.phase == "fallback" and new.state.revision == 5
        last = ledger.decisions(store, limit=1)[0]
        assert last.reasons[0]["rule"] == "stage not in the policy file"
        assert "canary at compact_fraction 0.5" in last.reasons[0]["note"]
        assert new.state.contract == last.contract == "c0ffee00c0ffee00"


def test_a_missing_stage_after_the_clock_stepped_back_falls_back_on_a_new_revision(tmp_path):
    # An NTP step back makes the newest change by insertion the older by decided_at; the fallback must
    # still take the next revision, or replicas serving the newest would never follow it.
    path, clock = tmp_path / "stepped.duckdb", Clock(T0 + 100)
    with Store(path) as store:
        old = Controller(store, POLICY, clock=clock)
        for _ in range(2):
            old.act("promote", "ops")
        clock.now = T0 + 50
        served = old.act("promote", "ops")  # canary, decided "before" the shadow promote
    narrower = parse_rollout_policy({**POLICY.to_dict(), "canary_steps": [0.2]})
    with Store(path) as store:
        new = Controller(store, narrower, clock=clock)
        assert new.state.phase == "fallback" and new.state.revision == served.revision + 1


def test_stale_steps_and_missing_prometheus_make_gates_inconclusive(store):
    ingest_synthetic(store, 20, T0 + 1, phase="shadow")
    ctl = controller(store, now=T0 + 400)
    ctl.act("promote", "ops")
    ingest_synthetic(store, 20, T0 + 401, phase="shadow", first_step=100)
    ctl.clock = lambda: T0 + 700  # 300 s after the newest step, past stale_after_s
    decision = ctl.tick()
    verdicts = {r["gate"]: r for r in decision.reasons[1:]}
    assert decision.outcome == "inconclusive"
    assert verdicts["survival_ece"]["note"].startswith("newest step is 299 s old")
    ctl.clock = lambda: T0 + 460
    fresh = {r["gate"]: r for r in ctl.tick().reasons[1:]}
    assert fresh["survival_ece"]["outcome"] == "pass" and fresh["survival_ece"]["samples"] >= 10
    assert fresh["prom_misses"]["note"] == "no data"  # no --prometheus configured


def test_a_failing_actuator_does_not_stop_the_controller(store):
    calls = []

    def broken(payload):
        calls.append(payload.revision)
        raise RuntimeError("fleet unreachable")

    ctl = controller(store, actuators=[broken, lambda payload: calls.append(("ok", payload.phase))])
    decision = ctl.act("abort", "ops")
    # Pushed at start (the policy in force, revision 1), then after the abort.
    assert decision.phase_to == "fallback" and calls == [1, ("ok", "baseline"), 2, ("ok", "fallback")]
    assert ledger.load_state(store, POLICY).phase == "fallback"


def test_a_restarted_controller_serves_the_decision_persisted_before_it_stopped_at_once(tmp_path):
    path = tmp_path / "restart.duckdb"
    with Store(path) as store:
        controller(store).act("abort", "ops")  # persisted; the process dies before the fleet heard of it
    pushed = []
    with Store(path) as store:
        controller(store, actuators=[pushed.append])
    assert [(p.phase, p.revision) for p in pushed] == [("fallback", 2)]  # not one interval later


def test_a_push_that_began_before_an_abort_never_lands_after_the_aborts_own(store):
    import threading

    slow_started, release, landed = threading.Event(), threading.Event(), []

    def fleet(payload):
        if payload.phase == "shadow" and not slow_started.is_set():  # the promote's push, held in flight
            slow_started.set()
            release.wait(10)
        landed.append(payload.phase)

    ctl = controller(store, actuators=[fleet])
    promoting = threading.Thread(target=ctl.act, args=("promote", "ops"))
    promoting.start()
    assert slow_started.wait(10)
    aborting = threading.Thread(target=ctl.act, args=("abort", "ops"))
    aborting.start()
    aborting.join(0.3)
    release.set()
    promoting.join(10)
    aborting.join(10)
    assert landed[-1] == "fallback" and ctl.state.phase == "fallback"


@pytest.mark.parametrize("action", ["resume", "jump"])
def test_operator_actions_that_do_not_apply_leave_no_decision(store, action):
    ctl = controller(store)
    with pytest.raises(ValueError):
        ctl.act(action, "ops")
    assert [d.action for d in ledger.decisions(store)] == ["start"]


def test_a_fleet_split_by_server_compares_its_groups_and_a_slower_treatment_group_rolls_back(store):
    urls = ["http://a:1", "http://b:2", "http://c:3"]  # compact: a and b run the scheduler, c keeps observing
    policy = parse_rollout_policy(
        {
            "phases": ["baseline", "shadow", "compact"],
            "failure_limit": 0,
            "comparison": {"epoch_s": 2.0, "burn_in_s": 0.5},
            "gates": [{"metric": "p99_step_ratio", "threshold": 1.1, "direction": "at_most", "min_samples": 8}],
        }
    )
    ctl = controller(store, policy, groups=lambda payload: arms(urls, payload))
    ctl.act("promote", "ops")  # shadow: every server verifies in full, one arm only
    step, wires = 0, []
    for k in range(10):
        for replica, step_ms in (("a:1/dp0", 13.0), ("b:2/dp0", 13.0), ("c:3/dp0", 10.0)):
            wires.append(synthetic_steps(20, T0 + 1 + 2 * k, replica=replica, first_step=step, step_ms=step_ms))
            step += 100
    ingest_wire(store, pa.concat_tables(wires))
    ctl.clock = lambda: T0 + 22
    (shadow,) = ctl.tick().reasons[1:]
    assert shadow["dry_run"] and shadow["samples"] == 0  # no treatment group: nothing to compare, nothing held
    ctl.clock = lambda: T0 + 30
    ctl.act("promote", "ops")  # compact, entered at T0 + 30
    wires = []
    for k in range(10):
        for replica, step_ms in (("a:1/dp0", 13.0), ("b:2/dp0", 13.0), ("c:3/dp0", 10.0)):
            wires.append(synthetic_steps(20, T0 + 31 + 2 * k, replica=replica, first_step=step, step_ms=step_ms))
            step += 100
    ingest_wire(store, pa.concat_tables(wires))
    ctl.clock = lambda: T0 + 52
    decision = ctl.tick()
    (verdict,) = decision.reasons[1:]
    assert not verdict["dry_run"] and verdict["outcome"] == "fail" and verdict["samples"] == 10
    assert verdict["value"] == pytest.approx(1.3) and verdict["low"] == pytest.approx(1.3)
    assert decision.phase_to == "fallback"


def test_a_store_that_cannot_be_read_is_an_error_interval_not_a_crash(store, monkeypatch):
    from sparkgate.controller import supervisor

    ingest_synthetic(store, 20, T0 + 1, phase="shadow")
    ctl = controller(store, now=T0 + 30)
    ctl.act("promote", "ops")

    def unreadable(*args, **kwargs):
        raise duckdb.IOException("IO Error: could not read block 12")

    monkeypatch.setattr(supervisor, "evaluate", unreadable)
    decision = ctl.tick()
    assert decision.outcome == "error" and decision.reasons[1]["gate"] == "evaluation"
    assert "could not read block" in decision.reasons[1]["note"] and ctl.state.errors == 1


ECE_GATE = {"metric": "survival_ece", "threshold": 0.9, "direction": "at_most", "min_samples": 100}


def _tick_in_shadow(store, gates, now, **policy) -> tuple[Controller, object]:
    ctl = controller(store, parse_rollout_policy({"stale_after_s": 120, **policy, "gates": gates}), now=T0)
    ctl.act("promote", "ops")  # shadow, entered at T0
    ctl.clock = lambda: now
    return ctl, ctl.tick()


def test_a_dry_run_gate_never_moves_the_window_the_deciding_gates_are_judged_on(tmp_path):
    """A dry-run gate needing more labels than the lookback holds made every gate's window reach back."""
    dry = {"metric": "survival_ece_upper", "threshold": 0.9, "direction": "at_most", "min_samples": 10**6,
           "dry_run": True}  # fmt: skip
    judged = []
    for name, gates in (("alone", [ECE_GATE]), ("beside", [ECE_GATE, dry])):
        with Store(tmp_path / f"{name}.duckdb") as store:
            ingest_synthetic(store, 20, T0 + 1, phase="shadow")
            ingest_synthetic(store, 5, T0 + 840, first_step=100, phase="shadow")
            _, decision = _tick_in_shadow(store, gates, T0 + 900)
            judged.append(next(r for r in decision.reasons[1:] if r["gate"] == "survival_ece"))
    assert judged[0] == judged[1] and judged[0]["samples"] < 20 * 32  # the lookback's labels alone


def test_a_store_that_cannot_be_read_while_widening_the_window_is_an_error_interval(store, monkeypatch):
    """Widening reads the labels per depth before the evaluation: a failure there escaped the tick, so
    nothing was recorded, error_limit never counted, and the stage stayed frozen."""
    ingest_synthetic(store, 20, T0 + 1, phase="shadow")
    real = Store.query

    def unreadable(self, sql, *args, **kwargs):
        if "label_group_sums" in sql or "label_fine_sums" in sql:
            raise duckdb.IOException("IO Error: could not read block 12")
        return real(self, sql, *args, **kwargs)

    monkeypatch.setattr(Store, "query", unreadable)
    ctl, decision = _tick_in_shadow(store, [{**ECE_GATE, "min_samples": 400}], T0 + 900, error_limit=0)
    assert decision.outcome == "error" and "could not read block" in decision.reasons[1]["note"]
    assert decision.action == "rollback" and ctl.state.phase == "fallback"


def test_an_unexpected_failure_of_the_evaluation_is_an_error_interval(store, monkeypatch):
    from sparkgate.controller import supervisor

    def broken(*args, **kwargs):
        raise KeyError("data")

    monkeypatch.setattr(supervisor, "evaluate", broken)
    ingest_synthetic(store, 20, T0 + 1, phase="shadow")
    ctl, decision = _tick_in_shadow(store, [ECE_GATE], T0 + 60)
    assert decision.outcome == "error" and decision.reasons[1]["note"] == "KeyError: 'data'"
    assert ctl.state.errors == 1


def test_a_failing_read_only_a_dry_run_gate_needs_is_that_gates_error_alone(store, monkeypatch):
    """One failed read made the whole interval an error, which a dry-run gate must never decide."""
    from sparkgate.controller import comparison

    def out_of_memory(*args, **kwargs):
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate")

    monkeypatch.setattr(comparison, "per_pair", out_of_memory)
    dry = {"metric": "tokens_per_s_ratio", "threshold": 0.97, "direction": "at_least", "min_samples": 10,
           "dry_run": True}  # fmt: skip
    ingest_synthetic(store, 20, T0 + 1, phase="shadow")
    ctl, decision = _tick_in_shadow(store, [{**ECE_GATE, "min_samples": 10}, dry], T0 + 60, error_limit=0)
    verdicts = {r["gate"]: r for r in decision.reasons[1:]}
    assert verdicts["survival_ece"]["outcome"] == "pass" and decision.outcome == "pass"
    assert verdicts["tokens_per_s_ratio"]["outcome"] == "error" and ctl.state.phase == "shadow"


@pytest.mark.parametrize("metric", ["survival_ece_drift", "windowed_ece_drift", "windowed_ece_drift_replica"])
def test_a_drift_gate_reads_the_shadow_reference_of_the_judged_contract(store, metric):
    policy = parse_rollout_policy(
        {"gates": [{"metric": metric, "threshold": 0.05, "direction": "at_most", "phases": ["canary"]}]}
    )
    ingest_synthetic(store, 200, T0 + 1, phase="shadow", batch=16)
    ctl = controller(store, policy, now=T0 + 40)
    ctl.act("promote", "ops")
    ctl.act("promote", "ops")  # canary, entered at T0 + 40
    ingest_synthetic(store, 200, T0 + 41, phase="canary", first_step=1000, batch=16)
    ctl.clock = lambda: T0 + 60
    (verdict,) = ctl.tick().reasons[1:]
    assert verdict["gate"] == metric and verdict["value"] is not None and verdict["samples"] > 0
    # The same calibrated drafter in both phases: no drift, never a failure (a pass of the windowed curves,
    # whose pass side keeps their noise, needs more labels than these few hundred rows per depth).
    assert verdict["value"] < 0.05 and verdict["outcome"] != "fail"
    assert metric != "survival_ece_drift" or verdict["outcome"] == "pass"


def test_a_stages_calibration_bounds_spend_the_share_of_its_evaluation_not_of_its_age(store):
    policy = parse_rollout_policy(
        {"gates": [{"metric": "survival_ece_debiased", "threshold": 0.05, "direction": "at_most"}]}
    )
    ctl = controller(store, policy, now=T0)
    ctl.act("promote", "ops")  # shadow, entered at T0
    ingest_synthetic(store, 200, T0 + 1, phase="shadow", batch=16)
    looks = []
    for late in (1.5, 2.5):  # each tick later than one interval after the last
        ctl.clock = lambda late=late: T0 + late * policy.evaluation_interval_s
        (verdict,) = ctl.tick().reasons[1:]
        looks.append(verdict["method"].split("(look ")[1].split(")")[0])
    assert looks == ["1", "2"]


def test_a_collector_that_cannot_read_its_source_is_an_error_with_its_own_limit(store):
    from sparkgate.controller.collector_health import CollectorHealth
    from sparkgate.controller.commands import poll_forever

    class Down:
        url = "http://sglang-0:30000"

        def __init__(self):
            self.calls = 0

        def poll_once(self):
            self.calls += 1
            if self.calls < 3:
                raise ConnectionError("connection refused")

    health, poller = CollectorHealth(), Down()

    class TwoPolls:  # ``poll_forever``'s stop event: two rounds, then stop
        rounds = 0

        def wait(self, _):
            self.rounds += 1
            return self.rounds > 2

    poll_forever([poller], TwoPolls(), 0.0, health)
    assert health.errors() == ["collector http://sglang-0:30000: connection refused"]
    ingest_synthetic(store, 20, T0 + 1, phase="shadow")
    ctl = controller(store, POLICY.replace(error_limit=1), now=T0 + 60, collector_errors=health.errors)
    ctl.act("promote", "ops")
    first = ctl.tick()
    collector = next(r for r in first.reasons if r.get("gate") == "collector")
    assert (first.action, first.outcome) == ("hold", "error") and "connection refused" in collector["note"]
    assert ctl.tick().reasons[0] == {"rule": "error limit", "errors": 2, "limit": 1}
    poll_forever([poller], TwoPolls(), 0.0, health)  # the server answers again
    assert health.errors() == []


def test_comparisons_read_the_newest_whole_pairs_of_a_long_stage_and_every_pair_of_a_short_one(store):
    policy = POLICY.replace(comparison={"epoch_s": 2.0, "burn_in_s": 0.5, "window_s": 20.0})
    ctl = controller(store, policy)
    state = ctl.state  # baseline, entered at T0
    assert ctl._design(state, T0 + 15).since == T0  # younger than the window: the whole stage
    assert ctl._design(state, T0 + 100).since == T0 + 80  # pairs of 4 s: the oldest whole one in the last 20 s
    groups = controller(store, policy, groups=lambda payload: (("a", "treatment"), ("b", "control")))
    # Slices of 2 s from the burn-in's end: the oldest whole one in the last 20 s.
    assert groups._design(state, T0 + 100).since == T0 + 80.5
    assert controller(store, POLICY.replace(comparison={"window_s": None}))._design(state, T0 + 1e6).since == T0


def test_a_treatment_group_that_slows_late_fails_its_drift_gate_while_its_ratio_still_passes(store):
    urls = ["http://a:1", "http://b:2", "http://c:3"]
    policy = parse_rollout_policy(
        {
            "phases": ["baseline", "shadow", "compact"],
            "failure_limit": 0,
            "comparison": {"epoch_s": 2.0, "burn_in_s": 0.5, "window_s": 10.0, "level": 0.95},
            "gates": [
                {"metric": "p99_step_ratio", "threshold": 3.0, "direction": "at_most", "min_samples": 4},
                {"metric": "p99_step_ratio_drift", "threshold": 1.1, "direction": "at_most", "min_samples": 4},
            ],
        }
    )
    ctl = controller(store, policy, groups=lambda payload: arms(urls, payload))
    ctl.act("promote", "ops")
    ctl.clock = lambda: T0 + 30
    ctl.act("promote", "ops")  # compact, entered at T0 + 30: slices of 2 s from T0 + 30.5
    step, wires = 0, []
    for k in range(20):  # the treatment servers (a, b) at 1.3x the control (c), 2.6x from T0 + 63 on
        slow = 2.0 if k >= 16 else 1.0
        for replica, step_ms in (("a:1/dp0", 13.0 * slow), ("b:2/dp0", 13.0 * slow), ("c:3/dp0", 10.0)):
            wires.append(synthetic_steps(20, T0 + 31 + 2 * k, replica=replica, first_step=step, step_ms=step_ms))
            step += 100
    ingest_wire(store, pa.concat_tables(wires))  # one batch: a transaction per run is most of the test's time
    ctl.clock = lambda: T0 + 72
    decision = ctl.tick()
    verdicts = {v["gate"]: v for v in decision.reasons[1:]}
    ratio = verdicts["p99_step_ratio"]  # the newest 10 s: 2.6x, under its 3x threshold
    assert ratio["value"] == pytest.approx(2.6) and ratio["outcome"] != "fail"
    moved = verdicts["p99_step_ratio_drift"]  # 4 slow slices against the 5 before them
    assert moved["outcome"] == "fail" and moved["value"] == pytest.approx(2.0) and moved["samples"] == 4
    assert decision.phase_to == "fallback"


@given(now=st.floats(1e9, 2e9), lookback=st.floats(1.0, 3600.0))
def test_a_window_starts_on_the_sums_grid_at_most_one_bucket_before_its_lookback(now, lookback):
    start = lookback_start(now, lookback)
    assert now - lookback - SUM_BUCKET_S < start <= now - lookback + 1e-6  # up to the division's rounding
    assert start / SUM_BUCKET_S == math.floor(start / SUM_BUCKET_S)
