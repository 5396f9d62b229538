"""HTTP ingestion: ``POST /v1/ingest`` with an NDJSON or Arrow IPC body (docs/design.md §4, §7).

Mount ``ingest_router(ingestor)`` in any FastAPI app. Responses:

- 200 ``{"steps", "requests", "depth_labels", "quarantined": 0}`` once the batch is committed;
- 422 ``{..., "problems": [{"position", "replica_id", "step_id", "problems": [...]}]}``
  when some records were invalid: the valid ones are committed and the invalid
  ones quarantined (retrying the same body would only duplicate them);
- 413 when the body exceeds the limit, 415 for another content type, 400 for an
  empty body, 503 with ``Retry-After`` and the cause when the store could not commit
  (nothing was written; retry);
- with ``writers``: 401 without a writer token, 403 with a wrong one or for a body
  naming a replica the writer may not post for (nothing is written).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.wire import Parsed, from_ipc, from_ndjson
from sparkgate.collectors.writers import Refused, Writers

NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json")
ARROW_TYPES = ("application/vnd.apache.arrow.stream",)
DEFAULT_MAX_BODY = 64 << 20


class _TooLarge(Exception):
    pass


async def _read_limited(request: Request, limit: int) -> bytes:
    """The body, refusing it as soon as it passes ``limit`` bytes (whatever Content-Length claims)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _parser(content_type: str):
    kind = content_type.split(";")[0].strip().lower()
    if kind in NDJSON_TYPES:
        return from_ndjson
    if kind in ARROW_TYPES:
        return from_ipc
    return None


def ingest_router(
    ingestor: Ingestor, max_body_bytes: int = DEFAULT_MAX_BODY, writers: Writers | None = None
) -> APIRouter:
    """A router with ``POST /v1/ingest`` committing into ``ingestor``; ``writers`` (when given) must sign it."""
    router = APIRouter()

    @router.post("/v1/ingest")
    async def ingest(request: Request) -> Response:
        try:
            writer = writers.identify(request.headers.get("authorization")) if writers is not None else None
        except Refused as refused:
            return JSONResponse({"error": refused.reason}, status_code=refused.status)
        parse = _parser(request.headers.get("content-type", ""))
        if parse is None:
            return JSONResponse(
                {"error": f"content-type must be one of {list(NDJSON_TYPES + ARROW_TYPES)}"}, status_code=415
            )
        try:
            body = await _read_limited(request, max_body_bytes)
        except _TooLarge:
            return JSONResponse({"error": f"body larger than {max_body_bytes} bytes"}, status_code=413)
        if not body.strip():
            return JSONResponse({"error": "empty body"}, status_code=400)
        source = f"http:{request.client.host if request.client else 'unknown'}"

        def commit():
            parsed: Parsed = parse(body)
            if writers is not None and writer is not None:
                writers.permit(writer, set(parsed.wire.column("replica_id").to_pylist()))
            return ingestor.ingest(parsed, source)

        try:
            result = await run_in_threadpool(commit)
        except Refused as refused:
            return JSONResponse({"error": refused.reason}, status_code=refused.status)
        except Exception as exc:
            # Bad input never gets here (it is quarantined); what does is the store's (a full disk, a closed
            # store): nothing was written, and a retry can succeed once the cause is gone.
            cause = f"{type(exc).__name__}: {exc}"
            return JSONResponse({"error": f"not committed: {cause}"}, status_code=503, headers={"Retry-After": "1"})
        payload = result.summary()
        if result.quarantined:
            payload["problems"] = [q.to_dict() for q in result.prepared.quarantined]
            return JSONResponse(payload, status_code=422)
        return JSONResponse(payload)

    return router


def ingest_app(ingestor: Ingestor, max_body_bytes: int = DEFAULT_MAX_BODY) -> FastAPI:
    """A standalone app: the ingest route plus ``/metrics`` when the ingestor has metrics."""
    app = FastAPI(title="sparkgate ingest")
    app.include_router(ingest_router(ingestor, max_body_bytes))
    if ingestor.metrics is not None:
        metrics = ingestor.metrics

        @app.get("/metrics")
        def scrape() -> Response:
            return Response(metrics.exposition(), media_type="text/plain; version=0.0.4")

    return app


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run ``app`` under uvicorn on a background thread; yields its base URL (port 0 picks a free one)."""
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="sparkgate-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"HTTP server on {host}:{port} failed to start")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join()
