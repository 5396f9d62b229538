"""The DuckDB store: one file, one writer process (docs/design.md §4).

Invariants:
- ``ingest`` is one transaction: a batch's valid steps (with all their request
  rows and depth labels) and its quarantine rows are committed together or not
  at all, and ``ingest`` returns only after the commit.
- Validation and the explode (``stage``) need no access to the store, so they
  run outside the writer lock: concurrent callers, and ``ingest_stream``'s
  worker, prepare one batch while another commits, a large batch's sums
  included (in a private database of the staging thread). Only the stored-key
  check waits for the lock; a batch that repeats a key stored since staging is
  prepared again, its sums computed in the commit.
- A step is either wholly in ``steps``/``requests``/``depth_labels`` or wholly
  in ``quarantine``; a (replica_id, step_id) is stored at most once.
- Other processes never open the file: they read Parquet snapshots
  (``snapshot``, ``snapshots.open_snapshot``) or hive-partitioned exports.

The connection is shared by threads (HTTP handlers, the in-process sink); a lock
serialises its use because a DuckDB connection is not safe to use concurrently.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from sparkgate.collectors import label_sums, reports, snapshots
from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.batch import Prepared, prepare
from sparkgate.collectors.migrations import StoreOpenError, migrate
from sparkgate.collectors.recovery import recover
from sparkgate.collectors.registered import registered
from sparkgate.collectors.request_ingest import PreparedRequests
from sparkgate.collectors.snapshots import EVENT_TABLES, EVENT_TIME
from sparkgate.collectors.wire import Flat, Parsed, flatten

# A file store's write-ahead log size that starts an automatic checkpoint. Four 1,000-step batches per
# checkpoint: ingest 1.15x the rate of DuckDB's 16 MB, the deferred checkpoint included, and a restart
# replays at most this much log (docs/benchmarks.md, bench ingest).
FILE_CHECKPOINT = "64MB"
# The labels from which a batch staged beside another's commit computes its sums before the lock (``stage``):
# a 1,000-step batch (224 k labels) moves 129 ms off the lock; a 10-step one would add 8 ms of CPU to move 3.
STAGED_SUMS_FROM = 50_000


@dataclass(frozen=True)
class IngestResult:
    """What one committed batch wrote, and where it came from."""

    prepared: Prepared
    source: str

    @property
    def steps(self) -> int:
        return self.prepared.flat.steps.num_rows

    @property
    def labels(self) -> int:
        return self.prepared.labels.num_rows

    @property
    def quarantined(self) -> int:
        return len(self.prepared.quarantined)

    def summary(self) -> dict:
        return {
            "steps": self.steps,
            "requests": self.prepared.requests.num_rows,
            "depth_labels": self.labels,
            "quarantined": self.quarantined,
        }


@dataclass(frozen=True)
class Staged:
    """A batch validated and exploded as if none of its step keys were stored yet.

    ``Store.commit`` re-checks the keys under the writer lock and re-prepares the
    (rare) batch that repeats a stored key, so staging early never admits a duplicate.
    """

    parsed: Parsed
    flat: Flat  # every wire step, valid or not
    prepared: Prepared
    sums: dict[str, pa.Table] | None  # ``prepared``'s label and request sums (``label_sums.batch_sums``)


def stage(parsed: Parsed, sums_from: int | None = None) -> Staged:
    """Validate and explode ``parsed`` (no access to the store; safe on any thread); and when it holds at
    least ``sums_from`` labels, compute its sums too (``label_sums.batch_sums``), so the commit only appends
    them. That shortens the writer lock's hold where the staging thread runs beside another batch's commit,
    at the price of the sums' copy: 1.1x their CPU on a large batch, and a fixed ~10 ms that a small one
    would pay for nothing (``STAGED_SUMS_FROM``)."""
    flat = flatten(parsed.wire)
    prepared = prepare(parsed, None, flat)
    labels, steps = prepared.labels, prepared.flat.steps
    early = sums_from is not None and steps.num_rows > 0 and labels.num_rows >= sums_from
    return Staged(parsed, flat, prepared, label_sums.batch_sums(labels, prepared.requests, steps) if early else None)


class Store:
    """A DuckDB file holding the event tables; migrates it on open (``StoreOpenError`` when it cannot)."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None, create: bool = True):
        """``threads`` caps DuckDB's worker threads (None: one per core), for processes that share cores.
        Without ``create`` the path must already hold a store (commands that read history: ``report``,
        ``backtest``, ``export``, ``prune``); an older one is still migrated, so its queries can run."""
        self.path = Path(path)
        config: dict[str, str | bool | int | float | list[str]] = {"threads": threads} if threads else {}
        # No write-ahead log to bound in memory: an in-memory store's automatic checkpoints only compress what
        # was appended, and took four fifths of each commit's time in a simulated rollout. A file store
        # checkpoints once its log passes FILE_CHECKPOINT: a 1,000-step batch logs about 15 MB, so DuckDB's
        # default (16 MB) checkpointed every other commit.
        config["checkpoint_threshold"] = "1TB" if str(self.path) == ":memory:" else FILE_CHECKPOINT
        if str(path).endswith(("/", os.sep)):  # Path() drops the slash, and DuckDB would make a file of it
            raise StoreOpenError(f"{path}: names a folder, not a store file")
        if not create and str(self.path) != ":memory:" and not self.path.is_file():
            raise StoreOpenError(f"{self.path}: no store there")
        try:
            self._con = duckdb.connect(str(self.path), config=config)
        except duckdb.IOException as exc:  # not a DuckDB file, a directory, no such folder, locked by a process
            raise StoreOpenError(f"{self.path}: {str(exc).splitlines()[0].removeprefix('IO Error: ')}") from exc
        self._lock = threading.Lock()
        self._sums = label_sums.Keeper()
        try:
            self.version = migrate(self._con, create)
        except StoreOpenError as exc:
            self._con.close()
            raise StoreOpenError(f"{self.path}: {exc}") from None

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def checkpoint(self) -> None:
        """Write the log into the file now, as an automatic checkpoint would later (a benchmark counts it in
        the ingest it defers)."""
        with self._lock:
            self._con.execute("CHECKPOINT")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction on the writer connection, rolled back on any error (the caller holds the lock)."""
        self._con.execute("BEGIN TRANSACTION")
        try:
            yield
            self._con.execute("COMMIT")
        except BaseException as exc:
            try:
                self._con.execute("ROLLBACK")
            except duckdb.Error as rollback:
                # A failed commit (a full disk) can leave no transaction to roll back; the cause is the
                # first error, which a failed ROLLBACK must not replace.
                exc.add_note(f"(rolling back also failed: {rollback})")
            raise

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        """Run a read query in the writer process and return an Arrow table."""
        with self._lock:
            return self._con.sql(sql, params=params or None).to_arrow_table()

    def execute(self, sql: str, params: list | None = None) -> None:
        """Run one write statement in its own transaction, committed before this returns."""
        with self._lock, self._transaction():
            self._con.execute(sql, params or [])

    def counts(self) -> dict[str, int]:
        """Row counts of the event and quarantine tables."""
        with self._lock:
            return {
                t: self._con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                for t in EVENT_TABLES + ("quarantine",)
            }

    def _stored_mask(self, steps: pa.Table) -> np.ndarray:
        keys = pa.table(
            {
                "i": pa.array(np.arange(steps.num_rows)),
                "replica_id": steps.column("replica_id"),
                "step_id": steps.column("step_id"),
            }
        )
        with registered(self._con, incoming_keys=keys):
            hits = self._con.execute(
                "SELECT k.i FROM incoming_keys k JOIN steps s ON s.replica_id = k.replica_id AND s.step_id = k.step_id"
            ).fetchall()
        mask = np.zeros(steps.num_rows, dtype=bool)
        mask[[i for (i,) in hits]] = True
        return mask

    def ingest(self, parsed: Parsed, source: str, sums_before_lock: bool = False) -> IngestResult:
        """Validate ``parsed`` and commit it as one transaction; raises (having written nothing) on a
        database error. Invalid records are committed to ``quarantine`` in the same transaction.
        ``sums_before_lock``: compute a large batch's sums before waiting for the writer lock (``stage``), for
        callers that may commit concurrently (HTTP handlers)."""
        return self.commit(stage(parsed, STAGED_SUMS_FROM if sums_before_lock else None), source)

    def ingest_stream(self, batches: Iterable[tuple[Parsed, str]]) -> Iterator[IngestResult]:
        """Commit each (batch, source) in order, one transaction each, yielding after each commit.

        A worker thread stages batch i+1, a large one's sums included, while
        batch i commits; DuckDB releases the GIL while it works, so the two
        overlap on two cores. Batches are pulled in the caller's thread, one
        ahead of the commits, so a read stays interruptible; the price is that
        batch i commits only once batch i+1 has been read, so a source that
        waits for input (a pipe) should use ``ingest``.
        When the source fails, the batches read before it are committed first.
        """
        batches = iter(batches)
        with ThreadPoolExecutor(1, thread_name_prefix="sparkgate-stage") as pool:
            previous = None
            while True:
                try:
                    item = next(batches, None)
                except Exception:
                    if previous is not None:
                        yield self.commit(previous[0].result(), previous[1])
                    raise
                current = None if item is None else (pool.submit(stage, item[0], STAGED_SUMS_FROM), item[1])
                if previous is not None:
                    yield self.commit(previous[0].result(), previous[1])
                if current is None:
                    return
                previous = current

    def commit(self, staged: Staged, source: str) -> IngestResult:
        """Commit a staged batch as one transaction (see ``ingest``)."""
        with self._lock:
            stored = self._stored_mask(staged.flat.steps)
            repeats = stored.any()  # a key stored since staging: prepared again, and its sums computed here
            prepared = prepare(staged.parsed, stored, staged.flat) if repeats else staged.prepared
            sums = None if repeats else staged.sums
            tables = {
                "steps": prepared.flat.steps,
                "requests": prepared.requests,
                "depth_labels": prepared.labels,
                "quarantine": prepared.quarantine_table(source, time.time()),
                **(sums or {}),
            }

            def then() -> None:
                # Labels the batch settles (its own censored ones, or earlier rows'), and the sums the
                # evaluation reads, in the same transaction.
                settled = recover(self._con, prepared.requests)
                self._sums.batch(self._con, prepared.labels, prepared.requests, prepared.flat.steps,
                                 settled.labels if settled else None, settled.since if settled else None,
                                 sums is not None)  # fmt: skip

            self._insert(tables, then)
        return IngestResult(prepared, source)

    def _insert(self, tables: dict[str, pa.Table], then: Callable[[], object] | None = None) -> None:
        """Insert every non-empty table, then run ``then``, in one transaction (the caller holds the lock)."""
        with self._transaction():
            for name, table in tables.items():
                if table.num_rows:
                    with registered(self._con, incoming=table):
                        self._con.execute(f"INSERT INTO {name} BY NAME SELECT * FROM incoming")
            if then is not None:
                then()

    def commit_requests(self, prepared: PreparedRequests, source: str) -> PreparedRequests:
        """Commit request records (``collectors.request_ingest``) as one transaction: the valid ones not yet
        stored, and quarantine rows for the rest. Returns what was committed."""
        with self._lock:
            with registered(self._con, incoming_keys=prepared.rows.select(["replica_id", "request_id"])):
                stored = self._con.execute(
                    "SELECT k.replica_id, k.request_id FROM incoming_keys k JOIN request_records r "
                    "ON r.replica_id = k.replica_id AND r.request_id = k.request_id"
                ).fetchall()
            prepared = prepared.without(set(stored))
            tables = {"request_records": prepared.rows, "quarantine": prepared.quarantine_table(source, time.time())}
            self._insert(tables)
        return prepared

    def delete_before(self, cutoff_ts: float) -> dict[str, int]:
        """Retention: drop events, quarantine rows received and aggregates ending before ``cutoff_ts``, atomically."""
        deleted = {}
        with self._lock, self._transaction():
            for table, column in list(EVENT_TIME.items()) + [
                ("quarantine", "received_at"),
                ("aggregates", "interval_end"),
            ]:
                deleted[table] = self._con.execute(f"DELETE FROM {table} WHERE {column} < ?", [cutoff_ts]).fetchall()[
                    0
                ][0]
            label_sums.forget_before(self._con, cutoff_ts)
        return deleted

    def export(self, out_dir: str | os.PathLike, since_ts: float | None = None) -> dict[str, int]:
        """The event tables as hive-partitioned Parquet (``snapshots.export``); rows written per table."""
        return snapshots.export(self._con, self._lock, Path(out_dir), since_ts)

    def snapshot(self, directory: str | os.PathLike) -> Path:
        """A consistent Parquet copy of every table, published atomically (``snapshots.publish``)."""
        return snapshots.publish(self._con, self._lock, Path(directory))

    def max_step_ids(self) -> dict[str, int]:
        """The highest stored step_id per replica (producers resume numbering from it)."""
        rows = self.query("SELECT replica_id, max(step_id) AS m FROM steps GROUP BY replica_id")
        return dict(zip(rows.column("replica_id").to_pylist(), rows.column("m").to_pylist()))

    def record_decision(
        self,
        revision: int,
        phase_from: str | None,
        phase_to: str,
        action: str,
        reasons: list[dict],
        decided_at: float | None = None,
        *,
        compact_fraction: float | None = None,
        outcome: str | None = None,
        operator: str | None = None,
        contract: str | None = None,
        rung: str | None = None,
    ) -> None:
        """Persist a rollout decision with its reasons (committed before this returns)."""
        with self._lock:
            self._con.execute(
                "INSERT INTO decisions (decided_at, revision, phase_from, phase_to, action, reasons, "
                "compact_fraction, outcome, operator, contract, rung) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    time.time() if decided_at is None else decided_at,
                    revision,
                    phase_from,
                    phase_to,
                    action,
                    json.dumps(reasons),
                    compact_fraction,
                    outcome,
                    operator,
                    contract,
                    rung,
                ],
            )

    def record_consistency(self, rows: list[dict]) -> int:
        """Persist greedy-replay / state checks reported by replicas, all or none, as one transaction; returns
        how many were new (``reports.insert_consistency``: a retried report counts once)."""
        with self._lock, self._transaction():
            return reports.insert_consistency(self._con, rows)

    def record_aggregate(
        self,
        replica_id: str,
        interval_start: float,
        interval_end: float,
        aggregate: Aggregate,
        received_at: float | None = None,
    ) -> bool:
        """Persist one replica's aggregate for an interval (committed before this returns).

        A report is keyed by (replica, interval): a retry of one already stored is
        not counted twice and returns False (the first report stands). A different
        interval of the same replica that overlaps a stored one would count the
        labels they share twice, so it raises ``IntervalOverlap`` and writes nothing.
        """
        with self._lock, self._transaction():
            interval = (interval_start, interval_end)
            return reports.insert_aggregate(self._con, replica_id, interval, aggregate, received_at)

    def aggregates(
        self, since: float | None = None, until: float | None = None, limit: int | None = None
    ) -> list[tuple[str, Aggregate]]:
        """(replica_id, aggregate) of every report whose interval lies within [since, until).

        With ``limit``, a span holding more reports raises ``TooManyReports`` before
        any is parsed: the caller asks for a narrower span instead of a slow answer.
        """
        with self._lock:
            return reports.read_aggregates(self._con, since, until, limit)
