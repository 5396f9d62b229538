"""The controller service over real HTTP on 127.0.0.1 with a real DuckDB file."""

from __future__ import annotations

import json

import httpx
import pytest

import sparkgate.controller.service as service_module
from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.labels import explode
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten
from sparkgate.collectors.writers import Writer, Writers
from sparkgate.controller.service import check_bind, create_app
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import parse_rollout_policy
from tests.conftest import T0, Clock, with_columns

TOKEN = "s3cret-token"
POLICY = parse_rollout_policy(
    {
        "gates": [
            {"metric": "survival_ece", "threshold": 0.5, "direction": "at_most"},
            {"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True},
        ]
    }
)


@pytest.fixture
def service(store):
    clock = Clock(T0 + 30)
    pushed = []
    controller = Controller(store, POLICY, metrics=Metrics(), actuators=[pushed.append], clock=clock, resamples=20)
    app = create_app(controller, Ingestor(store, controller.exporter.metrics), token=TOKEN)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        yield http, controller, clock, pushed


def ndjson(steps: int, first_step: int = 0, ts: float = T0 + 31, phase: str = "baseline") -> bytes:
    wire = with_columns(synthetic_wire(steps, 8, 7, "r0", first_step=first_step, seed=first_step, ts=ts), phase=phase)
    return b"".join(json.dumps(r).encode() + b"\n" for r in wire.to_pylist())


def operator(action: str, token: str | None = TOKEN, who: str = "alice") -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return {"url": f"/v1/rollout/{action}", "headers": headers, "json": {"operator": who, "note": "test"}}


def test_policy_records_status_and_decisions(service):
    http, controller, _, _ = service
    assert http.get("/healthz").json() == {"ok": True, "revision": 1}
    policy = http.get("/v1/policy").json()
    assert policy == {
        "revision": 1,
        "phase": "baseline",
        "compact_fraction": 0.0,
        "observe_fraction": 0.05,
        "fallback_window": 7,
        "gamma": 7,
        "cost_table_version": None,
        "cost_tables": {},
        "sts_version": None,
        "switchback": None,
    }
    response = http.post("/v1/records", content=ndjson(5), headers={"content-type": "application/x-ndjson"})
    assert response.status_code == 200 and response.json()["steps"] == 5
    bad = http.post("/v1/records", content=b'{"replica_id": 3}\n', headers={"content-type": "application/x-ndjson"})
    assert bad.status_code == 422 and bad.json()["quarantined"] == 1
    controller.tick()
    status = http.get("/v1/status").json()
    assert status["gates"][0]["gate"] == "baseline_reference" and status["passes"] == 1
    decisions = http.get("/v1/decisions", params={"limit": 10}).json()
    assert [d["action"] for d in decisions] == ["start", "hold"]
    report = http.get("/v1/report").json()
    assert report["tiers"]["steps"] == 5 and "survival" in report["calibration"]
    assert http.get("/v1/report", params={"since": T0 + 1, "until": T0}).status_code == 422


def test_operator_routes_need_the_bearer_token(service):
    http, controller, _, pushed = service
    assert http.post(**operator("promote", token=None)).status_code == 401
    assert http.post(**operator("promote", token="wrong")).status_code == 403
    assert controller.state.revision == 1
    promoted = http.post(**operator("promote"))
    assert promoted.status_code == 200 and promoted.json()["phase_to"] == "shadow"
    assert promoted.json()["operator"] == "alice"
    assert pushed[-1].phase == "shadow" and pushed[-1].revision == 2
    conflict = http.post(**operator("resume"))
    assert conflict.status_code == 409 and "only from fallback or paused" in conflict.json()["detail"]
    assert http.post(**operator("jump")).status_code == 422
    nobody = http.post("/v1/rollout/abort", headers=operator("abort")["headers"], json={"operator": ""})
    assert nobody.status_code == 422


def test_a_consistency_mismatch_rolls_back_at_the_next_evaluation(service):
    http, controller, clock, pushed = service
    for _ in range(3):
        http.post(**operator("promote"))
    assert controller.state.phase == "canary"
    # Steps from before the canary began: the window holds none, yet the critical failure stands.
    http.post("/v1/records", content=ndjson(50, ts=T0), headers={"content-type": "application/x-ndjson"})
    tokens = http.get("/v1/requests/req-3/committed").json()
    assert tokens["modes"] and len(tokens["tokens"]) >= 1
    assert http.get("/v1/requests/nope/committed").status_code == 404
    report = {
        "replica_id": "r0",
        "checks": [{"request_id": "req-3", "tokens": len(tokens["tokens"]), "mismatch_at": 2, "expected": 5, "got": 6}],
    }
    assert http.post("/v1/consistency", json=report).json() == {"recorded": 1, "stored": 1, "mismatches": 1}
    # A retry (the answer was lost) is not a second mismatch.
    assert http.post("/v1/consistency", json=report).json() == {"recorded": 1, "stored": 0, "mismatches": 1}
    assert controller.store.query("SELECT count(*) AS n FROM consistency_checks").column("n")[0].as_py() == 1
    clock.now += 60
    decision = controller.tick()
    assert (decision.action, decision.outcome, decision.phase_to) == ("rollback", "critical", "fallback")
    assert pushed[-1].phase == "fallback"
    metrics = http.get("/metrics").text
    assert 'sparkgate_rollout_phase{phase="fallback"} 1.0' in metrics
    assert 'sparkgate_gate_verdict{gate="consistency_mismatches"} 0.0' in metrics
    assert "sparkgate_ingested_steps_total 50.0" in metrics


def _aggregate(seed: int) -> Aggregate:
    flat = flatten(synthetic_wire(4, 8, 7, f"r{seed}", seed=seed))
    return Aggregate.from_tables(flat.requests, explode(flat), 7)


def test_replicas_report_aggregates_and_the_fleet_view_merges_them(service, store, tmp_path, monkeypatch):
    http, *_ = service
    parts = [_aggregate(seed) for seed in (1, 2)]
    for i, part in enumerate(parts):
        body = {"replica_id": f"r{i}", "interval_start": T0, "interval_end": T0 + 10, "aggregate": part.to_dict()}
        ok = http.post("/v1/aggregates", json=body)
        assert ok.status_code == 200 and ok.json() == {
            "recorded": 1,
            "duplicate": False,
            "labels": int(part.survival.count.sum()),
        }
    retry = http.post("/v1/aggregates", json=body)  # the last report again: counted once
    assert retry.status_code == 200 and retry.json()["duplicate"] is True
    fleet = http.get("/v1/fleet").json()
    merged = parts[0].merge(parts[1])
    assert fleet["reports"] == 2 and fleet["replicas"] == ["r0", "r1"]
    assert fleet["calibration"]["survival"]["3"]["ece"] == pytest.approx(merged.survival.ece()[3])
    assert fleet["utilization"]["upper_bound"] == pytest.approx(merged.upper_bound_utilization())
    assert http.get("/v1/fleet", params={"since": T0 + 5}).json() == {"reports": 0, "replicas": []}
    assert http.get("/v1/fleet", params={"since": T0 + 5, "until": T0}).status_code == 422
    with monkeypatch.context() as patch:  # a span too large to merge in one answer is refused, not slow
        patch.setattr(service_module, "MAX_FLEET_REPORTS", 1)
        too_many = http.get("/v1/fleet")
        assert too_many.status_code == 422 and "2 aggregate reports" in too_many.json()["detail"]
        assert http.get("/v1/fleet", params={"since": T0 + 10, "until": T0 + 10}).json()["reports"] == 0

    # Another interval of r1 sharing [T0+5, T0+10) would count those labels twice: refused, nothing written.
    overlap = http.post("/v1/aggregates", json={**body, "interval_start": T0 + 5, "interval_end": T0 + 20})
    assert overlap.status_code == 409 and overlap.json()["stored_interval"] == [T0, T0 + 10]
    assert "'r1'" in overlap.json()["detail"] and len(store.aggregates()) == 2
    # Intervals are half-open: the next one starts where the last ended.
    adjacent = http.post("/v1/aggregates", json={**body, "interval_start": T0 + 10, "interval_end": T0 + 20})
    assert adjacent.status_code == 200 and adjacent.json()["duplicate"] is False

    # Every problem is named and nothing is written.
    bad = parts[0].to_dict()
    bad["survival.count"] = [[[-1]]]
    del bad["full_hist"]
    refused = http.post(
        "/v1/aggregates", json={"replica_id": "r9", "interval_start": T0 + 5, "interval_end": T0, "aggregate": bad}
    )
    assert refused.status_code == 422
    fields = [p["field"] for p in refused.json()["problems"]]
    assert fields == ["interval_end", "full_hist"]
    worse = {**parts[0].to_dict(), "survival.sum_y": (parts[0].survival.count + 1).tolist()}
    assert (
        http.post(
            "/v1/aggregates", json={"replica_id": "r9", "interval_start": T0, "interval_end": T0, "aggregate": worse}
        ).json()["problems"][0]["field"]
        == "survival.sum_y"
    )
    # Counts that would wrap int64 (alone, or summed over a report) and huge or non-numeric JSON numbers.
    for field, value in [
        ("accept_hist", 1e19),
        ("survival.count", 4 * 10**18),
        ("full_hist", 10**400),
        ("suggest_hist", "3"),
        ("conditional.count", True),
    ]:
        odd = parts[0].to_dict()
        odd[field][0][1][0] = value
        refused = http.post(
            "/v1/aggregates", json={"replica_id": "r9", "interval_start": T0, "interval_end": T0, "aggregate": odd}
        )
        assert refused.status_code == 422 and refused.json()["problems"][0]["field"] == field, (field, refused.text)
    assert store.counts()["quarantine"] == 0 and len(store.aggregates()) == 3

    # Acknowledged reports are durable: a reopened store still holds them.
    path = store.path
    store.close()
    with Store(path) as again:
        assert [r for r, _ in again.aggregates()] == ["r0", "r1", "r1"]


def test_openapi_spec_is_published(service):
    http, *_ = service
    spec = http.get("/openapi.json").json()
    assert {
        "/v1/policy",
        "/v1/records",
        "/v1/status",
        "/v1/decisions",
        "/v1/consistency",
        "/metrics",
        "/healthz",
        "/v1/rollout/{action}",
        "/v1/aggregates",
        "/v1/fleet",
    } <= spec["paths"].keys()
    assert "application/x-ndjson" in spec["paths"]["/v1/records"]["post"]["requestBody"]["content"]


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost"])
def test_loopback_binds_need_no_token(host):
    check_bind(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.org"])
def test_non_loopback_binds_are_refused_without_an_operator_token_and_writer_credentials(host):
    with pytest.raises(ValueError, match="needs an operator token"):
        check_bind(host, None)
    with pytest.raises(ValueError, match="needs writer credentials"):
        check_bind(host, TOKEN)  # records and checks steer the gates as surely as operator actions do
    check_bind(host, TOKEN, Writers([Writer("fleet", "w-secret")]))


@pytest.mark.parametrize(
    "path, body, loc, echoed",
    [
        ("/v1/aggregates", '{"replica_id": "r", "interval_start": NaN, "interval_end": 1, "aggregate": {}}',
         ["body", "interval_start"], "nan"),
        ("/v1/aggregates", '{"replica_id": "r", "interval_start": 0, "interval_end": 1e400, "aggregate": {}}',
         ["body", "interval_end"], "inf"),
        ("/v1/consistency", '{"replica_id": "r", "checks": [{"request_id": "a", "tokens": NaN}]}',
         ["body", "checks", 0, "tokens"], "nan"),
    ],
)  # fmt: skip
def test_a_non_finite_number_gets_a_422_naming_it_and_the_connection_lives_on(service, path, body, loc, echoed):
    http, controller, _, _ = service
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == loc and error["input"] == echoed
    assert http.get("/healthz").status_code == 200  # the same keep-alive client still works
    assert controller.store.query("SELECT count(*) AS n FROM consistency_checks").column("n")[0].as_py() == 0


def test_every_route_of_the_controller_has_the_records_routes_body_limit(store):
    from sparkgate.collectors.ingest_api import DEFAULT_MAX_BODY, BodyLimit

    app = create_app(Controller(store, POLICY, resamples=20), Ingestor(store))
    limits = [m.kwargs["limit"] for m in app.user_middleware if m.cls is BodyLimit]
    assert limits == [DEFAULT_MAX_BODY]


def test_a_store_that_cannot_commit_is_a_503_to_retry_on_every_writer_route(service, store, monkeypatch):
    http, controller, _, _ = service
    import duckdb

    def failed(*args, **kwargs):
        raise duckdb.IOException("IO Error: No space left on device")

    monkeypatch.setattr(type(store), "record_consistency", failed)
    monkeypatch.setattr(type(store), "record_decision", failed)
    report = {"replica_id": "r0", "checks": [{"request_id": "q", "tokens": 3}]}
    for reply in (http.post("/v1/consistency", json=report), http.post(**operator("promote"))):
        assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
        assert "No space left on device" in reply.json()["detail"]
    assert controller.state.phase == "baseline"  # the promote that could not be recorded did not take effect


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/consistency", '{"replica_id": "r0", "checks": [], "checks": [{"request_id": "a", "tokens": 3}]}'),
        ("/v1/aggregates", '{"replica_id": "r0", "replica_id": "r1", "interval_start": 0, "interval_end": 1, '
                           '"aggregate": {}}'),
        ("/v1/cost-tables", '{"replica_id": "r0", "table": {"a": 1, "a": 2}}'),
    ],
)  # fmt: skip
def test_a_json_body_giving_a_key_twice_is_a_422_naming_it_and_nothing_is_stored(service, path, body):
    """FastAPI's decoder keeps the last: a report read as ``checks: []`` by its sender would store one check."""
    http, controller, _, _ = service
    response = http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["type"] == "json_invalid" and "appears more than once in one object" in error["ctx"]["error"]
    for table in ("consistency_checks", "aggregates", "cost_tables"):
        assert controller.store.query(f"SELECT count(*) AS n FROM {table}").column("n")[0].as_py() == 0
