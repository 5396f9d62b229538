"""A real OTLP/HTTP traces receiver on 127.0.0.1: decodes each protobuf export it is sent."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.collectors.loopback import QuietHandler, serving


class Received:
    """Spans as ``(resource attributes, span)`` pairs, in arrival order."""

    def __init__(self):
        self.spans: list[tuple[dict, object]] = []
        self._lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((resource, span) for span in scope_spans.spans)

    def wait_for(self, n: int, timeout_s: float = 10.0) -> list[tuple[dict, object]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.spans) >= n:
                    return list(self.spans)
            time.sleep(0.02)
        raise AssertionError(f"received {len(self.spans)} spans, expected {n}")


def attributes(span) -> dict:
    return {a.key: _value(a.value) for a in span.attributes}


def _value(v):
    return getattr(v, v.WhichOneof("value"))


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    """Yields (traces URL, received spans)."""
    received = Received()

    class Handler(QuietHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.path != "/v1/traces" or self.headers["content-type"] != "application/x-protobuf":
                self.send_error(404)
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            received.add(request)
            self.reply(ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    with serving(Handler) as url:
        yield f"{url}/v1/traces", received
