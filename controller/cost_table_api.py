"""The cost-table routes of the controller's API (docs/design.md §6, adaptive).

| route | what |
|---|---|
| ``GET /v1/cost-tables`` | every stored table's provenance (no bodies), oldest first |
| ``GET /v1/cost-tables/{version}`` | one table, in the layout SGLang loads (404: unknown version) |
| ``POST /v1/cost-tables`` | a replica registers the static table it starts from (writer credentials) |

A registration is validated before anything is stored (422 naming the field),
idempotent for the same body, and refused with 409 for a version already stored
with another body.
"""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import APIRouter, HTTPException, Path, Request
from pydantic import BaseModel, Field

from sparkgate.collectors import cost_tables
from sparkgate.collectors.store import Store
from sparkgate.policies.cost_errors import CostTableError

from .json_route import StrictJSONRoute


class Registration(BaseModel):
    """``POST /v1/cost-tables``: the static table a replica starts from."""

    replica_id: str = Field(max_length=512)
    table: dict[str, Any] = Field(description="The table, in either SGLang layout, with meta.version set.")


class Permit(Protocol):
    """The writer check: raises its HTTP error unless the request's writer may post for ``replica_id`` (and
    register the static table ``cost_table``, when given)."""

    def __call__(self, request: Request, replica_id: str, cost_table: str | None = None) -> None: ...


def cost_table_router(store: Store, permit: Permit) -> APIRouter:
    router = APIRouter(route_class=StrictJSONRoute)

    @router.get("/v1/cost-tables")
    def listed() -> list[dict]:
        return [e.provenance() for e in cost_tables.entries(store)]

    @router.get("/v1/cost-tables/{version}")
    def table(version: str = Path(max_length=512)) -> dict:
        entry = cost_tables.get(store, version)
        if entry is None:
            raise HTTPException(404, f"cost table {version!r}: not stored")
        return entry.body

    @router.post("/v1/cost-tables")
    def register(body: Registration, request: Request) -> dict:
        permit(request, body.replica_id)
        from sparkgate.policies.cost_model import parse_cost_table  # torch: only when a table is registered

        try:
            entry = cost_tables.static_entry(parse_cost_table(body.table))
        except CostTableError as exc:
            raise HTTPException(422, str(exc)) from None
        permit(request, body.replica_id, entry.version)
        try:
            stored = cost_tables.add(store, entry)
        except cost_tables.VersionConflict as exc:
            raise HTTPException(409, str(exc)) from None
        except CostTableError as exc:
            raise HTTPException(422, str(exc)) from None
        return {"version": entry.version, "replica_group": entry.replica_group, "stored": stored}

    return router
