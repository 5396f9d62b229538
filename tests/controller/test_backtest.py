"""``sparkgate backtest`` over a store a real controller wrote (tests/dashboards/known_store.py): the same
policy reproduces every stored decision; another policy shows where it would have decided otherwise."""

from __future__ import annotations

import json
import shutil

import yaml
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.controller.backtest import replay, summary
from sparkgate.policies.rollout import load_rollout_policy
from tests.conftest import T0
from tests.dashboards.known_store import POLICY, ingest, steps


def copied(fixture_store, tmp_path):
    db = tmp_path / "events.duckdb"
    shutil.copy(fixture_store.db, db)
    return db


def test_the_same_policy_reproduces_every_stored_decision(fixture_store, tmp_path):
    db = copied(fixture_store, tmp_path)
    with Store(db) as store:
        rows = replay(store, load_rollout_policy(fixture_store.policy_path))
        stored = ledger.decisions(store)
    assert [r.stored for r in rows] == stored and all(r.agrees for r in rows)
    assert not any(r.samples_differ for r in rows)  # the replay read what the controller read
    assert [r.replayed.action for r in rows] == ["start", "advance", "rollback"]
    # The replayed rollback judged what the stored one did, verdict by verdict.
    assert rows[-1].replayed.reasons == rows[-1].stored.reasons
    with Store(db) as store:
        assert ledger.decisions(store) == stored  # nothing was written


def test_a_looser_tier_gate_would_have_advanced_where_the_stored_one_rolled_back(fixture_store, tmp_path):
    looser = {**POLICY, "gates": [dict(g, threshold=0.1) if g["metric"] == "tier_miss_rate" else g
                                  for g in POLICY["gates"]]}  # fmt: skip
    policy = tmp_path / "looser.yaml"
    policy.write_text(yaml.safe_dump(looser))
    result = CliRunner().invoke(main, ["backtest", "--db", str(copied(fixture_store, tmp_path)), "--policy",
                                       str(policy), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    last = body["rows"][-1]
    assert last["stored"]["action"] == "rollback" and last["stored"]["failing"] == ["tier_miss_rate"]
    assert (last["replayed"]["action"], last["replayed"]["phase"]) == ("advance", "canary") and not last["agrees"]
    assert body["summary"]["agree"] == 2 and body["summary"]["first_difference_at_s"] == last["at_s"]
    assert body["summary"]["stored_phases"] == ["baseline", "shadow", "fallback"]


def test_a_store_without_decisions_is_a_clear_error(tmp_path):
    with Store(tmp_path / "empty.duckdb"):
        pass
    result = CliRunner().invoke(main, ["backtest", "--db", str(tmp_path / "empty.duckdb"), "--policy",
                                       "policies/default_rollout.yaml"])  # fmt: skip
    assert result.exit_code != 0 and "no decisions to replay" in result.output
    assert summary([]) == {"decisions": 0, "agree": 0, "first_difference_at_s": None, "samples_differ": 0,
                           "stored_phases": [], "replayed_phases": []}  # fmt: skip


def test_a_bad_policy_is_named_before_the_store_is_opened(tmp_path):
    with Store(tmp_path / "empty.duckdb"):
        pass  # no decisions: the policy used to be read only when there were some
    before = (tmp_path / "empty.duckdb").read_bytes()
    policy = tmp_path / "bad.yaml"
    policy.write_text("gates: 5\n")
    result = CliRunner().invoke(main, ["backtest", "--db", str(tmp_path / "empty.duckdb"), "--policy", str(policy)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"Invalid value for '--policy': {policy}: gates: expected a list, got 5" in result.output
    assert (tmp_path / "empty.duckdb").read_bytes() == before


def test_since_on_a_stage_the_policy_lacks_is_a_clear_error(fixture_store, tmp_path):
    db = copied(fixture_store, tmp_path)
    with Store(db) as store:
        last = replay(store, load_rollout_policy(fixture_store.policy_path))[-1].at
    shorter = {**POLICY, "phases": ["baseline", "canary", "compact", "adaptive"]}  # no shadow
    policy = tmp_path / "shorter.yaml"
    policy.write_text(yaml.safe_dump(shorter))
    result = CliRunner().invoke(main, ["backtest", "--db", str(db), "--policy", str(policy), "--since", repr(last)])
    assert result.exit_code == 1 and "on a stage this policy lacks" in result.output


def test_since_takes_the_times_report_takes(fixture_store, tmp_path):
    import datetime as dt

    db = copied(fixture_store, tmp_path)
    with Store(db) as store:
        second = replay(store, load_rollout_policy(fixture_store.policy_path))[1].at
    iso = dt.datetime.fromtimestamp(second, dt.UTC).isoformat()
    argv = ["backtest", "--db", str(db), "--policy", str(fixture_store.policy_path), "--json", "--since"]
    for since in (iso, repr(second)):
        result = CliRunner().invoke(main, [*argv, since])
        assert result.exit_code == 0, result.output
        body = json.loads(result.output)
        assert [r["stored"]["action"] for r in body["rows"]] == ["advance", "rollback"]
        # The replay starts where the stored rollout stood then (baseline, one pass in), not from a new start.
        assert [r["replayed"]["action"] for r in body["rows"]] == ["advance", "rollback"]
        assert body["summary"]["agree"] == 2
    bad = CliRunner().invoke(main, [*argv, "nan"])
    assert bad.exit_code == 2 and "Invalid value for '--since': 'nan': expected unix seconds" in bad.output


def test_records_that_arrived_after_a_decision_are_named_where_the_replay_read_them(fixture_store, tmp_path):
    # Reads are bounded by record time: a replica's late posts (its spool after an outage) with earlier
    # times are read by the replay, though the stored controller never saw them.
    db = copied(fixture_store, tmp_path)
    with Store(db) as store:
        ingest(store, steps(100, "r2", 0, T0 + 5, "shadow", "code"))
        rows = replay(store, load_rollout_policy(fixture_store.policy_path))
    assert all(r.agrees for r in rows) and [bool(r.samples_differ) for r in rows] == [False, False, True]
    assert rows[-1].samples_differ["tier_miss_rate"] == [100, 150]  # the treatment epochs' steps
    assert summary(rows)["samples_differ"] == 1


def _agreement(rows) -> list[tuple[str, str, bool]]:
    return [(r.stored.action, str(r.stored.outcome), r.agrees) for r in rows]


def test_the_stored_collector_errors_are_replayed_at_their_times(store):
    """The store holds no record of a poller's outage: replayed without it, an error-limit rollback read as
    an advance."""
    from sparkgate.controller.supervisor import Controller
    from sparkgate.policies.rollout import parse_rollout_policy
    from tests.conftest import ingest_synthetic

    policy = parse_rollout_policy({"stale_after_s": 120, "error_limit": 1, "gates": [
        {"metric": "survival_ece", "threshold": 0.9, "direction": "at_most", "min_samples": 10}]})  # fmt: skip
    now, down = [T0], [False]
    ctl = Controller(store, policy, clock=lambda: now[0], resamples=10,
                     collector_errors=lambda: ["sglang http://a: connection refused"] if down[0] else [])  # fmt: skip
    ctl.act("promote", "ops")
    for i in range(3):
        ingest_synthetic(store, 20, now[0] + 1, first_step=100 * i, phase="shadow")
        now[0] += 60
        down[0] = i >= 1
        ctl.tick()
    rows = replay(store, policy, resamples=10)
    assert _agreement(rows)[-3:] == [("hold", "pass", True), ("hold", "error", True), ("rollback", "error", True)]


def test_a_fleet_split_by_server_is_replayed_by_its_groups(store):
    """Without the servers, the replay compared switchback epochs, which SGLang records never carry."""
    import pyarrow as pa

    from sparkgate.controller.actuators import arms
    from sparkgate.controller.supervisor import Controller
    from sparkgate.policies.rollout import parse_rollout_policy
    from tests.conftest import ingest_wire, synthetic_steps

    urls = ["http://a:1", "http://b:2", "http://c:3"]
    gate = {"metric": "p99_step_ratio", "threshold": 1.1, "direction": "at_most", "min_samples": 8}
    policy = parse_rollout_policy({"phases": ["baseline", "shadow", "compact"], "failure_limit": 0,
                                   "comparison": {"epoch_s": 2.0, "burn_in_s": 0.5}, "gates": [gate]})  # fmt: skip
    now = [T0]
    ctl = Controller(store, policy, clock=lambda: now[0], resamples=10, groups=lambda p: arms(urls, p))
    ctl.act("promote", "ops")
    now[0] = T0 + 30
    ctl.act("promote", "ops")  # compact: two treatment servers, one control
    wires, step = [], 0
    for k in range(10):
        for replica, ms in (("a:1/dp0", 13.0), ("b:2/dp0", 13.0), ("c:3/dp0", 10.0)):
            wires.append(synthetic_steps(20, T0 + 31 + 2 * k, replica=replica, first_step=step, step_ms=ms))
            step += 100
    ingest_wire(store, pa.concat_tables(wires))
    now[0] = T0 + 52
    assert ctl.tick().action == "rollback"
    rows = replay(store, policy, resamples=10, sglang_urls=urls)
    assert rows[-1].replayed.reasons == rows[-1].stored.reasons and all(r.agrees for r in rows)
    assert not replay(store, policy, resamples=10)[-1].agrees  # the epochs' design reads no pairs here


def test_a_promql_gate_is_asked_for_the_replayed_time_and_backtest_needs_its_url(fixture_store, tmp_path):
    from sparkgate.controller import promql

    asked = []
    real = promql.query

    def recorded(url, query, direction="at_most", timeout_s=5.0, at=None):
        asked.append(at)
        return promql.Measurement(0.0, 1)

    promql.query = recorded
    prom = {"metric": "p99", "threshold": 1.0, "direction": "at_most", "promql": "max(up)", "name": "prom",
            "dry_run": True}  # fmt: skip
    gated = {**POLICY, "gates": [*POLICY["gates"], prom]}
    try:
        with Store(copied(fixture_store, tmp_path)) as store:
            from sparkgate.policies.rollout import parse_rollout_policy

            rows = replay(store, parse_rollout_policy(gated), prometheus_url="http://prometheus:9090")
    finally:
        promql.query = real
    ticks = [r.stored.decided_at for r in rows if r.stored.operator is None and r.stored.action != "start"]
    assert asked and set(asked) <= set(ticks)  # never "now": the decision's own time
    policy = tmp_path / "gated.yaml"
    policy.write_text(yaml.safe_dump(gated))
    result = CliRunner().invoke(main, ["backtest", "--db", str(copied(fixture_store, tmp_path)), "--policy",
                                       str(policy)])  # fmt: skip
    assert result.exit_code == 2 and "read Prometheus: give its URL" in result.output


def test_the_fleets_urls_are_checked_before_the_store_is_opened(fixture_store, tmp_path):
    db = copied(fixture_store, tmp_path)
    for option in ("--sglang", "--prometheus"):
        result = CliRunner().invoke(main, ["backtest", "--db", str(db), "--policy", str(fixture_store.policy_path),
                                           option, "not a url"])  # fmt: skip
        assert result.exit_code == 2 and option in result.output
