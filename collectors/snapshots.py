"""The store's Parquet copies for other processes (docs/design.md §4): snapshots and exports.

DuckDB allows one read-write process on a file and no concurrent readers, so readers (the dashboards,
another host) read these instead. Invariants: a snapshot generation is one MVCC snapshot of every table,
and readers find the newest complete one through ``CURRENT``, replaced only after every file of the
generation is written; an export replaces each partition it writes, so re-exporting never duplicates
rows. The callers hold no lock: each function takes the store's connection and lock, and holds the lock
only while it reads. Each also holds an exclusive file lock on its directory while it writes there, so two
writers never interleave their moves, and a staging directory found under that lock was left by a writer
that died: it is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

import duckdb

from sparkgate.collectors import label_sums

# Event tables and the unix-seconds column retention and exports partition them by.
EVENT_TIME = {"steps": "ts", "requests": "ts", "depth_labels": "ts", "request_records": "finish_ts"}
EVENT_TABLES = tuple(EVENT_TIME)
SNAPSHOT_TABLES = (
    EVENT_TABLES
    + ("quarantine", "decisions", "consistency_checks", "aggregates")
    + label_sums.SUM_TABLES
    + ("phase_spans", "cost_tables")
)
# Snapshot generations kept, so a reader that opened the previous one can finish.
_KEEP_GENERATIONS = 2


def export(
    con: duckdb.DuckDBPyConnection, lock: threading.Lock, out: Path, since_ts: float | None = None
) -> dict[str, int]:
    """Write the event tables as hive-partitioned Parquet: ``OUT/TABLE/date=D/replica_id=R/*.parquet``.

    ``since_ts`` is rounded down to its UTC day so that every partition written
    is complete; each written partition replaces the previous export of it, so
    re-exporting never duplicates rows. Returns rows written per table.
    """
    out.mkdir(parents=True, exist_ok=True)
    since = None if since_ts is None else float(since_ts // 86400 * 86400)
    with _sole_writer(out, ".staging-*"):
        staging = out / f".staging-{time.time_ns()}"
        staging.mkdir()
        written = _copy_events(con, lock, staging, since)
        for partition in sorted(staging.glob("*/date=*/replica_id=*")):
            _replace_files(partition, out / partition.relative_to(staging), staging.name)
        shutil.rmtree(staging)
    return written


def _copy_events(
    con: duckdb.DuckDBPyConnection, lock: threading.Lock, staging: Path, since: float | None
) -> dict[str, int]:
    written = {}
    with lock:
        for table, column in EVENT_TIME.items():
            where = "" if since is None else f"WHERE {column} >= {since!r}"
            written[table] = con.execute(
                f"COPY (SELECT *, {_date(column)} AS date FROM {table} {where}) TO {_sql_path(staging / table)} "
                "(FORMAT parquet, PARTITION_BY (date, replica_id))"
            ).fetchall()[0][0]
    return written


@contextlib.contextmanager
def _sole_writer(directory: Path, staging: str):
    """Hold ``directory``'s writer lock (blocking until another writer is done), removing the ``staging``
    directories a dead writer left: under the lock no live writer owns one."""
    with open(directory / ".writer.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            for stale in directory.glob(staging):
                shutil.rmtree(stale, ignore_errors=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _replace_files(partition: Path, target: Path, stamp: str) -> None:
    """``target``'s files replaced by ``partition``'s: the new ones moved in first (under names of this
    export's), the old ones removed after. A crash between leaves both, rows twice but none lost, and the
    next export of the partition replaces them all; removing the old directory first would lose its rows."""
    target.mkdir(parents=True, exist_ok=True)
    old = list(target.iterdir())
    for file in sorted(partition.iterdir()):
        file.rename(target / f"{stamp}-{file.name}")
    for path in old:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def publish(con: duckdb.DuckDBPyConnection, lock: threading.Lock, root: Path) -> Path:
    """Write a consistent Parquet copy of every table and publish it atomically.

    Readers find the newest complete generation through the ``CURRENT`` file,
    which is replaced only after every file of the generation is written.
    """
    root.mkdir(parents=True, exist_ok=True)
    with _sole_writer(root, ".gen-*.tmp"):
        generation = root / f"gen-{time.time_ns()}"
        staging = root / f".{generation.name}.tmp"
        staging.mkdir()
        with lock:
            con.execute("BEGIN TRANSACTION")  # one MVCC snapshot for every table
            try:
                for table in SNAPSHOT_TABLES:
                    con.execute(f"COPY {table} TO {_sql_path(staging / f'{table}.parquet')} (FORMAT parquet)")
            finally:
                con.execute("COMMIT")
        staging.rename(generation)
        pointer = root / ".CURRENT.tmp"
        pointer.write_text(generation.name)
        os.replace(pointer, root / "CURRENT")
        for old in sorted(root.glob("gen-*"), key=lambda p: int(p.name[4:]))[:-_KEEP_GENERATIONS]:
            shutil.rmtree(old, ignore_errors=True)
    return generation


def open_snapshot(directory: str | os.PathLike) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with one view per table of the newest published snapshot."""
    root = Path(directory)
    generation = root / (root / "CURRENT").read_text().strip()
    con = duckdb.connect()
    for table in SNAPSHOT_TABLES:
        path = generation / f"{table}.parquet"
        if path.exists():  # a generation published before a table existed lacks its file
            con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet({_sql_path(path)})")
    return con


def _date(column: str) -> str:
    """UTC calendar date of a unix time column, without depending on the session time zone."""
    return f"(DATE '1970-01-01' + CAST(floor({column} / 86400) AS INTEGER))"


def _sql_path(path: Path) -> str:
    """A path as a quoted SQL string literal."""
    return "'" + str(path).replace("'", "''") + "'"
