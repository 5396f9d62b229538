"""Writer credentials: forged records, checks and aggregates are refused, a writer posts only for its
replicas, refusals are counted, and tokens come from the environment or a file."""

from __future__ import annotations

import json

import httpx
import pytest

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.writers import Writer, Writers, WritersError, load_writers
from sparkgate.controller.service import create_app
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.verify_runtime.controller_client import ControllerClient
from tests.conftest import T0, Clock, request_record, with_columns


def ndjson(steps: int, replica: str, first_step: int = 0) -> bytes:
    wire = with_columns(synthetic_wire(steps, 4, 7, replica, first_step=first_step, seed=first_step, ts=T0 + 31),
                        phase="baseline")  # fmt: skip
    return b"".join(json.dumps(r).encode() + b"\n" for r in wire.to_pylist())


POLICY = parse_rollout_policy(
    {"gates": [{"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True}]}
)
NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture
def guarded(store):
    metrics = Metrics()
    writers = Writers(
        [Writer("fleet-a", "token-a", ("replica-a*",)), Writer("collector", "token-c")],
        on_refusal=lambda w, why: metrics.writer_refusals.labels(w, why).inc(),
    )
    controller = Controller(store, POLICY, metrics=metrics, clock=Clock(T0 + 30), resamples=20)
    with serve_in_thread(create_app(controller, Ingestor(store, metrics), "operator", writers)) as url:
        yield url, controller, metrics


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_unsigned_and_forged_writes_are_refused_and_nothing_is_stored(guarded):
    url, controller, metrics = guarded
    check = {"replica_id": "replica-a1", "checks": [{"request_id": "r", "tokens": 3, "mismatch_at": 1}]}
    with httpx.Client(base_url=url) as http:
        assert http.post("/v1/records", content=ndjson(3, "replica-a1"), headers=NDJSON).status_code == 401
        wrong = {**NDJSON, **bearer("guess")}
        assert http.post("/v1/records", content=ndjson(3, "replica-a1"), headers=wrong).status_code == 403
        assert http.post("/v1/consistency", json=check).status_code == 401  # one forged mismatch would roll back
        assert http.post("/v1/consistency", json=check, headers=bearer("operator")).status_code == 403
        aggregate = {"replica_id": "replica-a1", "interval_start": 0, "interval_end": 1, "aggregate": {}}
        assert http.post("/v1/aggregates", json=aggregate).status_code == 401
    assert controller.store.counts() == {
        "steps": 0,
        "requests": 0,
        "depth_labels": 0,
        "request_records": 0,
        "quarantine": 0,
    }
    assert controller.tick().phase_to == "baseline"  # nothing forged reached the gates
    exposition = metrics.exposition().decode()
    assert 'sparkgate_writer_refusals_total{reason="unauthenticated",writer="unauthenticated"} 3.0' in exposition
    assert 'sparkgate_writer_refusals_total{reason="forbidden",writer="unauthenticated"} 2.0' in exposition


def test_a_writer_posts_only_for_the_replicas_it_is_bound_to(guarded):
    url, controller, metrics = guarded
    with httpx.Client(base_url=url, headers=bearer("token-a")) as http:
        assert http.post("/v1/records", content=ndjson(3, "replica-a1"), headers=NDJSON).status_code == 200
        other = http.post("/v1/records", content=ndjson(3, "replica-b1", first_step=10), headers=NDJSON)
        assert other.status_code == 403 and "may not post for replica 'replica-b1'" in other.json()["error"]
        check = {"replica_id": "replica-b1", "checks": [{"request_id": "r", "tokens": 3}]}
        assert http.post("/v1/consistency", json=check).status_code == 403
    with httpx.Client(base_url=url, headers=bearer("token-c")) as http:  # bound to every replica
        assert (
            http.post("/v1/records", content=ndjson(3, "replica-b1", first_step=10), headers=NDJSON).status_code == 200
        )
    assert controller.store.counts()["steps"] == 6
    assert 'writer_refusals_total{reason="forbidden",writer="fleet-a"} 2.0' in metrics.exposition().decode()


def test_a_writer_registers_only_the_cost_tables_it_is_bound_to(store):
    # A table's version names the replica group that serves it; unbound, one fleet's writer could register
    # another's static table first, and adaptive would fit that group from the forged table.
    from tests.controller.timed_steps import STATIC, scaled

    writers = Writers([Writer("fleet-a", "token-a", ("a-*",), ("group-a-*",)), Writer("fleet-b", "token-b", ("b-*",))])
    controller = Controller(store, POLICY, clock=Clock(T0 + 30), resamples=20)
    register = lambda replica, version: {"replica_id": replica, "table": scaled(STATIC, 1.0, version).to_json_dict()}
    with serve_in_thread(create_app(controller, Ingestor(store), "operator", writers)) as url:
        with httpx.Client(base_url=url, headers=bearer("token-a")) as http:
            squat = http.post("/v1/cost-tables", json=register("a-1", "group-b-static"))
            assert squat.status_code == 403
            assert "writer 'fleet-a' may not register cost table 'group-b-static'" in squat.json()["detail"]
            assert http.post("/v1/cost-tables", json=register("a-1", "group-a-static")).status_code == 200
        with httpx.Client(base_url=url, headers=bearer("token-b")) as http:  # bound to every table
            assert http.post("/v1/cost-tables", json=register("b-1", "group-b-static")).status_code == 200


def test_a_signed_record_that_names_no_replica_is_refused_by_name_and_its_body_siblings_stored(guarded):
    url, controller, _ = guarded
    lines = ndjson(2, "replica-a1").splitlines()
    missing = {k: v for k, v in json.loads(lines[1]).items() if k != "replica_id"}
    body = lines[0] + b"\n" + json.dumps(missing).encode() + b"\n"
    with httpx.Client(base_url=url, headers=bearer("token-a")) as http:
        reply = http.post("/v1/records", content=body, headers=NDJSON)
    # Not a 403 for replica None: the record is bad input, named as such, and the valid line is kept.
    assert reply.status_code == 422 and "replica_id" in json.dumps(reply.json()["problems"])
    assert controller.store.counts()["steps"] == 1


def test_a_replica_signs_with_the_writer_token_from_its_environment(guarded, monkeypatch):
    url, _, _ = guarded
    monkeypatch.setenv("SPARKGATE_WRITER_TOKEN", "token-a")
    client = ControllerClient(url)
    assert client.post_checks("replica-a7", [{"request_id": "r", "tokens": 4}])["stored"] == 1
    monkeypatch.delenv("SPARKGATE_WRITER_TOKEN")
    with pytest.raises(httpx.HTTPStatusError, match="401"):
        ControllerClient(url).post_checks("replica-a7", [{"request_id": "s", "tokens": 4}])


def test_writers_come_from_the_environment_or_a_file_never_the_file_itself(tmp_path):
    assert load_writers(None, {}) == []
    assert load_writers(None, {"SPARKGATE_WRITER_TOKEN": "t"}) == [Writer("default", "t")]
    secret = tmp_path / "collector-token"
    secret.write_text("from-a-file\n")
    spec = tmp_path / "writers.yaml"
    spec.write_text(
        "writers:\n"
        "  - {name: fleet-a, token_env: FLEET_A, replicas: ['replica-a-*'], cost_tables: ['fleet-a-*']}\n"
        f"  - {{name: collector, token_file: {secret}}}\n"
    )
    assert load_writers(spec, {"FLEET_A": "env-token"}) == [
        Writer("fleet-a", "env-token", ("replica-a-*",), ("fleet-a-*",)),
        Writer("collector", "from-a-file", ("*",), ("*",)),
    ]
    spec.write_text("writers:\n  - {name: a, token_env: FLEET_A, cost_tables: []}\n")
    with pytest.raises(WritersError, match=r"writers\[0\].cost_tables: expected a non-empty list of cost-table"):
        load_writers(spec, {"FLEET_A": "a"})
    with pytest.raises(WritersError, match=r"writers\[0\].token_env: environment variable FLEET_A is not set"):
        load_writers(spec, {})
    spec.write_text("writers:\n  - {name: a, token_env: FLEET_A, token_env: FLEET_B}\n")
    with pytest.raises(WritersError, match=r"writers\.yaml: line 2, column 35: key 'token_env' appears twice"):
        load_writers(spec, {"FLEET_A": "a", "FLEET_B": "b"})
    spec.write_bytes(b"writers: \xff\n")
    with pytest.raises(WritersError, match=r"writers\.yaml: not UTF-8 text"):
        load_writers(spec, {})
    spec.write_text("writers:\n  - {name: x, token: inline-secret}\n")
    with pytest.raises(WritersError, match=r"writers\[0\]: give exactly one of token_env and token_file"):
        load_writers(spec, {})
    # A misspelt binding used to leave the writer bound to every replica.
    spec.write_text("writers:\n  - {name: a, token_env: FLEET_A, replica: ['replica-a-*']}\n")
    with pytest.raises(WritersError, match=r"writers\[0\].replica: unknown key \(known: name, token_env, token_file"):
        load_writers(spec, {"FLEET_A": "a"})


def test_request_records_need_a_writer_bound_to_their_replica(guarded):
    url, controller, _ = guarded

    def body(replica: str) -> bytes:
        return (json.dumps(request_record(replica_id=replica)) + "\n").encode()

    with httpx.Client(base_url=url) as http:
        assert http.post("/v1/request-records", content=body("replica-a1"), headers=NDJSON).status_code == 401
        signed = {**NDJSON, **bearer("token-a")}
        assert http.post("/v1/request-records", content=body("replica-b1"), headers=signed).status_code == 403
        assert http.post("/v1/request-records", content=body("replica-a1"), headers=signed).status_code == 200
    assert controller.store.counts()["request_records"] == 1
