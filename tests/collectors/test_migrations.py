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


def test_migration_4_keeps_one_row_per_consistency_check(monkeypatch):
    con = duckdb.connect()
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[:3])
    assert migrate(con) == 3
    row = "(?, 'r0', 'req-1', 'greedy_replay', 12, NULL, NULL, NULL)"
    for received_at in (1.0, 2.0):  # a report stored twice by a retry before checks were keyed
        con.execute(f"INSERT INTO consistency_checks VALUES {row}", [received_at])
    con.execute("INSERT INTO consistency_checks VALUES (3.0, 'r0', 'req-1', 'state_rollback', 12, 4, 1, 2)")
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS)
    assert migrate(con) == MIGRATIONS[-1][0]
    kept = con.execute("SELECT kind, received_at FROM consistency_checks ORDER BY kind").fetchall()
    assert kept == [("greedy_replay", 1.0), ("state_rollback", 3.0)]
