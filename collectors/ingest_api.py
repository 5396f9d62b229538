"""HTTP ingestion: ``POST /v1/ingest`` with an NDJSON or Arrow IPC body of step records, and
``POST /v1/request-records`` with an NDJSON body of request records (docs/design.md §4, §7).

Mount ``ingest_router(ingestor)`` in any FastAPI app. Responses:

- 200 ``{"steps", "requests", "depth_labels", "quarantined": 0}`` once the batch is committed;
- 422 ``{..., "problems": [{"position", "replica_id", "step_id", "problems": [...]}]}``
  when some records were invalid: the valid ones are committed and the invalid
  ones quarantined (retrying the same body would only duplicate them);
- 413 when the body exceeds the limit (``BodyLimit`` gives every route of an app the same), 415 for
  another content type, 400 for an
  empty body, 503 with ``Retry-After`` and the cause when the store could not commit
  (nothing was written; retry);
- with ``writers``: 401 without a writer token, 403 with a wrong one or for a body
  naming a replica the writer may not post for (nothing is written).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from sparkgate.collectors.batch import Quarantined
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.request_ingest import prepare_requests
from sparkgate.collectors.wire import Parsed, from_ipc, from_ndjson
from sparkgate.collectors.writers import Refused, Writers

NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json")
ARROW_TYPES = ("application/vnd.apache.arrow.stream",)
DEFAULT_MAX_BODY = 64 << 20
T = TypeVar("T")


class _TooLarge(Exception):
    pass


class BodyLimit:
    """ASGI middleware: a request body past ``limit`` bytes is answered 413 before a route reads it whole
    (by its Content-Length, or as a chunked body passes the limit), on every route, the JSON ones too."""

    def __init__(self, app, limit: int = DEFAULT_MAX_BODY):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        size = 0

        async def counted():
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.limit:
                raise HTTPException(413, f"body larger than {self.limit} bytes")
            return message

        return await self.app(scope, counted, send)

    async def _refuse(self, scope, receive, send):
        await JSONResponse({"error": f"body larger than {self.limit} bytes"}, status_code=413)(scope, receive, send)


async def _read_limited(request: Request, limit: int) -> bytes:
    """The body, refusing it as soon as it passes ``limit`` bytes (whatever Content-Length claims)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
    except HTTPException as exc:  # the app's BodyLimit counted it first: answer as a declared length is
        if exc.status_code == 413:
            raise _TooLarge from None
        raise
    return b"".join(chunks)


def _parser(content_type: str):
    kind = content_type.split(";")[0].strip().lower()
    if kind in NDJSON_TYPES:
        return from_ndjson
    if kind in ARROW_TYPES:
        return from_ipc
    return None


async def _accepted_body(request: Request, writers: Writers | None, kinds: tuple[str, ...], limit: int):
    """(writer, body) of a write request, or the error response that refuses it."""
    try:
        writer = writers.identify(request.headers.get("authorization")) if writers is not None else None
    except Refused as refused:
        return JSONResponse({"error": refused.reason}, status_code=refused.status)
    if request.headers.get("content-type", "").split(";")[0].strip().lower() not in kinds:
        return JSONResponse({"error": f"content-type must be one of {list(kinds)}"}, status_code=415)
    try:
        body = await _read_limited(request, limit)
    except _TooLarge:
        return JSONResponse({"error": f"body larger than {limit} bytes"}, status_code=413)
    if not body or body.isspace():  # not ``strip()``: that copies a body of tens of MB to test it
        return JSONResponse({"error": "empty body"}, status_code=400)
    return writer, body


async def _commit(commit: Callable[[], T]) -> T | JSONResponse:
    try:
        return await run_in_threadpool(commit)
    except Refused as refused:
        return JSONResponse({"error": refused.reason}, status_code=refused.status)
    except Exception as exc:
        # Bad input never gets here (it is quarantined); what does is the store's.
        return not_committed(exc)


def not_committed(exc: Exception, key: str = "error") -> JSONResponse:
    """The answer when the store failed (a full disk, a closed store): nothing was written, and a retry can
    succeed once the cause is gone, so a 503 with ``Retry-After``. ``key`` is the route family's error field."""
    return JSONResponse({key: f"not committed: {type(exc).__name__}: {exc}"}, status_code=503,
                        headers={"Retry-After": "1"})  # fmt: skip


def _reply(summary: dict, quarantined: list[Quarantined]) -> JSONResponse:
    """200 with what was committed, or 422 with every quarantined record's problems beside it."""
    if quarantined:
        return JSONResponse(summary | {"problems": [q.to_dict() for q in quarantined]}, status_code=422)
    return JSONResponse(summary)


def ingest_router(
    ingestor: Ingestor, max_body_bytes: int = DEFAULT_MAX_BODY, writers: Writers | None = None
) -> APIRouter:
    """A router with ``POST /v1/ingest`` (step records) and ``POST /v1/request-records`` (request records,
    NDJSON) committing into ``ingestor``; ``writers`` (when given) must sign them."""
    router = APIRouter()

    def permit(writer, replicas) -> None:
        if writers is not None and writer is not None:
            writers.permit(writer, set(replicas))

    @router.post("/v1/ingest")
    async def ingest(request: Request) -> Response:
        accepted = await _accepted_body(request, writers, NDJSON_TYPES + ARROW_TYPES, max_body_bytes)
        if isinstance(accepted, Response):
            return accepted
        writer, body = accepted
        parse = _parser(request.headers.get("content-type", ""))
        source = f"http:{request.client.host if request.client else 'unknown'}"

        def commit():
            parsed: Parsed = parse(body)
            permit(writer, parsed.wire.column("replica_id").to_pylist())
            # Handlers commit concurrently: a body's sums are computed while another body holds the lock.
            return ingestor.ingest(parsed, source, sums_before_lock=True)

        result = await _commit(commit)
        if isinstance(result, JSONResponse):
            return result
        return _reply(result.summary(), result.prepared.quarantined)

    @router.post("/v1/request-records")
    async def request_records(request: Request) -> Response:
        accepted = await _accepted_body(request, writers, NDJSON_TYPES, max_body_bytes)
        if isinstance(accepted, Response):
            return accepted
        writer, body = accepted
        source = f"http:{request.client.host if request.client else 'unknown'}"

        def commit():
            prepared = prepare_requests(body)
            permit(
                writer,
                prepared.rows.column("replica_id").to_pylist()
                + [q.replica_id for q in prepared.quarantined if q.replica_id],
            )
            return ingestor.ingest_requests(prepared, source)

        committed = await _commit(commit)
        if isinstance(committed, JSONResponse):
            return committed
        return _reply(committed.summary(), committed.quarantined)

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
