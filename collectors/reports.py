"""What replicas report besides their steps: consistency checks and per-interval aggregates (docs/design.md
§4, §7), written and read on the store's connection.

Each writer runs inside the caller's transaction, under its lock (``Store``'s methods hold both), so a
report is stored whole or not at all; a retried report is never counted twice.
"""

from __future__ import annotations

import json
import time

import duckdb
import pyarrow as pa

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.registered import registered

CONSISTENCY_SCHEMA = pa.schema(
    [
        pa.field("received_at", pa.float64()),
        pa.field("replica_id", pa.string()),
        pa.field("request_id", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("tokens", pa.int64()),
        pa.field("mismatch_at", pa.int64()),
        pa.field("expected", pa.int64()),
        pa.field("got", pa.int64()),
    ]
)


class IntervalOverlap(ValueError):
    """A replica reported an interval that overlaps, without equalling, one it reported before."""

    def __init__(self, replica_id: str, interval: tuple[float, float], stored: tuple[float, float]):
        self.replica_id, self.interval, self.stored = replica_id, interval, stored
        super().__init__(
            f"replica {replica_id!r}: interval [{interval[0]}, {interval[1]}) overlaps its stored "
            f"report for [{stored[0]}, {stored[1]})"
        )


class TooManyReports(ValueError):
    """A span holds more aggregate reports than the caller will merge at once."""

    def __init__(self, count: int, limit: int):
        self.count, self.limit = count, limit
        super().__init__(f"{count} aggregate reports in the span exceed the limit of {limit}; narrow since/until")


def insert_consistency(con: duckdb.DuckDBPyConnection, rows: list[dict]) -> int:
    """Insert checks (``consistency_checks`` columns); returns how many were new. A check is keyed by
    (replica, kind, request, tokens compared), so a retried report counts once; but a report of a mismatch
    is never lost to an earlier one of the same key that found none (a mismatch is what the critical gate
    acts on): it replaces it, and within a body the mismatching one is kept."""
    table = pa.Table.from_pylist(
        [{c: r.get(c) for c in CONSISTENCY_SCHEMA.names} for r in rows], schema=CONSISTENCY_SCHEMA
    )
    before = con.execute("SELECT count(*) FROM consistency_checks").fetchall()[0][0]
    with registered(con, incoming_checks=table):
        con.execute(
            "INSERT INTO consistency_checks BY NAME SELECT * FROM incoming_checks "
            "QUALIFY row_number() OVER (PARTITION BY replica_id, kind, request_id, tokens "
            "ORDER BY mismatch_at IS NULL) = 1 ON CONFLICT DO NOTHING"
        )
        con.execute(
            "UPDATE consistency_checks c SET mismatch_at = i.mismatch_at, expected = i.expected, got = i.got, "
            "received_at = i.received_at FROM incoming_checks i WHERE c.replica_id = i.replica_id "
            "AND c.kind = i.kind AND c.request_id = i.request_id AND c.tokens = i.tokens "
            "AND c.mismatch_at IS NULL AND i.mismatch_at IS NOT NULL"
        )
    return int(con.execute("SELECT count(*) FROM consistency_checks").fetchall()[0][0] - before)


def insert_aggregate(
    con: duckdb.DuckDBPyConnection,
    replica_id: str,
    interval: tuple[float, float],
    aggregate: Aggregate,
    received_at: float | None,
) -> bool:
    """Insert one replica's aggregate for ``interval``; False when that report is already stored (the first
    stands). An overlapping, unequal interval of the same replica would count the labels they share twice:
    it raises ``IntervalOverlap`` having written nothing."""
    start, end = interval
    stored = con.execute(
        "SELECT interval_start, interval_end FROM aggregates WHERE replica_id = ? AND "
        "((interval_start = ? AND interval_end = ?) OR (interval_start < ? AND ? < interval_end)) "
        "ORDER BY interval_start LIMIT 2",
        [replica_id, start, end, end, start],
    ).fetchall()
    if (start, end) in stored:
        return False
    if stored:
        raise IntervalOverlap(replica_id, (start, end), stored[0])
    con.execute(
        "INSERT INTO aggregates (received_at, replica_id, interval_start, interval_end, labels, payload) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            time.time() if received_at is None else received_at,
            replica_id,
            start,
            end,
            aggregate.observed_labels,
            json.dumps(aggregate.to_dict()),
        ],
    )
    return True


def read_aggregates(
    con: duckdb.DuckDBPyConnection, since: float | None, until: float | None, limit: int | None
) -> list[tuple[str, Aggregate]]:
    """(replica_id, aggregate) of every report whose interval lies within [since, until), in arrival order;
    with ``limit``, a span holding more raises ``TooManyReports`` before any is parsed."""
    where = "(? IS NULL OR interval_start >= ?) AND (? IS NULL OR interval_end <= ?)"
    params = [since, since, until, until]
    if limit is not None:
        n = con.execute(f"SELECT count(*) FROM aggregates WHERE {where}", params).fetchall()[0][0]
        if n > limit:
            raise TooManyReports(n, limit)
    rows = con.execute(
        f"SELECT replica_id, payload FROM aggregates WHERE {where} ORDER BY received_at, replica_id, interval_start",
        params,
    ).fetchall()
    return [(r, Aggregate.from_dict(json.loads(p))) for r, p in rows]
