"""One bad line never poisons its body: nested too deep, a lone surrogate, an integer no column holds, a phase
no read counts. Each gets a 422 naming the line and field, is quarantined, and its valid siblings are stored
(a 503 would have the sender retry the same body for ever, losing them)."""

from __future__ import annotations

import dataclasses
import json

import httpx
import pyarrow as pa
import pytest

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import ARROW_TYPES, ingest_app, serve_in_thread
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_ipc, from_ndjson, to_ipc
from tests.collectors.strategies import compact_row, ndjson, step
from tests.conftest import request_record

NDJSON = {"content-type": "application/x-ndjson"}
DEEP = "[" * 100_000 + "]" * 100_000


def _post(store, path: str, body: bytes) -> httpx.Response:
    with serve_in_thread(ingest_app(Ingestor(store))) as url, httpx.Client(base_url=url, timeout=60) as http:
        return http.post(path, content=body, headers=NDJSON)


@pytest.mark.parametrize(
    "bad, field",
    [
        (DEEP, "<line>"),
        ('{"requests": ' + DEEP + "}", "<line>"),
        (
            json.dumps(step(3, requests=[compact_row(request_id="bad")]).to_dict()).replace('"bad"', '"b\\ud800d"'),
            "request_id",
        ),
        (json.dumps(step(3, phase="shadw").to_dict()), "phase"),
        (json.dumps({**step(3).to_dict(), "step_cpu_msec": 3.0}), "step_cpu_msec"),  # a misspelt field's value
        (
            json.dumps(step(3, requests=[compact_row()]).to_dict()).replace('"window":', '"windw": 1, "window":'),
            "requests[0].windw",
        ),
        (json.dumps(step(3, requests=[dataclasses.replace(compact_row(), position=2**63 - 1)]).to_dict()), "position"),
    ],
)
def test_a_bad_step_line_is_named_and_its_valid_sibling_stored(store, bad, field):
    reply = _post(store, "/v1/ingest", ndjson(step(1, requests=[compact_row()])) + bad.encode() + b"\n")
    assert reply.status_code == 422, reply.text
    (problem,) = reply.json()["problems"]
    assert problem["position"] == 1 and field in json.dumps(problem["problems"])
    assert store.counts()["steps"] == 1 and store.counts()["quarantine"] == 1


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"prompt_tokens": 2**70}, "prompt_tokens"),
        ({"epoch": 2**64, "arm": "control"}, "epoch"),
        ({"phase": "shadw"}, "phase"),
        ({"contract": 7}, "contract"),
        ({"request_id": "q\u202e1"}, "request_id"),
    ],
)
def test_a_bad_request_record_is_named_and_its_valid_sibling_stored(store, changes, field):
    good = json.dumps(request_record(request_id="good")).encode()
    bad = json.dumps(request_record(**{"request_id": "bad", **changes})).encode()
    reply = _post(store, "/v1/request-records", good + b"\n" + bad + b"\n")
    assert reply.status_code == 422, reply.text
    (problem,) = reply.json()["problems"]
    assert problem["position"] == 1 and [p["field"] for p in problem["problems"]] == [field]
    assert store.counts()["request_records"] == 1 and store.counts()["quarantine"] == 1


@pytest.mark.parametrize("path", ["/v1/request-records", "/v1/ingest"])
def test_a_lone_surrogate_in_the_replica_id_is_answered_422_not_500_after_the_commit(store, path):
    # Python decodes a non-UTF-8 byte in --replica-id as a lone surrogate; the reply echoes the key.
    record = request_record(replica_id="gpu-x") if "request" in path else step(3).to_dict() | {"replica_id": "gpu-x"}
    reply = _post(store, path, json.dumps(record).replace('"gpu-x"', '"gpu-\\udcff"').encode() + b"\n")
    assert reply.status_code == 422, reply.text
    assert reply.json()["problems"][0]["replica_id"] in ("gpu-\ufffd", None) and store.counts()["quarantine"] == 1


def test_a_lone_surrogate_in_a_request_record_is_named_and_quarantined_whole(store):
    good = json.dumps(request_record(request_id="good")).encode()
    bad = json.dumps(request_record(request_id="bad")).replace('"bad"', '"b\\udc00d"').encode()
    reply = _post(store, "/v1/request-records", good + b"\n" + bad + b"\n")
    assert reply.status_code == 422, reply.text
    (problem,) = reply.json()["problems"][0]["problems"]
    assert problem == {
        "field": "request_id",
        "value": "b\ufffdd",
        "message": "not valid Unicode (a lone surrogate escape)",
    }
    assert store.counts()["request_records"] == 1 and store.counts()["quarantine"] == 1


@pytest.mark.parametrize(
    "column, values, named",
    [
        ("step_id", pa.array(["0", "1"]), "step_id"),  # a cast would store the strings as numbers
        ("replica_id", pa.array([7, 7]), "replica_id"),
        ("graph_hit", pa.array([5, 5]), "graph_hit"),
        ("stepms", pa.array([1.0, 1.0]), "stepms"),  # a column the schema lacks
    ],
)
def test_an_arrow_body_whose_column_holds_another_kind_of_value_is_refused_naming_it(store, column, values, named):
    wire = synthetic_wire(2, 2, 3)
    wire = wire.set_column(wire.schema.get_field_index(column), column, values) if column in wire.column_names else (
        wire.append_column(column, values))  # fmt: skip
    with serve_in_thread(ingest_app(Ingestor(store))) as url, httpx.Client(base_url=url, timeout=60) as http:
        reply = http.post("/v1/ingest", content=to_ipc(wire), headers={"content-type": ARROW_TYPES[0]})
    assert reply.status_code == 422 and reply.json()["problems"][0]["problems"][0]["field"] == named, reply.text
    assert store.counts()["steps"] == 0


def test_an_arrow_body_of_narrower_numbers_is_read_as_the_schemas():
    wire = synthetic_wire(2, 2, 3)
    narrow = wire
    for name, kind in (("batch_size", pa.int32()), ("step_ms", pa.float32())):
        narrow = narrow.set_column(wire.schema.get_field_index(name), name, wire[name].cast(kind))
    parsed = from_ipc(to_ipc(narrow))
    assert parsed.rejected == [] and parsed.wire.column("batch_size").to_pylist() == wire["batch_size"].to_pylist()


def test_an_id_float64_cannot_hold_exactly_is_read_exactly_not_rounded_onto_another():
    body = ndjson(step(2**53 + 1), step(2**53))  # 2^53 + 1 reads as 2^53 in float64: one key, twice
    parsed = from_ndjson(body)
    assert parsed.rejected == [] and parsed.wire.column("step_id").to_pylist() == [2**53 + 1, 2**53]
