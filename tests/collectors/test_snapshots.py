"""The store's Parquet copies: exports replace what they rewrite, snapshots are readable from another process."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from sparkgate.collectors import snapshots
from sparkgate.collectors.snapshots import open_snapshot
from sparkgate.collectors.wire import from_records
from tests.collectors.strategies import compact_row, step


def test_export_is_hive_partitioned_and_reexport_does_not_duplicate(store, tmp_path):
    day = 86400.0 * 20000
    store.ingest(
        from_records(
            [
                step(1, requests=[compact_row()], ts=day + 5),
                step(2, requests=[compact_row()], ts=day + 86400 + 5, replica_id="b"),
            ]
        ),
        "t",
    )
    out = tmp_path / "export"
    assert store.export(out) == {"steps": 2, "requests": 2, "depth_labels": 8, "request_records": 0}
    store.export(out, since_ts=day + 10)  # rounds down to the day: rewrites both partitions whole
    partitions = sorted(
        p.relative_to(out / "depth_labels").as_posix() for p in (out / "depth_labels").glob("date=*/replica_id=*")
    )
    assert partitions == ["date=2024-10-04/replica_id=replica-a", "date=2024-10-05/replica_id=b"]
    count = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{out}/depth_labels/**/*.parquet', hive_partitioning=true)"
    ).fetchall()[0][0]
    assert count == 8


def test_an_export_that_dies_while_replacing_a_partition_loses_none_of_its_rows(store, tmp_path, monkeypatch):
    day = 86400.0 * 20000
    store.ingest(from_records([step(1, requests=[compact_row()], ts=day + 5)]), "t")
    out = tmp_path / "export"
    store.export(out)
    labels = f"SELECT count(*) FROM read_parquet('{out}/depth_labels/**/*.parquet', hive_partitioning=true)"
    assert duckdb.sql(labels).fetchall() == [(4,)]

    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt("killed while the old files go")

    monkeypatch.setattr(Path, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        store.export(out)
    assert duckdb.sql(labels).fetchall() == [(8,)]  # both exports' files: rows twice, none lost
    monkeypatch.undo()
    store.export(out)
    assert duckdb.sql(labels).fetchall() == [(4,)]  # the next export replaces both


def test_a_dead_writers_staging_is_removed_by_the_next_export_and_snapshot(store, tmp_path, monkeypatch):
    store.ingest(from_records([step(1, requests=[compact_row()])]), "t")
    out, snapdir = tmp_path / "export", tmp_path / "snap"

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed after staging")

    monkeypatch.setattr(snapshots, "_replace_files", killed)
    monkeypatch.setattr(Path, "rename", killed)
    for write in (lambda: store.export(out), lambda: store.snapshot(snapdir)):
        with pytest.raises(KeyboardInterrupt):
            write()
    assert list(out.glob(".staging-*")) and list(snapdir.glob(".gen-*.tmp"))
    monkeypatch.undo()
    store.export(out)
    generation = store.snapshot(snapdir)
    assert not list(out.glob(".staging-*")) and not list(snapdir.glob(".gen-*.tmp"))
    assert (snapdir / "CURRENT").read_text() == generation.name


def test_a_second_export_waits_for_the_first_to_finish_its_moves(store, tmp_path, monkeypatch):
    store.ingest(from_records([step(1, requests=[compact_row()])]), "t")
    out = tmp_path / "export"
    store.export(out)
    first_moving, release = threading.Event(), threading.Event()
    replace_files = snapshots._replace_files

    def slow(*args):
        first_moving.set()
        release.wait(10)
        replace_files(*args)

    monkeypatch.setattr(snapshots, "_replace_files", slow)
    first = threading.Thread(target=store.export, args=(out,))
    first.start()
    assert first_moving.wait(10)
    monkeypatch.setattr(snapshots, "_replace_files", replace_files)
    second = threading.Thread(target=store.export, args=(out,))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # held at the writer lock, not moving files under the first
    release.set()
    first.join(10)
    second.join(10)
    labels = f"SELECT count(*) FROM read_parquet('{out}/depth_labels/**/*.parquet', hive_partitioning=true)"
    assert duckdb.sql(labels).fetchall() == [(4,)] and not list(out.glob(".staging-*"))


def test_snapshot_is_readable_from_another_process_while_the_writer_holds_the_file(store, tmp_path):
    store.ingest(from_records([step(1, requests=[compact_row()])]), "t")
    snapdir = tmp_path / "snap"
    store.snapshot(snapdir)
    store.ingest(from_records([step(2, requests=[compact_row()])]), "t")
    generation = store.snapshot(snapdir)
    for _ in range(2):
        store.snapshot(snapdir)
    assert len(list(snapdir.glob("gen-*"))) == 2 and not generation.exists()
    code = (
        "from sparkgate.collectors.snapshots import open_snapshot; import sys; "
        "print(open_snapshot(sys.argv[1]).execute('SELECT count(*) FROM depth_labels').fetchall()[0][0])"
    )
    out = subprocess.run([sys.executable, "-c", code, str(snapdir)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "8"
    assert pq.read_table(snapdir / (snapdir / "CURRENT").read_text() / "steps.parquet").num_rows == 2
    assert open_snapshot(snapdir).execute("SELECT count(*) FROM steps").fetchall()[0][0] == 2
