"""Request records (schema v2) from an NDJSON body to one store transaction (docs/design.md §4).

``prepare_requests`` validates every line without the database: a line is
stored whole or quarantined whole, with every problem and its bytes; a key
repeated inside the body keeps its first line. ``Store.commit_requests`` then
quarantines, under the writer lock, the lines whose key is already stored, so
a replica that re-posts what it cannot tell was acknowledged stores nothing twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkgate.collectors.batch import Quarantined, quarantine_table
from sparkgate.collectors.request_records import REQUEST_RECORD_SCHEMA, to_table, validate
from sparkgate.collectors.schema import Problem
from sparkgate.policies import json_text


@dataclass(frozen=True)
class PreparedRequests:
    """Valid rows (``rows``, with ``positions`` their line numbers) and the quarantined lines."""

    rows: pa.Table
    positions: list[int]
    quarantined: list[Quarantined]

    def without(self, stored: set[tuple[str, str]]) -> PreparedRequests:
        """The same batch with the rows whose key is in ``stored`` moved to quarantine."""
        if not stored:
            return self
        keys = list(zip(self.rows.column("replica_id").to_pylist(), self.rows.column("request_id").to_pylist()))
        keep = [key not in stored for key in keys]
        dropped = [
            Quarantined(p, key[0], None, [Problem("request_id", key[1], "already stored for this replica")], b"")
            for p, key, k in zip(self.positions, keys, keep)
            if not k
        ]
        return PreparedRequests(
            self.rows.filter(pa.array(keep)),
            [p for p, k in zip(self.positions, keep) if k],
            sorted(self.quarantined + dropped, key=lambda q: q.position),
        )

    def quarantine_table(self, source: str, received_at: float) -> pa.Table:
        return quarantine_table(self.quarantined, source, received_at)

    def summary(self) -> dict:
        return {"request_records": self.rows.num_rows, "quarantined": len(self.quarantined)}


def prepare_requests(body: bytes) -> PreparedRequests:
    """Every non-empty line of ``body`` validated (no database access; safe on any thread)."""
    valid: list[dict] = []
    positions: list[int] = []
    quarantined: list[Quarantined] = []
    seen: set[tuple[Any, Any]] = set()
    for position, line in enumerate(body.splitlines()):
        if not line.strip():
            continue
        try:
            obj = json_text.loads(line)
            problems = validate(obj)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            obj, problems = None, [Problem("line", line[:80].decode(errors="replace"), f"not a JSON object ({exc})")]
        record = obj if isinstance(obj, dict) else {}
        replica = record.get("replica_id") if isinstance(record.get("replica_id"), str) else None
        key = record.get("replica_id"), record.get("request_id")
        if not problems and key in seen:
            problems = [Problem("request_id", key[1], "appears more than once in this body")]
        if problems:
            quarantined.append(Quarantined(position, replica, None, problems, line))
            continue
        seen.add(key)
        valid.append(obj)
        positions.append(position)
    rows = to_table(valid) if valid else REQUEST_RECORD_SCHEMA.empty_table()
    return PreparedRequests(rows, positions, quarantined)
