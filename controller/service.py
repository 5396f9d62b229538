"""The controller's HTTP API (docs/design.md §6, §7); FastAPI publishes its OpenAPI spec at ``/openapi.json``.

| route | what |
|---|---|
| ``GET /v1/policy`` | the policy replicas follow |
| ``POST /v1/records`` | step records (NDJSON or Arrow IPC), the collectors' ingest endpoint |
| ``POST /v1/consistency`` | replicas' greedy-replay and state checks |
| ``POST /v1/aggregates``, ``GET /v1/fleet`` | mergeable per-interval aggregates (a retried interval counts |
|   | once; an overlapping one is refused); their merged calibration, acceptance and utilization |
| ``GET /v1/requests/{request_id}/committed`` | a request's stored committed tokens, in step order |
| ``GET /v1/replicas/{replica_id}`` | the step id a (restarted) replica continues from |
| ``GET /v1/status``, ``GET /v1/decisions``, ``GET /v1/report`` | state, ledger, metrics |
| ``GET /v1/cost-tables[/{version}]``, ``POST /v1/cost-tables`` | versioned cost tables (``cost_table_api``) |
| ``POST /v1/rollout/{promote,abort,pause,resume,revert_table}`` | operator actions (bearer token) |
| ``GET /metrics``, ``GET /healthz`` | Prometheus exposition, liveness |

Operator routes answer 401 without a bearer token and 403 with a wrong one when
a token is configured. The writer routes (records, consistency, aggregates) do
the same with writer credentials (``collectors.writers``) when writers are
configured, and refuse with 403 a body for a replica the writer is not bound to.
Without both the service must listen on loopback only (``check_bind`` refuses
anything else), so only local users can act or write.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import duckdb
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from sparkgate.collectors.aggregate import Aggregate, AggregateError
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import (
    ARROW_TYPES,
    DEFAULT_MAX_BODY,
    NDJSON_TYPES,
    BodyLimit,
    ingest_router,
    not_committed,
)
from sparkgate.collectors.reports import IntervalOverlap, TooManyReports
from sparkgate.collectors.schema import MAX_CHECKS_PER_REPORT, Problem, json_safe
from sparkgate.collectors.writers import Refused, Writers
from sparkgate.policies.errors import InputError
from sparkgate.policies.payload import PolicyPayload
from sparkgate.policies.vocabulary import CheckKind, OperatorAction

from . import ledger
from .cost_table_api import cost_table_router
from .evaluate import evaluate
from .fleet import fleet_report, merge_aggregates
from .json_route import StrictJSONRoute
from .queries import Slice, Window
from .rollout import TransitionError
from .sources import sources
from .supervisor import Controller

# Stored as BIGINT: anything beyond is a client error, not a database failure.
TOKEN_LIMIT = 2**62
# Reports one /v1/fleet call merges (~20 ms per 1000): past it the caller narrows the span.
MAX_FLEET_REPORTS = 20_000


class Check(BaseModel):
    request_id: str = Field(min_length=1, max_length=512)
    kind: CheckKind = CheckKind.GREEDY_REPLAY
    tokens: int = Field(ge=0, le=TOKEN_LIMIT, description="Tokens compared.")
    mismatch_at: int | None = Field(
        None, ge=0, le=TOKEN_LIMIT, description="First differing position; null when identical."
    )
    expected: int | None = Field(None, ge=-TOKEN_LIMIT, le=TOKEN_LIMIT)
    got: int | None = Field(None, ge=-TOKEN_LIMIT, le=TOKEN_LIMIT)


class ConsistencyReport(BaseModel):
    replica_id: str = Field(min_length=1, max_length=512)
    checks: list[Check] = Field(min_length=1, max_length=MAX_CHECKS_PER_REPORT)


class AggregateReport(BaseModel):
    replica_id: str = Field(min_length=1, max_length=512)
    interval_start: float = Field(allow_inf_nan=False, description="Unix time the interval began.")
    interval_end: float = Field(allow_inf_nan=False, description="Unix time it ended (>= interval_start).")
    aggregate: dict[str, Any] = Field(description="``collectors.aggregate.Aggregate.to_dict()``.")


class Action(BaseModel):
    operator: str = Field(min_length=1, max_length=200, description="Who acts; recorded with the decision.")
    note: str = Field("", max_length=2000)
    revision: int | None = Field(
        None, ge=1, description="Act only while this revision is in force (409 otherwise): a retried promote then "
        "cannot climb a second rung."
    )  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, writers: Writers | None = None) -> None:
    """Refuse to listen beyond loopback without an operator token and writer credentials (anyone who can
    connect could roll out, or feed the gates forged records)."""
    if is_loopback(host):
        return
    if not token:
        raise ValueError(f"host={host!r}: listening beyond loopback needs an operator token (SPARKGATE_TOKEN)")
    if writers is None:
        raise ValueError(
            f"host={host!r}: listening beyond loopback needs writer credentials (SPARKGATE_WRITER_TOKEN or --writers)"
        )


# Port 0 on several addresses: how many ports the system may pick before one free on every address is given up.
PICK_TRIES = 8


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on ``host:port``, one per address ``host`` resolves to (``localhost``: 127.0.0.1 and
    ::1 where both are listed), each with SO_REUSEADDR and, for IPv6, IPV6_V6ONLY (``::`` is IPv6 alone): as
    asyncio's ``create_server`` binds for ``uvicorn.run``, which also skips an address whose family this kernel
    cannot open a socket of (IPv6 switched off). All share one port (``port`` 0: the one the system picked for
    the first socket, which the list starts with; picked again, up to ``PICK_TRIES`` times, when it is taken
    on another address). A command binds them before it opens or starts anything, so an address it cannot
    have changes nothing, and it prints "listening" only once that is true.
    Raises ``InputError`` naming ``host:port`` and why (a name that does not resolve, a port in use, an
    address not this machine's, an empty host, no family this kernel opens), with every socket it opened
    closed."""
    if not host:
        raise InputError("--host '': give the address to listen on (0.0.0.0: every IPv4 interface)")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        # An address listed twice (/etc/hosts) is bound once; dict keeps the resolver's order of preference.
        addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in found))
        for _ in range(PICK_TRIES - 1):
            with contextlib.suppress(_PickedTaken):
                return _bind_all(addresses, port)
        return _bind_all(addresses, port)
    except _Unbound as failed:
        where, exc = failed.args
        reason = exc.strerror or str(exc)
        raise InputError(
            f"--host/--port {host}:{port}: cannot listen there ({reason if where == host else f'{where}: {reason}'})"
        ) from None
    except OSError as exc:  # socket.gaierror: a name that does not resolve
        raise InputError(f"--host/--port {host}:{port}: cannot listen there ({exc.strerror or exc})") from None


class _Unbound(Exception):
    """(address, OSError): an address ``_bind_all`` could not listen on; its sockets are closed."""


class _PickedTaken(_Unbound):
    """The port the system picked for the first address is taken on a later one."""


def _bind_all(addresses: Sequence[tuple[int, tuple]], port: int) -> list[socket.socket]:
    sockets: list[socket.socket] = []
    shared = port
    where = ""
    try:
        for family, address in addresses:
            where = str(address[0])
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                continue  # a family this kernel does not open (asyncio's create_server skips it too)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((where, shared, *address[2:]))
            sock.listen()
            shared = sock.getsockname()[1]  # port 0: the others take the one the system chose for the first
    except OSError as exc:
        for sock in sockets:
            sock.close()
        picked = port == 0 and len(sockets) > 1 and exc.errno == errno.EADDRINUSE
        raise (_PickedTaken if picked else _Unbound)(where, exc) from None
    if not sockets:
        raise _Unbound(where, OSError(errno.EAFNOSUPPORT, "no address of a family this machine opens"))
    return sockets


def _authorizer(token: str | None):
    bearer = HTTPBearer(auto_error=False, description="The controller's operator token.")

    def authorize(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is None:
            return
        if credentials is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(403, "wrong bearer token")

    return authorize


def _ingest_body_spec() -> dict:
    content = {t: {"schema": {"type": "string"}} for t in NDJSON_TYPES}
    content.update({t: {"schema": {"type": "string", "format": "binary"}} for t in ARROW_TYPES})
    return {
        "requestBody": {
            "required": True,
            "content": content,
            "description": "One step record per line (NDJSON), or an Arrow IPC stream.",
        }
    }


def create_app(
    controller: Controller, ingestor: Ingestor, token: str | None = None, writers: Writers | None = None
) -> FastAPI:
    """The service over ``controller`` (whose store ``ingestor`` writes to)."""
    app = FastAPI(title="sparkgate controller", version="1", description=__doc__)
    app.router.route_class = StrictJSONRoute  # before any route: each JSON body refuses a repeated key
    app.add_middleware(BodyLimit, limit=DEFAULT_MAX_BODY)  # the records routes' limit, for every route
    authorize = _authorizer(token)
    store = controller.store

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad input; a NaN or 1e400 there cannot be serialised (a 500).
        try:
            detail = json_safe(jsonable_encoder(json_safe(exc.errors())))
        except RecursionError:  # an input nested deeper than Python recurses: name the error, not the input
            detail = [{k: v for k, v in e.items() if k not in ("input", "ctx")} for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(duckdb.Error)
    async def unavailable(request: Request, exc: duckdb.Error) -> JSONResponse:
        # As the records routes answer (in FastAPI's error field): a bare 500 reads as a bug no client retries.
        return not_committed(exc, "detail")

    ingest = ingest_router(ingestor, writers=writers)

    def permit(request: Request, replica_id: str, cost_table: str | None = None) -> None:
        """The writer routes' credential check, and the static cost table registered, if any (nothing to
        check without writers)."""
        if writers is None:
            return
        try:
            writer = writers.identify(request.headers.get("authorization"))
            writers.permit(writer, [replica_id])
            if cost_table is not None:
                writers.permit_table(writer, cost_table)
        except Refused as refused:
            raise HTTPException(refused.status, refused.reason) from None

    app.include_router(ingest)
    app.include_router(cost_table_router(store, permit))
    endpoint = next(r.endpoint for r in ingest.routes if isinstance(r, APIRoute) and r.path == "/v1/ingest")
    app.add_api_route(
        "/v1/records", endpoint, methods=["POST"], summary="Ingest step records", openapi_extra=_ingest_body_spec()
    )

    @app.get("/healthz")
    def healthz() -> dict:
        return {"ok": True, "revision": controller.state.revision}

    @app.get("/v1/policy", response_model=PolicyPayload)
    def policy() -> PolicyPayload:
        return controller.policy_payload()

    @app.get("/v1/status")
    def status() -> dict:
        return controller.status()

    @app.get("/v1/decisions")
    def decisions(
        limit: int = Query(100, ge=1, le=10_000),
        since: float | None = Query(None, allow_inf_nan=False),
        changes_only: bool = False,
    ) -> list[dict]:
        return [d.to_dict() for d in ledger.decisions(store, limit, since, changes_only)]

    @app.get("/v1/report")
    async def report(
        since: float | None = Query(None, allow_inf_nan=False), until: float | None = Query(None, allow_inf_nan=False)
    ) -> dict:
        try:
            window = Window(since, until)
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        evaluation = await run_in_threadpool(evaluate, store, window, Slice(), controller.resamples)
        return {**evaluation.report(controller.state.phase), "sources": sources(store, window, Slice())}

    @app.post("/v1/consistency")
    def consistency(body: ConsistencyReport, request: Request) -> dict:
        permit(request, body.replica_id)
        now = controller.clock()
        stored = store.record_consistency(
            [{"received_at": now, "replica_id": body.replica_id, **c.model_dump()} for c in body.checks]
        )
        return {
            "recorded": len(body.checks),
            "stored": stored,  # a retried report stores nothing again
            "mismatches": sum(c.mismatch_at is not None for c in body.checks),
        }

    @app.post("/v1/aggregates")
    def aggregates(body: AggregateReport, request: Request) -> Response:
        permit(request, body.replica_id)
        problems = (
            []
            if body.interval_end >= body.interval_start
            else [Problem("interval_end", body.interval_end, "must be >= interval_start")]
        )
        try:
            aggregate = Aggregate.from_dict(body.aggregate)
        except AggregateError as exc:
            problems += exc.problems
        if problems:
            return JSONResponse({"problems": [p.to_dict() for p in problems]}, status_code=422)
        try:
            recorded = store.record_aggregate(
                body.replica_id, body.interval_start, body.interval_end, aggregate, received_at=controller.clock()
            )
        except IntervalOverlap as exc:  # its shared labels would count twice
            return JSONResponse({"detail": str(exc), "stored_interval": list(exc.stored)}, status_code=409)
        return JSONResponse({"recorded": int(recorded), "duplicate": not recorded, "labels": aggregate.observed_labels})

    @app.get("/v1/fleet")
    def fleet(
        since: float | None = Query(None, allow_inf_nan=False), until: float | None = Query(None, allow_inf_nan=False)
    ) -> dict:
        if since is not None and until is not None and since > until:
            raise HTTPException(422, f"since={since} is after until={until}")
        try:
            reports = store.aggregates(since, until, limit=MAX_FLEET_REPORTS)
        except TooManyReports as exc:
            raise HTTPException(422, str(exc)) from None
        if not reports:
            return {"reports": 0, "replicas": []}
        return {
            "reports": len(reports),
            "replicas": sorted({r for r, _ in reports}),
            **fleet_report(merge_aggregates([a for _, a in reports])),
        }

    # ``:path``: an id may hold a slash (SGLang replicas are NAME/dpRANK); clients quote the segment.
    @app.get("/v1/requests/{request_id:path}/committed")
    def committed(request_id: str = Path(max_length=512), replica_id: str | None = None) -> dict:
        rows = store.query(
            "SELECT replica_id, mode::VARCHAR AS mode, temperature, committed_tokens FROM requests "
            "WHERE request_id = ? AND (? IS NULL OR replica_id = ?) ORDER BY replica_id, step_id",
            [request_id, replica_id, replica_id],
        ).to_pylist()
        if not rows:
            raise HTTPException(404, f"request_id={request_id!r}: no stored rows")
        return {
            "request_id": request_id,
            "replicas": sorted({r["replica_id"] for r in rows}),
            "modes": sorted({r["mode"] for r in rows}),
            "temperatures": sorted({r["temperature"] for r in rows}),
            "tokens": [t for r in rows for t in r["committed_tokens"]],
        }

    @app.get("/v1/replicas/{replica_id:path}")
    def replica(replica_id: str = Path(max_length=512)) -> dict:
        last = store.query("SELECT max(step_id) AS m FROM steps WHERE replica_id = ?", [replica_id]).column("m")
        return {"replica_id": replica_id, "next_step_id": 0 if last[0].as_py() is None else last[0].as_py() + 1}

    @app.post("/v1/rollout/{action}", dependencies=[Depends(authorize)])
    def act(body: Action, action: OperatorAction) -> dict:
        try:
            return controller.act(action, body.operator, body.note, body.revision).to_dict()
        except TransitionError as exc:
            raise HTTPException(409, str(exc)) from None

    @app.get("/metrics")
    def metrics() -> Response:
        exporter = controller.exporter
        body = exporter.metrics.exposition() if exporter is not None else b""
        return Response(body, media_type="text/plain; version=0.0.4")

    return app
