"""The ``cost_tables`` table: every cost table a fleet served, by version (docs/design.md §4).

A replica group is named by the static table its replicas start from (a table
is measured per hardware and model, so its version names both). A static table
enters when a replica registers it; the controller's adaptive update adds
versions fitted from that group's steps, each naming its parent, the window it
was fitted on and how well it and its parent predicted held-out steps.

Invariants: a version is written once; the same version registered again with
the same body is a no-op, with another body an error (two tables under one name
would make every step's ``cost_table_version`` ambiguous).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import duckdb

from sparkgate.collectors.store import Store
from sparkgate.policies.cost_errors import CostTableError

if TYPE_CHECKING:
    from sparkgate.policies.cost_model import CostTable


class Source(StrEnum):
    STATIC = "static"  # measured offline (the profiler), registered by the replicas that start from it
    ONLINE = "online"  # fitted by the controller from live steps


class VersionConflict(CostTableError):
    """A version already stored with another body."""


@dataclass(frozen=True)
class TableEntry:
    """One stored table and its provenance; ``body`` is the table's JSON (``CostTable.to_json_dict``)."""

    version: str
    replica_group: str
    parent: str | None
    source: str
    created_at: float
    body: dict[str, Any]
    fitted_since: float | None = None
    fitted_until: float | None = None
    fitted_steps: int | None = None
    heldout_steps: int | None = None
    error_parent: float | None = None
    error_candidate: float | None = None

    def table(self) -> CostTable:
        from sparkgate.policies.cost_model import parse_cost_table  # torch: only where a table is read

        return parse_cost_table(self.body)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def provenance(self) -> dict[str, Any]:
        """``to_dict`` without the body: what listings show."""
        return {k: v for k, v in self.to_dict().items() if k != "body"}


_COLUMNS = (
    "version, replica_group, parent, source, created_at, body, fitted_since, fitted_until, fitted_steps, "
    "heldout_steps, error_parent, error_candidate"
)


def static_entry(table: CostTable, now: float | None = None) -> TableEntry:
    """The entry of a table a replica starts from; its version is required (it names the group)."""
    version = table.meta.version
    if not version:
        raise CostTableError("meta.version: a registered table needs a version (it names its replica group)")
    return TableEntry(version, version, None, Source.STATIC, time.time() if now is None else now, table.to_json_dict())


def add(store: Store, entry: TableEntry) -> bool:
    """Store ``entry``; returns False when that version is already stored with the same body. Raises
    ``VersionConflict`` when it is stored with another, and ``CostTableError`` for a body that is no table."""
    entry.table()  # validated before anything is written
    if get(store, entry.version) is None:
        row = entry.to_dict()
        row["body"] = json.dumps(entry.body, sort_keys=True)
        names = [c.strip() for c in _COLUMNS.split(",")]
        try:
            store.execute(
                f"INSERT INTO cost_tables ({_COLUMNS}) VALUES ({', '.join('?' * len(names))})", [row[n] for n in names]
            )
            return True
        except duckdb.ConstraintException:
            pass  # stored since the look (replicas of a group register their table at once): compare with it
    known = get(store, entry.version)
    assert known is not None, "a version whose insert conflicted is stored"
    if known.body != entry.body:
        raise VersionConflict(f"version {entry.version!r}: already stored with another table")
    return False


def _entry(row: dict[str, Any]) -> TableEntry:
    return TableEntry(**{**row, "body": json.loads(row["body"])})


def get(store: Store, version: str) -> TableEntry | None:
    rows = store.query(f"SELECT {_COLUMNS} FROM cost_tables WHERE version = ?", [version]).to_pylist()
    return _entry(rows[0]) if rows else None


def entries(store: Store, replica_group: str | None = None) -> list[TableEntry]:
    """Stored tables, oldest first (one group's, or all)."""
    where, params = ("WHERE replica_group = ?", [replica_group]) if replica_group else ("", [])
    sql = f"SELECT {_COLUMNS} FROM cost_tables {where} ORDER BY created_at, version"
    return [_entry(r) for r in store.query(sql, params).to_pylist()]
