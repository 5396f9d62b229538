"""Front ends: NDJSON and Arrow IPC parsing, the in-process sink, the HTTP endpoint, metrics, spans."""

from __future__ import annotations

import json
import threading

import httpx
import pyarrow as pa
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.ingest import Ingestor, StoreSink
from sparkgate.collectors.ingest_api import ingest_app, serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.schema import RequestRow
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.tracing import tracer_provider
from sparkgate.collectors.wire import from_ipc, from_ndjson, from_records, to_ipc
from tests.collectors.otlp_receiver import attributes, otlp_receiver
from tests.collectors.strategies import compact_row, step


def ndjson(*records) -> bytes:
    return b"".join(json.dumps(r.to_dict() if hasattr(r, "to_dict") else r).encode() + b"\n" for r in records)


def test_ndjson_fast_path_and_blank_lines():
    parsed = from_ndjson(b"\n" + ndjson(step(1), step(2, requests=[compact_row()])) + b"\n\n")
    assert parsed.wire.num_rows == 2 and not parsed.rejected
    assert parsed.wire.column("requests").to_pylist()[1][0]["window"] == 2


def test_ndjson_bad_lines_are_pinpointed():
    body = (
        ndjson(step(1))
        + b"{not json\n"
        + json.dumps(step(3).to_dict()).replace('"gamma": 4', '"gamma": "four"').encode()
        + b"\n"
        + ndjson(step(4))
    )
    parsed = from_ndjson(body)
    assert parsed.wire.column("step_id").to_pylist() == [1, 4]
    assert list(parsed.positions) == [0, 3]
    rejected = {r.position: r for r in parsed.rejected}
    assert "invalid JSON" in rejected[1].problems[0].message
    assert rejected[2].problems[0].field == "gamma" and rejected[2].problems[0].value == "four"
    assert rejected[2].payload.startswith(b'{"replica_id"')


def test_ndjson_lines_that_are_not_objects_are_rejected_not_fatal():
    """A `null` line beside a mistyped record once crashed Arrow's JSON reader (SIGSEGV)."""
    body = b"null\n" + json.dumps(dict(step(2).to_dict(), replica_id=[-3, 3])).encode() + b"\n7\n" + ndjson(step(5))
    parsed = from_ndjson(body)
    assert parsed.wire.column("step_id").to_pylist() == [5]
    assert sorted(r.position for r in parsed.rejected) == [0, 1, 2]


def test_ndjson_nan_falls_back_and_reaches_validation(store):
    body = json.dumps(step(1, requests=[compact_row()]).to_dict()).replace("0.9,", "NaN,", 1).encode()
    result = store.ingest(from_ndjson(body), "t")
    assert result.quarantined == 1
    assert result.prepared.quarantined[0].problems[0].field == "requests[0].confidence[0]"


def test_arrow_ipc_round_trip_and_missing_columns():
    wire = synthetic_wire(3, batch=2, gamma=3)
    assert from_ipc(to_ipc(wire)).wire.equals(wire)
    partial = from_ipc(to_ipc(wire.drop_columns(["ts", "sts_version"])))
    assert partial.wire.column("ts").null_count == 3
    garbage = from_ipc(b"definitely not arrow")
    assert garbage.wire.num_rows == 0 and garbage.rejected[0].problems[0].field == "<body>"
    wrong = from_ipc(to_ipc(pa.table({"gamma": pa.array(["x"])})))
    assert wrong.rejected[0].problems[0].field == "gamma"


def test_sink_commits_batches_and_flush_waits(ingestor, store):
    commits = []
    with StoreSink(ingestor, batch_records=4, max_delay_s=0.05, on_commit=commits.append) as sink:
        for i in range(10):
            sink(step(i, requests=[compact_row(request_id=f"r{i}")]))
        sink.flush()
        assert store.counts()["steps"] == 10
    assert sum(c.steps for c in commits) == 10 and max(c.steps for c in commits) <= 4


def test_sink_applies_backpressure_instead_of_growing_or_dropping(store):
    release = threading.Event()

    class StalledDisk(Ingestor):
        def ingest(self, parsed, source):
            release.wait(timeout=30)
            return super().ingest(parsed, source)

    with StoreSink(StalledDisk(store), batch_records=2, max_delay_s=0.01, max_pending=4) as sink:
        producer = threading.Thread(
            target=lambda: [sink(step(i, requests=[compact_row(request_id=f"r{i}")])) for i in range(12)]
        )
        producer.start()
        producer.join(timeout=0.5)
        assert producer.is_alive()  # blocked: the writer holds one batch, the queue is full
        release.set()
        producer.join(timeout=30)
        assert not producer.is_alive()
        sink.flush()
    assert store.counts()["steps"] == 12
    with pytest.raises(ValueError, match="max_pending=1 must be >= batch_records=2"):
        StoreSink(Ingestor(store), batch_records=2, max_pending=1)


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
        assert (
            http.post("/v1/ingest", content=b" ", headers={"content-type": "application/x-ndjson"}).status_code == 400
        )
        scrape = http.get("/metrics").text
    assert store.counts() == {"steps": 7, "requests": 21, "depth_labels": 64, "quarantine": 1}
    assert "sparkgate_ingested_steps_total 7.0" in scrape
    assert 'sparkgate_quarantined_total{source="http:127.0.0.1"} 1.0' in scrape


def test_metrics_count_depths_tiers_and_times(store):
    metrics = Metrics()
    ingestor = Ingestor(store, metrics)
    rows = [compact_row(gamma=4, window=2, accepted=2), compact_row(gamma=4, window=3, accepted=1, request_id="r2")]
    ingestor.ingest(
        from_ndjson(ndjson(step(1, requests=rows), step(2, graph_hit=False, miss_reason="over_max_tier"))), "t"
    )
    value = metrics.registry.get_sample_value
    # depth 2: accepted in row 1, rejected in row 2; depth 3: censored in row 1, not at risk in row 2.
    assert value("sparkgate_depth_verified_total", {"mode": "compact", "depth": "2"}) == 2
    assert value("sparkgate_depth_accepted_total", {"mode": "compact", "depth": "2"}) == 1
    assert value("sparkgate_depth_censored_total", {"mode": "compact", "depth": "3"}) == 1
    assert value("sparkgate_depth_verified_total", {"mode": "compact", "depth": "3"}) == 0
    assert value("sparkgate_tier_hits_total", {"tier": "64"}) == 1
    assert value("sparkgate_tier_misses_total", {"reason": "over_max_tier"}) == 1
    assert value("sparkgate_step_seconds_bucket", {"le": "0.008"}) == 2
    assert value("sparkgate_step_seconds_bucket", {"le": "0.004"}) == 0
    agg = Aggregate.from_tables(*tables_of(ingestor, step(3, requests=[cap_row()])), depths=4)
    metrics.publish(agg)
    assert value("sparkgate_survival_ece", {"depth": "1"}) == agg.survival.ece()[1]
    assert value("sparkgate_upper_bound_utilization") == 0.5  # accepted 2 of the 4 the full block had
    metrics.set_phase("canary")
    assert value("sparkgate_rollout_phase", {"phase": "canary"}) == 1
    assert value("sparkgate_rollout_phase", {"phase": "shadow"}) == 0


def cap_row():
    return RequestRow("c", "cap_accept", "chat", 0.0, None, 2, 2, 4, 2, [0.9] * 4, [0.9, 0.8, 0.7, 0.6], [1, 2, 3])


def tables_of(ingestor, record):
    prepared = ingestor.ingest(from_records([record]), "t").prepared
    return prepared.requests, prepared.labels


def test_one_internal_span_per_step(store):
    exporter = InMemorySpanExporter()
    provider = tracer_provider(exporter=exporter)
    ingestor = Ingestor(store, tracer=provider.get_tracer("test"))
    rows = [compact_row(), compact_row(request_id="r2")]
    ingestor.ingest(
        from_ndjson(ndjson(step(1, requests=rows), step(2, graph_hit=False, miss_reason="not_captured"))), "t"
    )
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["verify_step", "verify_step"]
    first, second = spans
    assert first.kind == SpanKind.INTERNAL
    assert first.attributes["sparkgate.step_id"] == 1 and first.attributes["sparkgate.mode.compact"] == 2
    assert first.attributes["sparkgate.tier_rows"] == 64 and "sparkgate.miss_reason" not in first.attributes
    assert second.attributes["sparkgate.miss_reason"] == "not_captured"
    assert first.end_time - first.start_time == 4_500_000  # step_ms = 4.5


def test_spans_reach_a_real_otlp_receiver(store):
    with otlp_receiver() as (url, received):
        provider = tracer_provider(otlp_endpoint=url, service_name="sparkgate-test")
        ingestor = Ingestor(store, tracer=provider.get_tracer("test"))
        ingestor.ingest(
            from_ndjson(
                ndjson(step(1, requests=[compact_row()]), step(2, graph_hit=False, miss_reason="over_max_tier"))
            ),
            "t",
        )
        provider.shutdown()  # flushes the batch processor
        spans = received.wait_for(2)
    assert len(spans) == 2
    (resource, first), (_, second) = sorted(spans, key=lambda rs: attributes(rs[1])["sparkgate.step_id"])
    assert resource["service.name"] == "sparkgate-test"
    assert first.name == "verify_step" and first.kind == first.SPAN_KIND_INTERNAL
    assert attributes(first)["sparkgate.mode.compact"] == 1 and attributes(first)["sparkgate.graph_hit"] is True
    assert attributes(second)["sparkgate.miss_reason"] == "over_max_tier"
    assert first.end_time_unix_nano - first.start_time_unix_nano == 4_500_000
