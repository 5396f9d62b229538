"""The DuckDB store: transactions, quarantine, duplicates, retention, export, snapshots; malformed input
never crashes or half-writes."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.request_ingest import prepare_requests
from sparkgate.collectors.store import Store, stage
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten, from_dicts, from_ndjson, from_records
from tests.collectors.strategies import compact_row, step, step_records
from tests.conftest import consistency_check, request_record


def test_batch_rows_land_in_every_table(store):
    result = store.ingest(from_records([step(1, requests=[compact_row()]), step(2, requests=[compact_row()])]), "t")
    assert result.summary() == {"steps": 2, "requests": 2, "depth_labels": 8, "quarantined": 0}
    assert store.counts() == {"steps": 2, "requests": 2, "depth_labels": 8, "request_records": 0, "quarantine": 0}
    row = store.query('SELECT mode, "window", accepted, full_accept, survival FROM requests LIMIT 1').to_pylist()[0]
    assert row == {
        "mode": "compact",
        "window": 2,
        "accepted": 2,
        "full_accept": None,
        "survival": [0.9, 0.81, pytest.approx(0.729), pytest.approx(0.6561)],
    }


def test_invalid_steps_are_quarantined_whole_and_valid_ones_kept(store):
    bad = step(2, requests=[compact_row(), compact_row(window=9, request_id="r2")])
    result = store.ingest(from_records([step(1, requests=[compact_row()]), bad]), "unit")
    assert store.counts() == {"steps": 1, "requests": 1, "depth_labels": 4, "request_records": 0, "quarantine": 1}
    q = store.query("SELECT source, position, replica_id, step_id, reason, problems, payload FROM quarantine")
    row = q.to_pylist()[0]
    assert (row["source"], row["position"], row["replica_id"], row["step_id"]) == ("unit", 1, "replica-a", 2)
    assert "requests[1].window=9" in row["reason"]
    assert json.loads(row["problems"])[0]["field"] == "requests[1].window"
    assert json.loads(row["payload"])["step_id"] == 2
    assert result.quarantined == 1


def test_duplicate_steps_against_store_and_within_batch(store):
    store.ingest(from_records([step(1)]), "t")
    result = store.ingest(from_records([step(1), step(2), step(2)]), "t")
    assert store.counts()["steps"] == 2
    reasons = [str(p) for q in result.prepared.quarantined for p in q.problems]
    assert any("already stored" in r for r in reasons) and any("earlier in this batch" in r for r in reasons)


def test_stream_commits_in_order_and_sees_keys_committed_by_earlier_batches(store):
    # Batch 2 is staged while batch 1 commits, so only the commit-time key check can catch its repeat.
    batches = [
        (from_records([step(1), step(2)]), "a"),
        (from_records([step(2), step(3)]), "b"),
        (from_records([step(4)]), "c"),
    ]
    results = list(store.ingest_stream(batches))
    assert [(r.source, r.steps, r.quarantined) for r in results] == [("a", 2, 0), ("b", 1, 1), ("c", 1, 0)]
    assert "already stored" in str(results[1].prepared.quarantined[0].problems[0])
    assert store.counts()["steps"] == 4 and store.counts()["quarantine"] == 1


def test_a_failed_commit_stops_the_stream_without_reading_on(store, monkeypatch):
    pulled = []

    def source():
        for i in range(1, 5):
            pulled.append(i)
            yield from_records([step(i)]), str(i)

    def broken_commit(staged, source):
        raise duckdb.IOException("disk gone")

    monkeypatch.setattr(store, "commit", broken_commit)
    with pytest.raises(duckdb.IOException, match="disk gone"):
        list(store.ingest_stream(source()))
    assert pulled == [1, 2]  # batch 2 was read (and staged) while batch 1 committed; nothing after


def test_stream_raises_a_source_error_after_the_batches_before_it(store):
    def source():
        yield from_records([step(1)]), "a"
        raise OSError("read failed")

    seen = []
    with pytest.raises(OSError, match="read failed"):
        for result in store.ingest_stream(source()):
            seen.append(result.source)
    assert seen == ["a"] and store.counts()["steps"] == 1


@pytest.mark.parametrize("sums_from", [None, 0])
def test_a_batch_staged_before_its_key_was_committed_is_rechecked(store, sums_from):
    staged = stage(from_records([step(1, requests=[compact_row()]), step(2, requests=[compact_row()])]), sums_from)
    store.ingest(from_records([step(2, requests=[compact_row()])]), "first")
    result = store.commit(staged, "late")
    assert (result.steps, result.quarantined) == (1, 1)
    assert store.counts() == {"steps": 2, "requests": 2, "depth_labels": 8, "request_records": 0, "quarantine": 1}
    # The sums staged with the batch counted the repeated step; the commit computed them again without it.
    assert store.query("SELECT sum(n)::BIGINT FROM label_status_sums").column(0)[0].as_py() == 8


def test_untypeable_records_are_quarantined(store):
    result = store.ingest(from_dicts([{"step_id": "seven"}, 42, step(3).to_dict()]), "t")
    assert result.steps == 1 and result.quarantined == 2
    problems = store.query("SELECT position, reason FROM quarantine ORDER BY position").to_pylist()
    assert problems[0]["position"] == 0 and "step_id='seven'" in problems[0]["reason"]
    assert problems[1]["position"] == 1 and "must be a JSON object" in problems[1]["reason"]


def test_a_failed_commit_writes_nothing(store):
    # depth_labels is written after steps and requests: make that third insert fail.
    store._con.execute("ALTER TABLE depth_labels RENAME TO depth_labels_real")
    store._con.execute("CREATE TABLE depth_labels (unrelated INTEGER)")
    with pytest.raises(duckdb.Error):
        store.ingest(from_records([step(1, requests=[compact_row()]), step(2, requests=[compact_row()])]), "t")
    assert store.counts() == {"steps": 0, "requests": 0, "depth_labels": 0, "request_records": 0, "quarantine": 0}
    store._con.execute("DROP TABLE depth_labels")
    store._con.execute("ALTER TABLE depth_labels_real RENAME TO depth_labels")
    assert store.ingest(from_records([step(1, requests=[compact_row()])]), "t").steps == 1


def test_retention_deletes_old_rows_everywhere(store):
    store.ingest(
        from_records(
            [step(1, requests=[compact_row()], ts=100.0), step(2, requests=[compact_row(request_id="r2")], ts=200.0)]
        ),
        "t",
    )
    flat = flatten(synthetic_wire(2, 2, 3))
    for end in (120.0, 220.0):
        store.record_aggregate("r0", end - 20, end, Aggregate.from_tables(flat.requests, explode(flat), 3))
    for request_id, finish in (("old", 140.0), ("new", 160.0)):
        body = json.dumps(request_record(request_id=request_id, arrival_ts=finish - 1, first_token_ts=finish - 0.5,
                                         finish_ts=finish, commit_offsets_ms=[500.0, 1000.0])).encode()  # fmt: skip
        assert store.commit_requests(prepare_requests(body), "test").rows.num_rows == 1
    assert store.delete_before(150.0) == {
        "steps": 1,
        "requests": 1,
        "depth_labels": 4,
        "request_records": 1,
        "quarantine": 0,
        "aggregates": 1,
    }
    assert store.query("SELECT step_id FROM depth_labels").column(0).to_pylist() == [2] * 4
    assert store.query("SELECT interval_end FROM aggregates").column(0).to_pylist() == [220.0]


def test_big_synthetic_batch_commits_in_one_go(store):
    wire = synthetic_wire(50, batch=8, gamma=5)
    parsed = from_dicts(wire.to_pylist())
    assert store.ingest(parsed, "t").summary() == {"steps": 50, "requests": 400, "depth_labels": 2000, "quarantined": 0}
    statuses = store.query("SELECT DISTINCT status FROM depth_labels ORDER BY 1").column(0).to_pylist()
    assert set(statuses) <= {"accepted", "rejected", "not_at_risk", "censored"} and "censored" in statuses


def test_commits_the_log_holds_before_a_checkpoint_survive_a_crash(tmp_path):
    """A file store checkpoints only past FILE_CHECKPOINT of log, so a process that dies (no close, no
    checkpoint) after its commits leaves them in the log alone; reopening replays them, sums included."""
    db = tmp_path / "crash.duckdb"
    writer = f"""
import os
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire
store = Store({str(db)!r})
assert store.query("SELECT current_setting('checkpoint_threshold')").column(0)[0].as_py() == "61.0 MiB"  # 64 MB
for s in range(0, 300, 100):
    store.ingest(from_wire(synthetic_wire(100, 32, 7, "crash", first_step=s, seed=s)), "t")
print(os.path.getsize({str(db)!r} + ".wal"), flush=True)
os._exit(0)
"""
    wal_bytes = int(subprocess.run([sys.executable, "-c", writer], check=True, capture_output=True).stdout)
    assert wal_bytes > 1_000_000  # the three commits are in the log, not yet checkpointed
    with Store(db) as store:
        assert store.counts()["depth_labels"] == 300 * 32 * 7
        summed = store.query("SELECT sum(n) FROM label_status_sums").column(0)[0].as_py()
        assert summed == 300 * 32 * 7


def test_decisions_and_max_step_ids(store):
    store.ingest(from_records([step(4), step(9), step(2, replica_id="b")]), "t")
    assert store.max_step_ids() == {"replica-a": 9, "b": 2}
    store.record_decision(1, "shadow", "fallback", "rollback", [{"gate": "ece", "value": 0.09}])
    row = store.query("SELECT phase_to, reasons FROM decisions").to_pylist()[0]
    assert row["phase_to"] == "fallback" and json.loads(row["reasons"])[0]["gate"] == "ece"


JUNK = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True),
    st.booleans(),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


_ids = itertools.count()


@st.composite
def maybe_malformed(draw) -> bytes:
    """One NDJSON line: a valid record, a record with a field or request field replaced or removed, or junk."""
    record = draw(step_records(step_id=next(_ids))).to_dict()
    kind = draw(st.sampled_from(["valid", "step_field", "request_field", "drop", "junk_line", "junk_json"]))
    if kind == "step_field":
        record[draw(st.sampled_from(sorted(record)))] = draw(JUNK)
    elif kind == "request_field" and record["requests"]:
        row = draw(st.sampled_from(record["requests"]))
        row[draw(st.sampled_from(sorted(row)))] = draw(JUNK)
    elif kind == "drop":
        del record[draw(st.sampled_from(sorted(record)))]
    elif kind == "junk_line":
        return draw(st.binary(min_size=1, max_size=20)).replace(b"\n", b" ") or b"?"
    elif kind == "junk_json":
        return json.dumps(draw(JUNK)).encode()
    return json.dumps(record).encode()  # NaN/inf become the non-standard tokens Python emits


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(st.lists(maybe_malformed(), min_size=1, max_size=6))
def test_malformed_events_are_quarantined_and_never_half_written(store, lines):
    lines = [line for line in lines if line.strip()]
    before = store.counts()
    result = store.ingest(from_ndjson(b"\n".join(lines)), "fuzz")
    after = store.counts()
    assert result.steps + result.quarantined == len(lines)
    assert after["steps"] - before["steps"] == result.steps
    assert after["quarantine"] - before["quarantine"] == result.quarantined
    assert all(q.problems and all(p.message for p in q.problems) for q in result.prepared.quarantined)
    # Every stored step is whole: its request rows and gamma labels for each of them.
    incomplete = store.query("""
        SELECT s.replica_id, s.step_id FROM steps s
        LEFT JOIN (SELECT replica_id, step_id, count(*) n FROM requests GROUP BY ALL) r USING (replica_id, step_id)
        LEFT JOIN (SELECT replica_id, step_id, count(*) n FROM depth_labels GROUP BY ALL) d
            USING (replica_id, step_id)
        WHERE coalesce(d.n, 0) != coalesce(r.n, 0) * s.gamma""")
    assert incomplete.num_rows == 0


def test_a_failed_commit_keeps_its_cause_when_the_rollback_fails_too(store):
    class FullDisk:
        """The writer connection as a full disk leaves it: COMMIT fails, and with it the transaction."""

        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            if sql == "COMMIT":
                self.con.execute("ROLLBACK")
                raise duckdb.IOException("could not write: No space left on device")
            return self.con.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self.con, name)

    real, store._con = store._con, FullDisk(store._con)
    try:
        with pytest.raises(duckdb.IOException, match="No space left on device") as caught:
            store.record_consistency([consistency_check(1)])
    finally:
        store._con = real
    assert any("rolling back also failed" in note for note in caught.value.__notes__)
    assert store.query("SELECT count(*) AS n FROM consistency_checks").column("n")[0].as_py() == 0
