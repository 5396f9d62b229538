"""The ingest-time sums (collectors.label_sums) always equal sums recomputed from the stored rows."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors import label_sums
from sparkgate.collectors.schema import MODES, STATUSES
from sparkgate.collectors.store import Store, stage
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES, WINDOWED_MODES


def _cells(store: Store) -> dict[str, list]:
    """Every sums table, summed per cell, as sorted rows (floats rounded: summation order differs)."""
    out = {}
    for table, (keys, values) in label_sums.TABLES.items():
        columns = ", ".join(["bucket", "replica_id", "phase", "contract", *keys])
        sums = ", ".join(f"round(sum({v}), 6) AS {v}" for v in values)
        rows = store.query(f"SELECT {columns}, {sums} FROM {table} GROUP BY ALL HAVING sum(n) <> 0 ORDER BY ALL")
        out[table] = rows.to_pylist()
    return out


def _recomputed(store: Store) -> dict[str, list]:
    with store._lock:
        store._con.execute("BEGIN TRANSACTION")
        for table in label_sums.TABLES:
            store._con.execute(f"DELETE FROM {table}")
        store._con.execute(label_sums.rebuild_sql())
    try:
        return _cells(store)
    finally:
        with store._lock:
            store._con.execute("ROLLBACK")


def _by_phase(cells: dict[str, list]) -> dict[str, list]:
    """``_cells`` split by phase: what a reference of that phase reads."""
    return {p: [(t, r) for t, rows in cells.items() for r in rows if r["phase"] == p] for p in ("shadow", "canary")}


def _by_bucket(cells: dict[str, list]) -> dict[int, list]:
    """``_cells`` split by bucket: what a kept window's bucket holds."""
    out: dict[int, list] = {}
    for t, rows in cells.items():
        for r in rows:
            out.setdefault(r["bucket"], []).append((t, r))
    return out


def _bucket_writes(store: Store) -> dict[int, int]:
    rows = store.query("SELECT bucket, writes FROM bucket_writes").to_pylist()
    return {r["bucket"]: r["writes"] for r in rows}


def _writes(store: Store) -> dict[str, int]:
    rows = store.query("SELECT phase, sum(writes)::BIGINT AS w FROM phase_spans GROUP BY ALL").to_pylist()
    return {r["phase"]: r["w"] for r in rows}


def _wire(steps: int, first: int, seed: int, replica: str, phase: str, ts: float) -> pa.Table:
    wire = synthetic_wire(steps, 6, 5, replica, first_step=first, seed=seed, ts=ts, continuing=True)
    return wire.set_column(wire.schema.get_field_index("phase"), "phase", pa.array([phase] * steps))


@settings(max_examples=12, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 30), min_size=1, max_size=6),
    spacing=st.sampled_from([0.01, 0.7, 4.0]),
    seed=st.integers(0, 1000),
    early=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_sums_equal_a_recount_of_the_stored_rows_however_the_rows_arrived(cuts, spacing, seed, early):
    # Requests continue across batches (recovery moves labels between cells of earlier buckets), steps
    # are spread over many buckets, two replicas and two phases interleave, and closed buckets compact;
    # each batch's sums are computed in its commit or beforehand, apart from the store (``early``).
    with Store(":memory:") as store:
        first = 0
        for i, steps in enumerate(cuts):
            for j, replica in enumerate(("a", "b")):
                wire = _wire(steps, first, seed + i, replica, ("shadow", "canary")[i % 2], 1e9 + first * spacing)
                before = _cells(store)
                cells, writes, buckets = _by_phase(before), _writes(store), _bucket_writes(store)
                staged = stage(from_wire(wire), sums_from=0 if early[2 * i + j] else None)
                assert store.commit(staged, "test").quarantined == 0
                # A phase whose sums moved (the batch's own, or an earlier one's through recovery) counts a
                # write: the version a kept reference checks (controller.references); so does each bucket
                # whose sums moved, the version a kept window checks (controller.window_cache).
                after = _cells(store)
                moved = [p for p, c in _by_phase(after).items() if c != cells[p]]
                assert all(_writes(store)[p] > writes.get(p, 0) for p in moved) and moved
                was, now = _by_bucket(before), _by_bucket(after)
                moved_buckets = [b for b in {*was, *now} if was.get(b) != now.get(b)]
                assert all(_bucket_writes(store)[b] > buckets.get(b, 0) for b in moved_buckets) and moved_buckets
            first += steps
        assert _cells(store) == _recomputed(store)
        spans = "SELECT phase, contract, {} FROM {} GROUP BY ALL ORDER BY ALL"
        kept = store.query(spans.format("min(first_ts) AS lo, max(last_ts) AS hi", "phase_spans")).to_pylist()
        assert kept == store.query(spans.format("min(ts) AS lo, max(ts) AS hi", "steps")).to_pylist()


def test_closed_buckets_hold_one_row_per_cell():
    with Store(":memory:") as store:
        for i in range(60):  # 60 small batches, 0.5 s apart: 30 s of steps
            store.ingest(from_wire(_wire(1, i, i, "a", "shadow", 1e9 + i * 0.5)), "test")
        recovered = store.query("SELECT count(*) AS n FROM depth_labels WHERE status = 'recovered'").to_pylist()
        assert recovered[0]["n"] > 0  # recovery moved labels between cells of earlier buckets
        closed = 1e9 // label_sums.SUM_BUCKET_S  # the first bucket has closed; the newest ones may not have
        for table, (keys, _) in label_sums.TABLES.items():
            columns = ", ".join(["bucket", "replica_id", "phase", "contract", *keys])
            rows = store.query(
                f"SELECT max(c) AS most FROM (SELECT count(*) AS c FROM {table} WHERE bucket = {closed} "
                f"GROUP BY {columns})"
            ).to_pylist()
            assert rows[0]["most"] == 1, table
        assert _cells(store) == _recomputed(store)


def test_retention_keeps_the_sums_equal_to_the_rows_it_keeps():
    with Store(":memory:") as store:
        for i in range(6):
            store.ingest(from_wire(_wire(20, i * 20, i, "a", "shadow", 1e9 + i * 20 * 0.7)), "test")
        writes, buckets = _writes(store), _bucket_writes(store)
        store.delete_before(1e9 + 28.1)  # cuts through a batch and a bucket
        assert _writes(store)["shadow"] > writes["shadow"]
        # The buckets it dropped and the one it recomputed count a write; those after it do not.
        now = _bucket_writes(store)
        assert all((now[b] > w) == (b <= (1e9 + 28.1) // 10) for b, w in buckets.items())
        assert store.query("SELECT min(ts) AS t FROM depth_labels").to_pylist()[0]["t"] >= 1e9 + 28.1
        assert _cells(store) == _recomputed(store)
        assert store.query("SELECT min(bucket) AS b FROM label_fine_sums").to_pylist()[0]["b"] == (1e9 + 28.1) // 10


def test_sums_staged_on_concurrent_threads_are_each_their_own_batchs():
    """Each staging thread computes sums in a database of its own: four threads staging at once, then
    committing in any order, leave the sums a recount of the rows gives."""
    wires = [_wire(30, 100 * k, k, f"r{k}", "shadow", 1e9 + 7 * k) for k in range(8)]
    with ThreadPoolExecutor(4) as pool:
        staged = list(pool.map(lambda w: stage(from_wire(w), sums_from=0), wires))
    assert all(s.sums is not None for s in staged)
    with Store(":memory:") as store:
        for s in reversed(staged):
            store.commit(s, "test")
        assert _cells(store) == _recomputed(store)


def test_a_staging_thread_that_failed_mid_batch_leaves_no_rows_for_the_next(monkeypatch):
    """The private database's tables are emptied however ``batch_sums`` ends: a batch whose statements
    failed after the first INSERT leaves nothing that the next batch's sums would carry."""
    first, second = (stage(from_wire(_wire(20, 50 * k, k, "a", "shadow", 1e9 + 20 * k))) for k in range(2))
    sums = label_sums.batch_sums(second.prepared.labels, second.prepared.requests, second.prepared.flat.steps)
    real = label_sums._requests_sql
    monkeypatch.setattr(label_sums, "_requests_sql", lambda *a: "SELECT no_such_column FROM sum_steps")
    with pytest.raises(duckdb.Error):
        label_sums.batch_sums(first.prepared.labels, first.prepared.requests, first.prepared.flat.steps)
    monkeypatch.setattr(label_sums, "_requests_sql", real)
    again = label_sums.batch_sums(second.prepared.labels, second.prepared.requests, second.prepared.flat.steps)
    assert {t: rows.to_pylist() for t, rows in again.items()} == {t: rows.to_pylist() for t, rows in sums.items()}


def test_sums_hold_what_a_count_of_the_stored_rows_in_python_gives():
    """An oracle apart from the sums' SQL (the recount above shares it): each table's figures, summed over
    the keys Python cannot recompute (the fine bin, the request group's hash), recounted row by row."""
    with Store(":memory:") as store:
        for i in range(4):  # requests continue across batches: recovery moves labels out of censored cells
            for replica, phase in (("a", "shadow"), ("b", "canary")):
                store.ingest(from_wire(_wire(25, 25 * i, i, replica, phase, 1e9 + i * 25 * 0.7)), "test")
        labels = store.query(
            "SELECT l.ts, l.replica_id::VARCHAR AS replica_id, l.step_id, l.request_id::VARCHAR AS request_id, "
            "l.mode::VARCHAR AS mode, l.depth, l.status::VARCHAR AS status, l.survival, l.confidence, l.label, "
            "l.probability, s.phase FROM depth_labels l JOIN steps s USING (replica_id, step_id)"
        ).to_pylist()
        requests = store.query(
            'SELECT ts, replica_id, step_id, request_id, mode, "window", accepted, window_suggested FROM requests'
        ).to_pylist()
        assert {r["status"] for r in labels} >= {"accepted", "rejected", "not_at_risk", "recovered"}
        codes = {m: i for i, m in enumerate(MODES)} | {s: i for i, s in enumerate(STATUSES)}

        def cell(r, *names) -> tuple:
            coded = [codes[r[k]] if k in ("mode", "status") else r[k] for k in names]
            return (int(r["ts"] // label_sums.SUM_BUCKET_S), *coded)

        def check(sql: str, rows: list[dict], key, value) -> None:
            """``sql``'s rows (keys, then n and a sum) against a count and a sum of ``rows`` per key."""
            stored = {tuple(r.values())[:-2]: tuple(r.values())[-2:] for r in store.query(sql).to_pylist()}
            counted: dict[tuple, list] = {}
            for r in rows:
                figures = counted.setdefault(key(r), [0, 0.0])
                figures[0] += 1
                figures[1] += value(r)
            assert stored == {k: (n, pytest.approx(v)) for k, (n, v) in counted.items()}, sql

        having = "GROUP BY ALL HAVING sum(n) <> 0"
        keyed = "bucket, replica_id, phase, mode, depth"
        check(f"SELECT {keyed}, status, sum(n), sum(sum_s) FROM label_status_sums {having}", labels,
              lambda r: cell(r, "replica_id", "phase", "mode", "depth", "status"), lambda r: r["survival"])  # fmt: skip
        observed = [r for r in labels if r["status"] not in ("censored", "estimated")]
        at_risk = [r for r in labels if r["status"] in ("accepted", "rejected")]
        windows = {(q["replica_id"], q["step_id"], q["request_id"]):
                   q["window_suggested"] if q["mode"] == "shadow" else q["window"] for q in requests}  # fmt: skip
        windowed = [r for r in observed if r["mode"] in WINDOWED_MODES
                    and r["depth"] <= windows[(r["replica_id"], r["step_id"], r["request_id"])]]  # fmt: skip
        for kind, rows, p in ((0, observed, "survival"), (1, at_risk, "confidence"), (2, windowed, "survival")):
            check(f"SELECT {keyed}, y, sum(n), sum(sum_p) FROM label_fine_sums WHERE kind = {kind} {having}", rows,
                  lambda r: (*cell(r, "replica_id", "phase", "mode", "depth"), bool(r["label"])),
                  lambda r, p=p: r[p])  # fmt: skip
        gated = [r for r in observed if r["mode"] in FULL_BLOCK_MODES]
        check(f"SELECT bucket, replica_id, phase, depth, sum(n), sum(sum_y) FROM label_group_sums WHERE kind = 0 "
              f"{having}", gated, lambda r: cell(r, "replica_id", "phase", "depth"),
              lambda r: float(bool(r["label"])))  # fmt: skip
        check(f"SELECT bucket, replica_id, mode, x, y, sum(n), 0.0 FROM request_sums WHERE hist = 0 {having}",
              requests, lambda q: cell(q, "replica_id", "mode", "window", "accepted"), lambda q: 0.0)  # fmt: skip
