"""Sums the gates read instead of the labels, kept by ingest in the rows' own transaction (docs/design.md §4).

Per ``SUM_BUCKET_S`` seconds of step time (``bucket = floor(ts / SUM_BUCKET_S)``), replica, phase and
contract of the step, four tables hold what an evaluation derives its figures from:

- ``label_fine_sums``: per kind (0 survival over observed labels, 1 conditional over labels at risk,
  2 survival over windowed labels: observed ones at depths within the row's scheduler window, see
  ``window_sql``), mode, depth, fine bin of the prediction (``FINE_BINS``) and outcome: count, Σp, Σp².
- ``label_group_sums``: per kind, request group (``hash(request_id) % REQUEST_GROUPS``), depth and
  equal-width bin, over the full-block modes (kind 2: the windowed modes): count, Σp, Σy (what the
  bootstrap resamples).
- ``label_status_sums``: per mode, depth, status and equal-width bin of S_k: count, ΣS_k and
  Σ probability (the compact view's counts and its estimated labels).
- ``request_sums``: per mode the request histograms, ``hist`` 0 ``(window, accepted)``, 1 ``(accepted,
  full_accept)`` and 2 ``(window_suggested, full_accept)``: counts.

Invariants: for every bucket, summing a table's rows over any of its keys gives exactly what the same
aggregation over that bucket's stored rows gives (counts exactly, float sums up to rounding), whatever
the batches the rows arrived in. Rows are appended per batch (a recovered label adds −1 to its censored
cell and +1 to its recovered one) and ``compact`` merges a bucket's rows once the bucket has closed, so a
reader sums a few rows per cell. ``rebuild`` recomputes buckets from the stored rows (retention, and the
migration that created the tables). ``phase_spans.writes`` counts, per (phase, contract), the transactions
that changed its sums (a batch, a recovery's move, a rebuild; not ``compact``, which changes no sum), and
``bucket_writes`` counts them per bucket.
"""

from __future__ import annotations

import math
import threading

import duckdb
import numpy as np
import pyarrow as pa

from sparkgate.collectors.registered import registered
from sparkgate.collectors.schema import MODES, STATUSES
from sparkgate.policies.binning import FINE_BINS, N_BINS, REQUEST_GROUPS
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES, WINDOWED_MODES

SUM_BUCKET_S = 10.0
_KEY = {"bucket": "BIGINT NOT NULL", "replica_id": "VARCHAR NOT NULL", "phase": "VARCHAR NOT NULL",
        "contract": "VARCHAR"}  # fmt: skip
# Per table: its key columns after ``_KEY``, and its value columns (what ``compact`` sums), with their types.
TABLES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "label_fine_sums": (
        {"kind": "TINYINT", "mode": "TINYINT", "depth": "SMALLINT", "fine": "SMALLINT", "y": "BOOLEAN"},
        {"n": "BIGINT", "sum_p": "DOUBLE", "sum_p2": "DOUBLE"},
    ),
    "label_group_sums": (
        {"kind": "TINYINT", "grp": "SMALLINT", "depth": "SMALLINT", "bin": "TINYINT"},
        {"n": "BIGINT", "sum_p": "DOUBLE", "sum_y": "BIGINT"},
    ),
    "label_status_sums": (
        {"mode": "TINYINT", "depth": "SMALLINT", "status": "TINYINT", "bin": "TINYINT"},
        {"n": "BIGINT", "sum_s": "DOUBLE", "sum_prob": "DOUBLE"},
    ),
    "request_sums": ({"mode": "TINYINT", "hist": "TINYINT", "x": "SMALLINT", "y": "SMALLINT"}, {"n": "BIGINT"}),
}
SUM_TABLES = tuple(TABLES)


# When each (phase, contract) recorded steps: the bounds that keep reads of a reference phase (baseline's
# latency, the acceptance reference) to its own span instead of the whole history.
SPANS_SQL = """CREATE TABLE phase_spans (phase VARCHAR NOT NULL, contract VARCHAR, first_ts DOUBLE NOT NULL,
    last_ts DOUBLE NOT NULL);
INSERT INTO phase_spans SELECT phase, contract, min(ts), max(ts) FROM steps GROUP BY ALL;"""
# ``writes`` counts the transactions that changed a (phase, contract)'s sums: the version a kept reference
# checks in one row, where summing the sums rows of the phase's span grew with the span.
WRITES_SQL = "ALTER TABLE phase_spans ADD COLUMN writes BIGINT NOT NULL DEFAULT 0;"
_SAME_SPAN = "p.phase = n.phase AND p.contract IS NOT DISTINCT FROM n.contract"
# ``bucket_writes`` counts, per bucket, the transactions that changed its sums (not ``compact``): the version
# of a bucket that a controller keeping its window's closed buckets checks (``controller.window_cache``).
# Every bucket with sums has a row (every label and request row is in a status or request sum).
_SUM_BUCKETS = "(SELECT bucket FROM request_sums UNION SELECT bucket FROM label_status_sums)"
BUCKETS_SQL = f"""CREATE TABLE bucket_writes (bucket BIGINT PRIMARY KEY, writes BIGINT NOT NULL);
INSERT INTO bucket_writes SELECT bucket, 1 FROM {_SUM_BUCKETS};"""


def add_spans(con: duckdb.DuckDBPyConnection, steps: str) -> None:
    """Widen each (phase, contract) span to the batch's steps (``steps``, a registered relation), and count
    the batch as a write of its sums."""
    con.execute(f"""MERGE INTO phase_spans p
        USING (SELECT phase, contract, min(ts) AS lo, max(ts) AS hi FROM {steps} GROUP BY ALL) n ON {_SAME_SPAN}
        WHEN MATCHED THEN UPDATE SET first_ts = least(p.first_ts, n.lo), last_ts = greatest(p.last_ts, n.hi),
                                     writes = p.writes + 1
        WHEN NOT MATCHED THEN INSERT VALUES (n.phase, n.contract, n.lo, n.hi, 1)""")


def _count_writes(con: duckdb.DuckDBPyConnection, pairs: str | None) -> None:
    """Count a write of the sums of each (phase, contract) of ``pairs`` (a relation with those columns;
    None: every one)."""
    where = "TRUE" if pairs is None else f"EXISTS (SELECT 1 FROM {pairs} n WHERE {_SAME_SPAN})"
    con.execute(f"UPDATE phase_spans p SET writes = p.writes + 1 WHERE {where}")


def _count_bucket_writes(con: duckdb.DuckDBPyConnection, buckets: list[int]) -> None:
    """Count a write of each bucket of ``buckets``."""
    con.execute(
        "INSERT INTO bucket_writes SELECT unnest(?::BIGINT[]), 1 "
        "ON CONFLICT (bucket) DO UPDATE SET writes = bucket_writes.writes + 1",
        [buckets],
    )


def create_sql() -> str:
    """The tables' DDL (the migration that added them)."""
    out = []
    for table, (keys, values) in TABLES.items():
        columns = [f"{c} {t}" for c, t in _KEY.items()]
        columns += [f"{c} {t} NOT NULL" for c, t in {**keys, **values}.items()]
        out.append(f"CREATE TABLE {table} ({', '.join(columns)});")
    return "\n".join(out)


def _codes(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _code(column: str, values: tuple[str, ...]) -> str:
    """The integer code of an enum or string column (its index in ``values``), for either input."""
    return f"(list_position({_codes(values)}, {column}::VARCHAR) - 1)::TINYINT"


_BUCKET = f"floor(x.ts / {SUM_BUCKET_S})::BIGINT"
_FINE = f"least(floor(x.p * {FINE_BINS}), {FINE_BINS - 1})::SMALLINT"
_PER_BIN = FINE_BINS // N_BINS


def window_sql(requests: str) -> str:
    """Per request row of ``requests``: its scheduler window ``w`` (shadow's suggestion, else the window
    verified), as a relation keyed by (replica_id, step_id, request_id). A label is windowed when its depth
    is at most ``w`` and its mode is one of ``WINDOWED_MODES``: the scheduler chose ``w`` from the
    predictions alone, and depths within it are observed in every mode, so the selection never depends on
    an outcome (compact's censored depths lie beyond ``w``)."""
    return f"""(SELECT replica_id::VARCHAR AS replica_id, step_id, request_id::VARCHAR AS request_id,
        CASE WHEN mode::VARCHAR = 'shadow' THEN window_suggested ELSE "window" END AS w FROM {requests})"""


def windowed_sql(windows: str) -> tuple[str, str]:
    """(whether label ``l`` is windowed, the LEFT JOIN of ``windows``, a ``window_sql`` relation, that it reads):
    the one definition the sums and the evaluation's reads of rows share."""
    modes = ", ".join(f"'{m}'" for m in WINDOWED_MODES)
    join = (f" LEFT JOIN {windows} w ON w.replica_id = l.replica_id::VARCHAR AND w.step_id = l.step_id "
            "AND w.request_id = l.request_id::VARCHAR")  # fmt: skip
    return f"coalesce(l.mode::VARCHAR IN ({modes}) AND l.depth <= w.w, false)", join


def _labels_sql(labels: str, steps: str, where: str, windows: str | None = None, weight: str = "1") -> list[str]:
    """Statements adding the sums of ``labels`` (joined to ``steps`` for phase and contract, and to
    ``windows``, a ``window_sql`` relation, for the windowed kind; None: no label is windowed, as for labels
    recovery settled, which lie beyond their window), each label counted ``weight`` times (an expression
    over ``l``: 1, or a recovery move's −1 and +1 in one pass): the rows' keys are computed once into a
    temporary table the three INSERTs read."""
    in_window, join = ("false", "") if windows is None else windowed_sql(windows)
    rows = f"""CREATE OR REPLACE TEMP TABLE sum_rows AS
        SELECT floor(l.ts / {SUM_BUCKET_S})::BIGINT AS bucket, ({weight})::TINYINT AS w,
               l.replica_id::VARCHAR AS replica_id, s.phase, s.contract, {_code("l.mode", MODES)} AS mode,
               l.depth, {_code("l.status", STATUSES)} AS status,
               l.survival, l.confidence, coalesce(l.label, false) AS y, l.probability,
               (hash(l.request_id::VARCHAR) % {REQUEST_GROUPS})::SMALLINT AS grp, {in_window} AS in_window
        FROM {labels} l JOIN {steps} s ON l.replica_id = s.replica_id AND l.step_id = s.step_id{join}
        WHERE {where}"""
    observed = ", ".join(str(STATUSES.index(x)) for x in STATUSES if x not in ("censored", "estimated"))
    at_risk = f"{STATUSES.index('accepted')}, {STATUSES.index('rejected')}"
    kinds = f"""WITH x AS (
            SELECT *, 0::TINYINT AS kind, survival AS p FROM sum_rows WHERE status IN ({observed})
            UNION ALL
            SELECT *, 1::TINYINT AS kind, confidence AS p FROM sum_rows WHERE status IN ({at_risk})
            UNION ALL
            SELECT *, 2::TINYINT AS kind, survival AS p FROM sum_rows WHERE in_window AND status IN ({observed}))"""
    gated = ", ".join(str(MODES.index(m)) for m in FULL_BLOCK_MODES)
    key = "x.bucket, x.replica_id, x.phase, x.contract"
    return [
        rows,
        f"""INSERT INTO label_fine_sums {kinds}
        SELECT {key}, x.kind, x.mode, x.depth, {_FINE} AS fine, x.y, sum(x.w), sum(x.w * x.p),
               sum(x.w * x.p * x.p)
        FROM x GROUP BY ALL""",
        f"""INSERT INTO label_group_sums {kinds}
        SELECT {key}, x.kind, x.grp, x.depth, ({_FINE} // {_PER_BIN})::TINYINT AS bin, sum(x.w),
               sum(x.w * x.p), coalesce(sum(x.w) FILTER (WHERE x.y), 0)
        FROM x WHERE x.kind = 2 OR x.mode IN ({gated}) GROUP BY ALL""",
        f"""INSERT INTO label_status_sums WITH x AS (SELECT *, survival AS p FROM sum_rows)
        SELECT {key}, x.mode, x.depth, x.status, ({_FINE} // {_PER_BIN})::TINYINT AS bin, sum(x.w),
               sum(x.w * x.p), coalesce(sum(x.w * x.probability), 0)
        FROM x GROUP BY ALL""",
        "DROP TABLE sum_rows",
    ]


def _requests_sql(requests: str, steps: str, where: str) -> str:
    pairs = (
        ('"window"', "accepted", "TRUE"),
        ("accepted", "full_accept", "full_accept IS NOT NULL"),
        ("window_suggested", "full_accept", "window_suggested IS NOT NULL AND full_accept IS NOT NULL"),
    )
    parts = " UNION ALL ".join(
        f"SELECT *, {h}::TINYINT AS hist, {x} AS hx, {y} AS hy FROM j WHERE {condition}"
        for h, (x, y, condition) in enumerate(pairs)
    )
    return f"""INSERT INTO request_sums
        WITH j AS (SELECT r.replica_id, r.ts, r.mode, r."window", r.accepted, r.full_accept, r.window_suggested,
                          s.phase, s.contract FROM {requests} r JOIN {steps} s
                   ON r.replica_id = s.replica_id AND r.step_id = s.step_id WHERE {where}),
        x AS ({parts})
        SELECT {_BUCKET} AS bucket, x.replica_id::VARCHAR, x.phase, x.contract, {_code("x.mode", MODES)} AS mode,
               x.hist, x.hx, x.hy, count(*)
        FROM x GROUP BY ALL"""


def add_batch(con: duckdb.DuckDBPyConnection, labels: str, requests: str, steps: str) -> None:
    """Add the sums of a batch's rows (relations registered under these names), in the caller's transaction."""
    for sql in _labels_sql(labels, steps, "TRUE", window_sql(requests)):
        con.execute(sql)
    con.execute(_requests_sql(requests, steps, "TRUE"))


_PRIVATE = threading.local()  # per thread: an in-memory database holding only empty sums tables


def batch_sums(labels: pa.Table, requests: pa.Table, steps: pa.Table) -> dict[str, pa.Table]:
    """The rows ``add_batch`` appends for a batch, per sums table, computed by the same statements in a
    private in-memory database of one thread: a staging thread takes them off the writer's transaction,
    which then only appends them with the batch's rows (``Keeper.batch``'s ``sums_written``)."""
    con = getattr(_PRIVATE, "con", None)
    if con is None:
        con = _PRIVATE.con = duckdb.connect(":memory:", config={"threads": 1, "checkpoint_threshold": "1TB"})
        con.execute(create_sql())
    try:
        with registered(con, sum_labels=labels, sum_requests=requests, sum_steps=steps):
            add_batch(con, "sum_labels", "sum_requests", "sum_steps")
            return {t: con.sql(f"SELECT * FROM {t}").to_arrow_table() for t in TABLES}
    finally:
        for t in TABLES:
            con.execute(f"DELETE FROM {t}")


def move_settled(con: duckdb.DuckDBPyConnection, settled: str, since: float) -> None:
    """Move labels recovery settled (``settled``: their rows after the update) out of their censored cells:
    −1 where they were counted censored, +1 where they count now. ``since`` bounds the steps read."""
    moved = (f"(SELECT *, 1 AS w FROM {settled} UNION ALL BY NAME "
             f"SELECT * REPLACE ('censored' AS status, NULL::BOOLEAN AS label), -1 AS w FROM {settled})")  # fmt: skip
    steps = f"(SELECT replica_id, step_id, phase, contract FROM steps WHERE ts >= {float(since)!r})"
    for sql in _labels_sql(moved, steps, "TRUE", weight="l.w"):
        con.execute(sql)
    _count_writes(
        con,
        f"(SELECT s.phase, s.contract FROM {settled} l JOIN {steps} s "
        "ON l.replica_id = s.replica_id AND l.step_id = s.step_id)",
    )


def compact(con: duckdb.DuckDBPyConnection, since_bucket: int, before_bucket: int) -> None:
    """Merge the rows of buckets ``[since_bucket, before_bucket)`` to one per cell, dropping empty cells."""
    for table, (keys, values) in TABLES.items():
        columns = ", ".join([*_KEY, *keys])
        sums = ", ".join(f"sum({v})::{t} AS {v}" for v, t in values.items())
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE merged AS SELECT {columns}, {sums} FROM {table} "
            "WHERE bucket >= ? AND bucket < ? GROUP BY ALL HAVING sum(n) <> 0",
            [since_bucket, before_bucket],
        )
        con.execute(f"DELETE FROM {table} WHERE bucket >= ? AND bucket < ?", [since_bucket, before_bucket])
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM merged")
    con.execute("DROP TABLE merged")


def rebuild(con: duckdb.DuckDBPyConnection, since_bucket: int, before_bucket: int) -> None:
    """Recompute buckets ``[since_bucket, before_bucket)`` from the stored rows."""
    for table in TABLES:
        con.execute(f"DELETE FROM {table} WHERE bucket >= ? AND bucket < ?", [since_bucket, before_bucket])
    for sql in _stored_sql(f">= {int(since_bucket)}", f"< {int(before_bucket)}"):
        con.execute(sql)
    _count_writes(con, None)
    bounds = [since_bucket, before_bucket]
    con.execute("UPDATE bucket_writes SET writes = writes + 1 WHERE bucket >= ? AND bucket < ?", bounds)
    con.execute(
        f"INSERT INTO bucket_writes SELECT bucket, 1 FROM {_SUM_BUCKETS} WHERE bucket >= ? AND bucket < ? "
        "ON CONFLICT DO NOTHING",
        bounds,
    )


def forget_before(con: duckdb.DuckDBPyConnection, cutoff_ts: float) -> None:
    """After retention deleted the rows before ``cutoff_ts``: drop the sums of the buckets wholly before it
    and recompute the one it cuts through."""
    cut = math.floor(cutoff_ts / SUM_BUCKET_S)
    for table in TABLES:
        con.execute(f"DELETE FROM {table} WHERE bucket < ?", [cut])
    con.execute("UPDATE bucket_writes SET writes = writes + 1 WHERE bucket < ?", [cut])
    rebuild(con, cut, cut + 1)


def rebuild_sql() -> str:
    """The sums of everything stored, as one script (the migration that created the tables)."""
    return "".join(f"\n{sql};" for sql in _stored_sql(">= -9223372036854775807", "< 9223372036854775807"))


def _stored_sql(low: str, high: str) -> list[str]:
    bucket = f"floor(l.ts / {SUM_BUCKET_S})"
    where = f"{bucket} {low} AND {bucket} {high}"
    requests_where = where.replace("l.ts", "r.ts")
    return [
        *_labels_sql("depth_labels", "steps", where, window_sql(f"requests r WHERE {requests_where}")),
        _requests_sql("requests", "steps", requests_where),
    ]


class Keeper:
    """Keeps one store's sums as batches commit: adds each batch, moves what recovery settled, and compacts
    buckets once they have closed (older than the newest step's bucket by two) if more than one batch
    wrote to them (a bucket written once has one row per cell already). Which buckets have rows left to
    merge is a hint held in memory: a bucket a restart forgets stays correct, only unmerged."""

    def __init__(self) -> None:
        self._writes: dict[int, int] = {}  # bucket: batches that appended to it since it was last merged

    def batch(self, con: duckdb.DuckDBPyConnection, labels: pa.Table, requests: pa.Table, steps: pa.Table,
              settled: pa.Table | None, since: float | None, sums_written: bool = False) -> None:  # fmt: skip
        """Called inside the batch's transaction, after its rows (and recovery's updates) are written.
        ``sums_written``: the batch's ``batch_sums`` rows were appended with its rows; else they are
        computed here."""
        if not steps.num_rows:
            return
        with registered(con, sum_labels=labels, sum_requests=requests, sum_steps=steps):
            if not sums_written:
                add_batch(con, "sum_labels", "sum_requests", "sum_steps")
            add_spans(con, "sum_steps")
        touched = [steps.column("ts")]
        if settled is not None and settled.num_rows and since is not None:
            with registered(con, sum_settled=settled):
                move_settled(con, "sum_settled", since)
            touched.append(settled.column("ts"))
        per = [np.unique(np.floor(ts.to_numpy() / SUM_BUCKET_S)).astype(np.int64).tolist() for ts in touched]
        _count_bucket_writes(con, sorted(set().union(*per)))
        for buckets in per:
            for b in buckets:
                self._writes[b] = self._writes.get(b, 0) + 1
        newest = math.floor(float(np.max(steps.column("ts").to_numpy())) / SUM_BUCKET_S)
        closed = sorted(b for b in self._writes if b < newest - 1)
        for low, high in _runs([b for b in closed if self._writes[b] > 1]):
            compact(con, low, high)
        for b in closed:
            del self._writes[b]


def _runs(buckets: list[int]) -> list[tuple[int, int]]:
    """Sorted buckets as ``[low, high)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for b in buckets:
        if runs and runs[-1][1] == b:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return runs
