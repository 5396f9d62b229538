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
    assert rows[-1].samples_differ["tier_miss_rate"] == [200, 300]
    assert summary(rows)["samples_differ"] == 1
