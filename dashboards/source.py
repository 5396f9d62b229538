"""Where the dashboard reads from, without ever holding the writer's DuckDB lock (docs/design.md §4).

Three sources:

- ``--snapshot-dir DIR``: the Parquet snapshots a controller (``serve
  --snapshot-dir``) or collector publishes; read through ``open_snapshot``.
- ``--db FILE``: a private copy of the DuckDB file (and its WAL) opened
  read-only, so the writer can keep or take its lock at any time.
- ``--controller URL``: the controller's HTTP API (state, ledger and the
  window report only; figures that need raw rows say so).

Store readers are duck-typed ``collectors.store.Store`` objects (a ``query``
method returning Arrow), so the controller's own ``evaluate.evaluate`` and
``ledger`` functions run on them unchanged and the dashboard shows exactly the
figures the controller decides on. ``token`` changes whenever the underlying
data does, and keys every cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import duckdb
import httpx
import pyarrow as pa

from sparkgate.collectors.schema import MODES, STATUSES
from sparkgate.collectors.snapshots import open_snapshot

# Parquet keeps enums as plain strings; the controller's queries use enum_code, so the
# views put the store's enum types back (declared in the order of MODES / STATUSES).
_ENUMS = {"verify_mode": MODES, "label_status": STATUSES}
_ENUM_COLUMNS = {"requests": {"mode": "verify_mode"}, "depth_labels": {"mode": "verify_mode", "status": "label_status"}}
_COPY_ATTEMPTS = 3


class NoData(Exception):
    """Nothing to read yet; the message tells the operator what to run."""


class SourceError(Exception):
    """The source cannot be read; the message says why and what to try."""


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class StoreReader:
    """Read-only queries over a DuckDB connection that no writer shares."""

    kind: Literal["store"] = "store"

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        token: str,
        label: str,
        keep: object = None,
        plain: dict[str, str] | None = None,
    ):
        self._con, self.token, self.label = con, token, label
        self._keep = keep  # e.g. the temporary directory holding a private copy
        self._plain = plain or {}

    def plain(self, table: str) -> str:
        """The table with its enum columns as plain strings: cheaper to scan than the enum-typed view
        of a snapshot, for queries that do not need ``enum_code``."""
        return self._plain.get(table, table)

    def query(self, sql: str, params: list | None = None) -> pa.Table:
        # A cursor per call: one DuckDB connection must not run two queries at once,
        # and several browser sessions share this reader.
        cursor = self._con.cursor()
        try:
            return cursor.sql(sql, params=params or None).to_arrow_table()
        finally:
            cursor.close()


def snapshot_token(directory: str | os.PathLike) -> str:
    """The generation a snapshot directory publishes now; raises ``NoData`` before the first one."""
    pointer = Path(directory) / "CURRENT"
    if not pointer.is_file():
        raise NoData(
            f"No snapshot has been published in {directory} yet. Run `sparkgate serve --db FILE "
            f"--snapshot-dir {directory}` (it publishes after each evaluation) or `sparkgate collect "
            f"--snapshot-dir {directory}`, then reload."
        )
    return pointer.read_text().strip()


def open_snapshot_reader(directory: str | os.PathLike) -> StoreReader:
    while True:  # a generation published while the views were created: take the newer one
        token = snapshot_token(directory)
        con = open_snapshot(directory)
        if snapshot_token(directory) == token:
            break
    for name, values in _ENUMS.items():
        con.execute(f"CREATE TYPE {name} AS ENUM ({', '.join(map(_literal, values))})")
    for table, columns in _ENUM_COLUMNS.items():
        casts = ", ".join(f"{c}::{t} AS {c}" for c, t in columns.items())
        con.execute(f"ALTER VIEW {table} RENAME TO {table}_parquet")
        con.execute(f"CREATE VIEW {table} AS SELECT * REPLACE ({casts}) FROM {table}_parquet")
    # The ledger orders decisions by rowid (insertion order), which a Parquet view lacks; the snapshot
    # copies the table in insertion order, so the row number within the file is that order.
    decisions = _literal(str(Path(directory) / token / "decisions.parquet"))
    con.execute(
        f"CREATE OR REPLACE VIEW decisions AS SELECT * EXCLUDE (file_row_number), file_row_number AS rowid "
        f"FROM read_parquet({decisions}, file_row_number = true)"
    )
    # Tokens key caches shared by every source the server ever opened: make them unique per path.
    return StoreReader(
        con,
        f"{Path(directory).resolve()}#{token}",
        f"snapshot {directory} ({token})",
        plain={table: f"{table}_parquet" for table in _ENUM_COLUMNS},
    )


def db_token(path: str | os.PathLike) -> str:
    """Changes whenever the file or its WAL does; raises ``NoData`` when the file does not exist."""
    path = Path(path)
    if not path.is_file():
        raise NoData(
            f"{path} does not exist yet. Start the controller on it (`sparkgate serve --db {path}`) "
            f"or ingest records (`sparkgate ingest --db {path} FILE.ndjson`), then reload."
        )
    parts = []
    for p in (path, Path(f"{path}.wal")):
        if p.exists():
            stat = p.stat()
            parts.append(f"{stat.st_mtime_ns}:{stat.st_size}")
    return "/".join(parts)


def open_db_copy(path: str | os.PathLike) -> StoreReader:
    """Copy the file and its WAL, open the copy read-only. A copy taken while the writer checkpoints
    can be torn; DuckDB's block checksums catch that on open, so the copy is retried."""
    path = Path(path)
    error = None
    for _ in range(_COPY_ATTEMPTS):
        token = db_token(path)
        tmp = tempfile.TemporaryDirectory(prefix="sparkgate-dashboard-")
        copy = Path(tmp.name) / "store.duckdb"
        shutil.copyfile(path, copy)
        if Path(f"{path}.wal").exists():
            shutil.copyfile(f"{path}.wal", f"{copy}.wal")
        try:
            con = duckdb.connect(str(copy), read_only=True)
            con.execute("SELECT count(*) FROM steps").fetchall()
        except duckdb.Error as exc:
            tmp.cleanup()
            error = exc
            continue
        return StoreReader(con, f"{path.resolve()}#{token}", f"copy of {path}", keep=tmp)
    raise SourceError(
        f"{path}: could not read a consistent copy ({error}). For a store a controller is "
        "writing, use --snapshot-dir (serve --snapshot-dir) or --controller."
    )


class ControllerClient:
    """The controller's HTTP API: ``/v1/status``, ``/v1/decisions`` and ``/v1/report``."""

    kind: Literal["controller"] = "controller"
    token = "api"  # API answers change without a version to key on; they are cached briefly instead

    def __init__(self, url: str, timeout: float = 30.0):
        self.url, self.label = url.rstrip("/"), f"controller {url}"
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def get(self, path: str, **params) -> dict | list:
        try:
            response = self._http.get(path, params={k: v for k, v in params.items() if v is not None})
        except httpx.HTTPError as exc:
            raise SourceError(f"{self.url}{path}: {exc}. Is `sparkgate serve` running there?") from None
        if response.status_code >= 400:
            raise SourceError(f"{self.url}{path}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json()


@dataclass(frozen=True)
class SourceSpec:
    """What the operator asked for on the command line (exactly one field set)."""

    db: str | None = None
    snapshot_dir: str | None = None
    controller: str | None = None

    def __post_init__(self) -> None:
        if sum(v is not None for v in (self.db, self.snapshot_dir, self.controller)) != 1:
            raise ValueError("give exactly one of --db FILE, --snapshot-dir DIR or --controller URL")

    def token(self) -> str:
        """Cheap: tells whether the data changed since a reader was opened."""
        if self.snapshot_dir is not None:
            return snapshot_token(self.snapshot_dir)
        if self.db is not None:
            return db_token(self.db)
        return "api"

    def open(self) -> StoreReader | ControllerClient:
        if self.snapshot_dir is not None:
            return open_snapshot_reader(self.snapshot_dir)
        if self.db is not None:
            return open_db_copy(self.db)
        assert self.controller is not None, "__post_init__ requires exactly one source"
        return ControllerClient(self.controller)
