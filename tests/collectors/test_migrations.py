"""Schema migrations: applied once, in order, each with its row; a newer store is refused."""

from __future__ import annotations

import duckdb
import pytest

from sparkgate.collectors import migrations
from sparkgate.collectors.migrations import MIGRATIONS, current_version, migrate
from sparkgate.collectors.store import Store


def test_migrations_recorded_once_and_reopen_is_idempotent(tmp_path):
    path = tmp_path / "m.duckdb"
    Store(path).close()
    with Store(path) as s:
        versions = s.query("SELECT version FROM schema_migrations").column(0).to_pylist()
    assert versions == [m[0] for m in MIGRATIONS]


def test_refuses_a_store_from_a_newer_version(tmp_path):
    path = tmp_path / "new.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_migrations VALUES (999, 'future', 0)")
    con.close()
    with pytest.raises(RuntimeError, match="999"):
        Store(path)


def test_versions_count_up_from_one_so_order_is_the_order_of_the_tuple():
    assert [number for number, _, _ in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert all(description and sql.strip() for _, description, sql in MIGRATIONS)


def test_migrate_brings_an_empty_database_to_the_latest_version_once():
    con = duckdb.connect()
    assert current_version(con) == 0
    assert migrate(con) == MIGRATIONS[-1][0]
    rows = con.execute("SELECT version, description FROM schema_migrations ORDER BY version").fetchall()
    assert rows == [(number, description) for number, description, _ in MIGRATIONS]
    assert {"steps", "requests", "depth_labels", "quarantine", "decisions", "consistency_checks", "aggregates"} <= {
        name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
    }
    assert migrate(con) == MIGRATIONS[-1][0]  # nothing pending: no second row, no error
    assert con.execute("SELECT count(*) FROM schema_migrations").fetchall()[0][0] == len(MIGRATIONS)


def test_a_failing_migration_leaves_the_store_before_it(monkeypatch):
    con = duckdb.connect()
    latest = migrate(con)
    broken = (latest + 1, "half done", "CREATE TABLE half_done (x INTEGER); SELECT * FROM no_such_table;")
    monkeypatch.setattr(migrations, "MIGRATIONS", (*MIGRATIONS, broken))
    with pytest.raises(duckdb.Error, match="no_such_table"):
        migrate(con)
    assert current_version(con) == latest
    tables = {name for (name,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert "half_done" not in tables and "steps" in tables
