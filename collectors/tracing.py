"""OpenTelemetry: one INTERNAL span per committed verify step.

Spans are built after the fact from the step record: the span ends at the
record's ``ts`` (when the step finished, unix seconds: the runtime stamps its record
then) and lasts ``step_ms``. An OTLP
exporter is used when an endpoint is configured (the ``otlp`` extra), an
in-memory exporter in tests.
"""

from __future__ import annotations

import numpy as np
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import SpanKind, Tracer

from sparkgate.collectors.labels import mode_codes
from sparkgate.collectors.schema import MODES
from sparkgate.collectors.wire import Flat

_STEP_ATTRIBUTES = (
    "replica_id",
    "step_id",
    "batch_size",
    "gamma",
    "verify_rows",
    "tier_rows",
    "tier",
    "graph_hit",
    "phase",
    "policy_revision",
)


def tracer_provider(
    otlp_endpoint: str | None = None, exporter: SpanExporter | None = None, service_name: str = "sparkgate"
) -> TracerProvider:
    """A provider exporting to ``exporter`` (synchronously) or to OTLP/HTTP at ``otlp_endpoint`` (batched).

    ``otlp_endpoint`` is the collector's full traces URL (``http://host:4318/v1/traces``).
    Call ``shutdown()`` on the provider when done: it flushes the spans still batched.
    """
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if otlp_endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise RuntimeError("otlp_endpoint needs the OTLP exporter: pip install 'sparkgate[otlp]'") from exc
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    return provider


def emit_step_spans(tracer: Tracer, flat: Flat) -> None:
    """One ``verify_step`` span per step of ``flat`` with ``sparkgate.*`` attributes."""
    steps = flat.steps
    columns = {name: steps.column(name).to_pylist() for name in _STEP_ATTRIBUTES + ("miss_reason", "ts", "step_ms")}
    per_mode = np.zeros((steps.num_rows, len(MODES)), dtype=np.int64)
    if flat.requests.num_rows:
        np.add.at(per_mode, (flat.parent, mode_codes(flat.requests.column("mode"))), 1)
    for i in range(steps.num_rows):
        end_ns = int(columns["ts"][i] * 1e9)
        attributes = {f"sparkgate.{name}": columns[name][i] for name in _STEP_ATTRIBUTES}
        attributes.update({f"sparkgate.mode.{mode}": int(per_mode[i, m]) for m, mode in enumerate(MODES)})
        if columns["miss_reason"][i] is not None:
            attributes["sparkgate.miss_reason"] = columns["miss_reason"][i]
        start_ns = end_ns - int(columns["step_ms"][i] * 1e6)
        span = tracer.start_span("verify_step", kind=SpanKind.INTERNAL, start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)
