"""The read-only sources: a private copy of the writer's DuckDB file, and the controller's API."""

from __future__ import annotations

import shutil

import pytest

from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.controller.evaluate import evaluate
from tests.dashboards.known_store import MISSES, SHADOW_STEPS, metrics, run_app


def test_db_copy_reads_while_the_writer_holds_the_file(monkeypatch, fixture_store, tmp_path):
    db = tmp_path / "events.duckdb"
    shutil.copy(fixture_store.db, db)  # the writer below commits: keep the shared fixture as it is
    with Store(db) as writer:
        app = run_app(monkeypatch, "--db", str(db), "--policy", str(fixture_store.policy_path))
        assert metrics(app)["Phase"] == "fallback"
        # The writer kept its lock and can still commit.
        writer.record_decision(4, "fallback", "shadow", "resume", [{"rule": "operator resume"}], operator="test")
        assert ledger.decisions(writer)[-1].action == "resume"


def test_controller_api_source(monkeypatch, fixture_store, tmp_path):
    from sparkgate.collectors.ingest import Ingestor
    from sparkgate.collectors.ingest_api import serve_in_thread
    from sparkgate.controller.service import create_app
    from sparkgate.controller.supervisor import Controller
    from sparkgate.policies.rollout import load_rollout_policy

    shutil.copy(fixture_store.db, tmp_path / "events.duckdb")
    with Store(tmp_path / "events.duckdb") as store:
        controller = Controller(store, load_rollout_policy(fixture_store.policy_path), resamples=50)
        with serve_in_thread(create_app(controller, Ingestor(store))) as url:
            args = ("--controller", url, "--policy", str(fixture_store.policy_path))
            app = run_app(monkeypatch, *args)
            assert metrics(app)["Phase"] == "fallback" and metrics(app)["Revision"] == "3"
            gates = app.dataframe[0].value.set_index("gate")
            assert gates.loc["tier_miss_rate", "value"] == pytest.approx(MISSES / SHADOW_STEPS)
            assert f"--controller {url}" in app.code[0].value
            app = run_app(monkeypatch, *args, page="calibration", window="All data")
            reference = evaluate(store).report()["calibration"]["survival"]
            table = app.dataframe[0].value.set_index("depth")
            assert table.loc[1, "ece"] == pytest.approx(reference["1"]["ece"], abs=1e-12)
            assert any("needs the stored rows" in i.value for i in app.info)
