"""The HTTP ingest endpoint: NDJSON and Arrow bodies, problems, limits; a killed writer loses no acknowledged batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import httpx
from fastapi import FastAPI
from pydantic import BaseModel

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import ARROW_TYPES, BodyLimit, ingest_app, ingest_router, serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import to_ipc
from tests.collectors.strategies import compact_row, ndjson, step
from tests.conftest import request_record


def test_http_ingest_ndjson_arrow_problems_and_limits(store):
    ingestor = Ingestor(store, Metrics())
    with serve_in_thread(ingest_app(ingestor, max_body_bytes=200_000)) as url, httpx.Client(base_url=url) as http:
        ok = http.post(
            "/v1/ingest",
            content=ndjson(step(1, requests=[compact_row()])),
            headers={"content-type": "application/x-ndjson"},
        )
        assert ok.status_code == 200 and ok.json() == {"steps": 1, "requests": 1, "depth_labels": 4, "quarantined": 0}
        arrow = http.post(
            "/v1/ingest",
            content=to_ipc(synthetic_wire(5, 4, 3, first_step=100)),
            headers={"content-type": "application/vnd.apache.arrow.stream"},
        )
        assert arrow.status_code == 200 and arrow.json()["depth_labels"] == 60
        bad = http.post(
            "/v1/ingest", content=ndjson(step(2), step(3, gamma=0)), headers={"content-type": "application/x-ndjson"}
        )
        assert bad.status_code == 422
        assert bad.json()["steps"] == 1
        assert bad.json()["problems"] == [
            {
                "position": 1,
                "replica_id": "replica-a",
                "step_id": 3,
                "problems": [{"field": "gamma", "value": 0, "message": "must be in [1, 64]"}],
            }
        ]
        big = http.post("/v1/ingest", content=b"x" * 300_000, headers={"content-type": "application/x-ndjson"})
        assert big.status_code == 413
        assert http.post("/v1/ingest", content=b"a", headers={"content-type": "text/csv"}).status_code == 415
        for blank in (b"", b" ", b"\n \t\r\n"):
            empty = http.post("/v1/ingest", content=blank, headers={"content-type": "application/x-ndjson"})
            assert empty.status_code == 400 and empty.json() == {"error": "empty body"}, blank
        scrape = http.get("/metrics").text
    assert store.counts() == {"steps": 7, "requests": 21, "depth_labels": 64, "request_records": 0, "quarantine": 1}
    assert "sparkgate_ingested_steps_total 7.0" in scrape
    assert 'sparkgate_quarantined_total{source="http:127.0.0.1"} 1.0' in scrape


WRITER = """
import sys, time
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import ARROW_TYPES, BodyLimit, ingest_app, serve_in_thread
from sparkgate.collectors.store import Store
with serve_in_thread(ingest_app(Ingestor(Store(sys.argv[1])))) as url:
    print(url, flush=True)
    while True:
        time.sleep(1)
"""


def test_sigkill_mid_stream_loses_no_acknowledged_batch(tmp_path):
    db = tmp_path / "killed.duckdb"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    url = writer.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:")
    bodies = [
        b"\n".join(
            json.dumps(r).encode() for r in synthetic_wire(40, 16, 5, "w", first_step=40 * b, seed=b).to_pylist()
        )
        for b in range(200)
    ]
    acked: list[int] = []
    third_ack = threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=url, timeout=30.0) as http:
            for b, body in enumerate(bodies):
                try:
                    reply = http.post("/v1/ingest", content=body, headers={"content-type": "application/x-ndjson"})
                except httpx.HTTPError:
                    return
                if reply.status_code == 200:
                    acked.append(b)
                    if len(acked) == 3:
                        third_ack.set()

    poster = threading.Thread(target=stream)
    poster.start()
    assert third_ack.wait(60)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    poster.join()
    assert len(acked) < len(bodies)  # the kill landed mid-stream

    with Store(db) as store:
        rows = store.query("SELECT step_id // 40 AS b, count(*) AS n FROM depth_labels GROUP BY 1").to_pylist()
        per_batch = {r["b"]: r["n"] for r in rows}
        steps = store.counts()["steps"]
    full = 40 * 16 * 5
    assert all(per_batch.get(b) == full for b in acked)  # every acknowledged batch, whole
    assert all(n == full for n in per_batch.values())  # nothing half there
    assert steps == 40 * len(per_batch)


def test_request_records_over_http_stored_or_quarantined_with_their_problems(store):
    ingestor = Ingestor(store, Metrics())
    good = json.dumps(request_record(epoch=4, arm="control")).encode()
    bad = json.dumps(request_record(request_id="q1", commit_tokens=[1])).encode()
    with serve_in_thread(ingest_app(ingestor)) as url, httpx.Client(base_url=url) as http:
        ok = http.post("/v1/request-records", content=good + b"\n", headers={"content-type": "application/x-ndjson"})
        assert ok.status_code == 200 and ok.json() == {"request_records": 1, "quarantined": 0}
        mixed = http.post("/v1/request-records", content=good + b"\n" + bad + b"\n",
                          headers={"content-type": "application/x-ndjson"})  # fmt: skip
        assert mixed.status_code == 422
        problems = mixed.json()["problems"]
        assert [p["position"] for p in problems] == [0, 1]  # the repeat of q0 and the bad q1
        assert {f["field"] for f in problems[1]["problems"]} == {"commit_tokens"}
        arrow = http.post("/v1/request-records", content=b"x", headers={"content-type": ARROW_TYPES[0]})
        assert arrow.status_code == 415
        scrape = http.get("/metrics").text
    assert "sparkgate_ingested_request_records_total 1.0" in scrape
    assert 'sparkgate_request_ttft_seconds_count{arm="control"} 1.0' in scrape
    assert store.counts()["request_records"] == 1 and store.counts()["quarantine"] == 2


class _Report(BaseModel):
    text: str


def test_a_records_route_answers_a_body_past_the_limit_alike_with_a_length_or_chunked(store):
    # Behind the app's BodyLimit the chunked body met the middleware's check first, which answered in
    # FastAPI's shape ({"detail": ...}) where a declared length got the route's ({"error": ...}).
    app = FastAPI()
    app.add_middleware(BodyLimit, limit=1000)
    app.include_router(ingest_router(Ingestor(store), max_body_bytes=1000))
    headers = {"content-type": "application/x-ndjson"}
    with serve_in_thread(app) as url, httpx.Client(base_url=url) as http:
        declared = http.post("/v1/ingest", content=b"x" * 2000, headers=headers)
        chunked = http.post("/v1/ingest", content=iter([b"x" * 600, b"x" * 600]), headers=headers)
    for reply in (declared, chunked):
        assert reply.status_code == 413 and reply.json() == {"error": "body larger than 1000 bytes"}


def test_a_body_past_the_limit_is_refused_before_a_json_route_reads_it_whole():
    app = FastAPI()
    app.add_middleware(BodyLimit, limit=1000)

    @app.post("/report")
    def report(body: _Report) -> dict:
        return {"length": len(body.text)}

    with serve_in_thread(app) as url, httpx.Client(base_url=url) as http:
        assert http.post("/report", json={"text": "x" * 900}).json() == {"length": 900}
        declared = http.post("/report", json={"text": "x" * 2000})
        assert declared.status_code == 413 and declared.json() == {"error": "body larger than 1000 bytes"}
        chunked = http.post("/report", content=iter([b'{"text": "', b"x" * 2000, b'"}']))  # no Content-Length
        assert chunked.status_code == 413 and "body larger than 1000 bytes" in chunked.text
