"""Adaptive end to end over a real DuckDB file and the real HTTP service: a stale static table is refitted
and published, served by version, listed by the command; a fitted table that predicts badly is reverted,
as a decision, and a restarted controller resumes the revert."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors import cost_tables
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.store import Store
from sparkgate.controller import backtest, cost_report, ledger
from sparkgate.controller.service import create_app
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.cost_model import parse_cost_table
from sparkgate.policies.rollout import load_rollout_policy, parse_rollout_policy
from sparkgate.policies.vocabulary import Action
from tests.conftest import T0, Clock
from tests.controller.timed_steps import STATIC, ingest_timed, scaled

POLICY = parse_rollout_policy(
    {
        "phases": ["baseline", "compact", "adaptive"],
        "failure_limit": 0,
        "evaluation_interval_s": 10.0,
        "adaptive": {"min_interval_s": 0.0, "min_steps": 100, "step_time": "cpu"},
        "gates": [
            {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most", "min_samples": 10},
            {
                "metric": "cost_prediction_error",
                "threshold": 0.25,
                "direction": "at_most",
                "min_samples": 50,
                "guard": True,
                "phases": ["adaptive"],
            },
        ],
    }
)


@pytest.fixture
def fleet(tmp_path):
    clock = Clock(T0)
    with Store(tmp_path / "adaptive.duckdb") as store:
        controller = Controller(store, POLICY, clock=clock, resamples=10)
        with serve_in_thread(create_app(controller, Ingestor(store))) as url, httpx.Client(base_url=url) as http:
            yield controller, http, clock


def register(http, table=STATIC, replica="r0"):
    return http.post("/v1/cost-tables", json={"replica_id": replica, "table": table.to_json_dict()})


def test_registration_is_checked_idempotent_and_refuses_a_second_body(fleet):
    _, http, _ = fleet
    assert register(http).json() == {"version": "static-a", "replica_group": "static-a", "stored": True}
    assert register(http).json()["stored"] is False
    conflict = register(http, scaled(STATIC, 2.0))
    assert conflict.status_code == 409 and "another table" in conflict.json()["detail"]
    bad = http.post("/v1/cost-tables", json={"replica_id": "r0", "table": {**STATIC.to_json_dict(), "m_probes": [8]}})
    assert bad.status_code == 422 and bad.json()["detail"] == "theta_seconds: has 3 values but m_probes has 1"
    assert http.get("/v1/cost-tables/nope").status_code == 404
    assert [e["version"] for e in http.get("/v1/cost-tables").json()] == ["static-a"]


def test_a_stale_table_is_refitted_served_and_reverted_when_it_predicts_badly(fleet, tmp_path):
    controller, http, clock = fleet
    register(http)
    for _ in range(2):
        controller.act("promote", "ops")
    assert controller.state.phase == "adaptive" and controller.policy_payload().cost_tables == {}
    ingest_timed(controller.store, STATIC, scaled(STATIC, 1.6), T0 + 1)
    ingest_timed(controller.store, STATIC, scaled(STATIC, 1.6), T0 + 6, first_step=1000, seed=1)
    clock.now = T0 + 10
    controller.tick()
    published = ledger.decisions(controller.store)[-1]
    assert published.action == Action.PUBLISH_TABLE and published.revision == controller.state.revision == 3
    rule = published.reasons[0]
    assert rule["version"] == "static-a+a1" and rule["error_current"] > 0.3 > rule["error_candidate"]
    payload = http.get("/v1/policy").json()
    assert payload["cost_tables"] == {"static-a": "static-a+a1"} and payload["revision"] == 3
    fitted = parse_cost_table(http.get("/v1/cost-tables/static-a+a1").json())
    assert fitted.meta.version == "static-a+a1" and fitted.meta.hardware == STATIC.meta.hardware

    # The report scores each table at the rows its steps ran: the fitted one's error is a fraction of the static's.
    report = cost_report.report(controller.store, T0, T0 + 10, 10.0, "cpu")
    (row,) = report["intervals"]
    assert row["tables"] == ["static-a"] and row["prediction_error"] == pytest.approx(0.6 / 1.6, abs=0.05)
    # The floor refits each interval's predecessor: the second 5-s interval is predicted from the first.
    two = cost_report.report(controller.store, T0, T0 + 10, 5.0, "cpu", floor=True)["intervals"]
    assert two[0]["floor_error"] is None and two[1]["floor_error"] < 0.1 < two[1]["prediction_error"]

    listed = CliRunner().invoke(main, ["cost-table", "list", "--controller", str(http.base_url), "--json"])
    assert listed.exit_code == 0, listed.output
    served = {e["version"]: e["served"] for e in json.loads(listed.output)}
    assert served == {"static-a": False, "static-a+a1": True}
    shown = CliRunner().invoke(main, ["cost-table", "show", "--controller", str(http.base_url), "static-a+a1"])
    assert json.loads(shown.output) == fitted.to_json_dict()

    # Steps served on the fitted table now cost three times what it predicts: its guard fails, and the
    # fleet goes back to the static table at a new revision of the same stage.
    ingest_timed(controller.store, fitted, scaled(STATIC, 3.0), T0 + 11, first_step=10_000)
    clock.now = T0 + 20
    revert = controller.tick()
    assert revert.action == Action.REVERT_TABLE and revert.revision == 4 and revert.phase_to == "adaptive"
    gate = next(v for v in revert.reasons[1:] if v["gate"] == "cost_prediction_error")
    assert gate["outcome"] == "fail" and gate["low"] > 0.25 and gate["samples"] == 200
    assert http.get("/v1/policy").json()["cost_tables"] == {}
    resumed = Controller(controller.store, POLICY, clock=clock, resamples=10)
    assert resumed.state.static_only and resumed.state.revision == 4

    # A backtest with the same policy reproduces every decision, the publication and the revert included,
    # and writes nothing (no table of its own).
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(POLICY.to_dict()))
    rows = backtest.replay(controller.store, load_rollout_policy(policy_file), resamples=10)
    assert [r.stored.action for r in rows][-3:] == ["hold", "publish_table", "revert_table"]
    assert all(r.agrees for r in rows) and len(cost_tables.entries(controller.store)) == 2
    again = CliRunner().invoke(main, ["cost-table", "revert", "--controller", str(http.base_url), "--operator", "ops"])
    assert again.exit_code == 1 and "already reverted in this stage" in again.output
