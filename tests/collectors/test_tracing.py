"""OpenTelemetry spans: one INTERNAL span per step, in memory and over real OTLP/HTTP."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.tracing import tracer_provider
from sparkgate.collectors.wire import from_ndjson
from tests.collectors.otlp_receiver import attributes, otlp_receiver
from tests.collectors.strategies import compact_row, ndjson, step


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
    assert first.end_time == int(step(1).ts * 1e9)  # ts is when the step finished, as the runtime stamps it


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
