"""Schema migrations: applied once, in order, each with its row; a newer store is refused."""

from __future__ import annotations

import duckdb
import pytest

from sparkgate.collectors import migrations
from sparkgate.collectors.migrations import MIGRATIONS, StoreOpenError, current_version, migrate
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
    with pytest.raises(StoreOpenError, match=r"new.duckdb: store schema version 999 is newer"):
        Store(path)


def test_what_is_not_a_store_is_refused_by_name_and_left_as_it_was(tmp_path):
    foreign = tmp_path / "other.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE orders (id INTEGER)")
    con.close()
    with pytest.raises(StoreOpenError, match=r"other.duckdb: not a sparkgate store \(it holds other tables: orders\)"):
        Store(foreign)
    con = duckdb.connect(str(foreign))
    assert con.execute("SELECT table_name FROM information_schema.tables").fetchall() == [("orders",)]
    con.close()
    text = tmp_path / "notes.duckdb"
    text.write_text("not a database\n")
    with pytest.raises(StoreOpenError, match="notes.duckdb: .*not a valid DuckDB database file"):
        Store(text)
    assert text.read_text() == "not a database\n"
    with pytest.raises(StoreOpenError, match="No such file or directory"):
        Store(tmp_path / "no-such-folder" / "x.duckdb")
    with pytest.raises(StoreOpenError, match=r"new/: names a folder, not a store file"):
        Store(f"{tmp_path}/new/")
    assert not (tmp_path / "new").exists()


def test_a_reader_of_history_does_not_make_a_store_of_an_empty_database_or_a_missing_path(tmp_path):
    blank = tmp_path / "blank.duckdb"
    duckdb.connect(str(blank)).close()
    before = blank.read_bytes()
    with pytest.raises(StoreOpenError, match=r"blank.duckdb: an empty database, not a sparkgate store; nothing was"):
        Store(blank, create=False)
    assert blank.read_bytes() == before
    with pytest.raises(StoreOpenError, match=r"missing.duckdb: no store there"):
        Store(tmp_path / "missing.duckdb", create=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blank.duckdb"]
    Store(blank).close()  # a writer makes it one
    with Store(blank, create=False) as store:
        assert store.version == MIGRATIONS[-1][0]


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


def test_migration_7_keeps_every_label_and_survives_a_crash_before_the_next_checkpoint(tmp_path):
    import subprocess
    import sys

    from sparkgate.collectors.schema import STATUSES

    path = tmp_path / "events.duckdb"
    con = duckdb.connect(str(path))
    for number, _, sql in MIGRATIONS[:6]:
        con.execute(sql)
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, description VARCHAR "
                    "NOT NULL, applied_at DOUBLE NOT NULL)")  # fmt: skip
        con.execute("INSERT INTO schema_migrations VALUES (?, 'x', 0)", [number])
    con.execute("INSERT INTO depth_labels VALUES ('r0', 1, 1.0, 'q', 'compact', 3, 'censored', 0.5, 0.4, NULL)")
    con.execute("CHECKPOINT")
    con.close()
    # Migrate, then die without a checkpoint: the next open replays migration 7 from the write-ahead log.
    update = "UPDATE depth_labels SET status = 'recovered', label = true"
    opened = f"Store({str(path)!r})"
    script = f"import os; from sparkgate.collectors.store import Store; {opened}._con.execute({update!r}); os._exit(0)"
    subprocess.run([sys.executable, "-c", script], check=True)
    with Store(path) as store:
        assert store.query("SELECT status::VARCHAR AS s, label FROM depth_labels").to_pylist() == [
            {"s": "recovered", "label": True}
        ]
        order = store.query("SELECT enum_range(NULL::label_status_v2)::VARCHAR[] AS e").to_pylist()[0]["e"]
        assert tuple(order) == STATUSES  # stored codes are indexes into the vocabulary


def test_migration_12_gives_a_store_kept_before_it_the_windowed_sums_of_its_rows(tmp_path):
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire

    path = tmp_path / "events.duckdb"
    kind2 = "SELECT count(*) AS n, sum(n) AS labels FROM {} WHERE kind = 2"
    with Store(path) as store:
        store.ingest(from_wire(synthetic_wire(60, 8, 5, "r0", seed=3)), "test")
        kept = {t: store.query(kind2.format(t)).to_pylist() for t in ("label_fine_sums", "label_group_sums")}
        # The store as version 11 left it: sums without the windowed kind.
        for table in ("label_fine_sums", "label_group_sums"):
            store.execute(f"DELETE FROM {table} WHERE kind = 2")
        store.execute("ALTER TABLE phase_spans DROP COLUMN writes")  # migration 13's
        store.execute("DROP TABLE bucket_writes")  # migration 14's
        store.execute("ALTER TABLE decisions DROP COLUMN rung")  # migration 15's
        store.execute("DELETE FROM schema_migrations WHERE version >= 12")
    assert all(rows[0]["n"] > 0 for rows in kept.values())
    with Store(path) as store:
        assert store.version >= 12
        assert {t: store.query(kind2.format(t)).to_pylist() for t in kept} == kept


def test_migration_13_counts_writes_from_zero_in_a_store_kept_before_it(tmp_path):
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire

    path = tmp_path / "events.duckdb"
    writes = "SELECT phase, writes FROM phase_spans ORDER BY ALL"
    with Store(path) as store:
        store.ingest(from_wire(synthetic_wire(20, 8, 5, "r0", seed=3)), "test")
        assert [r["writes"] for r in store.query(writes).to_pylist()] == [1]
        # The store as version 12 left it: spans without a count of writes.
        store.execute("ALTER TABLE phase_spans DROP COLUMN writes")
        store.execute("DROP TABLE bucket_writes")  # migration 14's
        store.execute("ALTER TABLE decisions DROP COLUMN rung")  # migration 15's
        store.execute("DELETE FROM schema_migrations WHERE version >= 13")
    with Store(path) as store:
        assert store.version >= 13 and [r["writes"] for r in store.query(writes).to_pylist()] == [0]
        store.ingest(from_wire(synthetic_wire(20, 8, 5, "r0", first_step=20, seed=4, ts=2e9)), "test")
        assert [r["writes"] for r in store.query(writes).to_pylist()] == [1]


def test_migration_14_counts_a_write_of_every_bucket_a_store_kept_before_it_holds(tmp_path):
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire

    path = tmp_path / "events.duckdb"
    writes = "SELECT bucket, writes FROM bucket_writes ORDER BY ALL"
    with Store(path) as store:
        store.ingest(from_wire(synthetic_wire(20, 8, 5, "r0", seed=3, ts=1e9 + 5)), "test")
        store.ingest(from_wire(synthetic_wire(20, 8, 5, "r0", first_step=20, seed=4, ts=1e9 + 25)), "test")
        assert [tuple(r.values()) for r in store.query(writes).to_pylist()] == [(1e8, 1), (1e8 + 2, 1)]
        # The store as version 13 left it: sums without a count of writes per bucket.
        store.execute("DROP TABLE bucket_writes")
        store.execute("ALTER TABLE decisions DROP COLUMN rung")  # migration 15's
        store.execute("DELETE FROM schema_migrations WHERE version >= 14")
    with Store(path) as store:
        assert store.version >= 14
        assert [tuple(r.values()) for r in store.query(writes).to_pylist()] == [(1e8, 1), (1e8 + 2, 1)]
        store.ingest(from_wire(synthetic_wire(5, 8, 5, "r0", first_step=40, seed=5, ts=1e9 + 26)), "test")
        assert [tuple(r.values()) for r in store.query(writes).to_pylist()] == [(1e8, 1), (1e8 + 2, 2)]


def test_migration_15_keeps_the_decisions_of_a_store_kept_before_it_without_a_rung(tmp_path):
    path = tmp_path / "events.duckdb"
    with Store(path) as store:
        store.record_decision(1, None, "baseline", "start", [{"rule": "start"}], 10.0, compact_fraction=0.0)
        store.record_decision(2, "baseline", "paused", "pause", [{"rule": "operator pause"}], 20.0,
                              compact_fraction=0.0, operator="ops")  # fmt: skip
        # The store as version 14 left it: decisions without their rung.
        store.execute("ALTER TABLE decisions DROP COLUMN rung")
        store.execute("DELETE FROM schema_migrations WHERE version >= 15")
    with Store(path) as store:
        assert store.version >= 15
        rows = store.query("SELECT action, phase_to, rung FROM decisions ORDER BY decided_at").to_pylist()
    assert rows == [{"action": "start", "phase_to": "baseline", "rung": None},
                    {"action": "pause", "phase_to": "paused", "rung": None}]  # fmt: skip
