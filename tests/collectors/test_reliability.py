"""Malformed input never crashes or half-writes; a killed writer loses no acknowledged batch."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_ndjson
from tests.collectors.strategies import step_records

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


WRITER = """
import sys, time
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import ingest_app, serve_in_thread
from sparkgate.collectors.store import Store
with serve_in_thread(ingest_app(Ingestor(Store(sys.argv[1])))) as url:
    print(url, flush=True)
    while True:
        time.sleep(1)
"""


def test_sigkill_mid_stream_loses_no_acknowledged_batch(tmp_path):
    db = tmp_path / "killed.duckdb"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    url = writer.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:")
    bodies = [
        b"\n".join(
            json.dumps(r).encode() for r in synthetic_wire(40, 16, 5, "w", first_step=40 * b, seed=b).to_pylist()
        )
        for b in range(200)
    ]
    acked: list[int] = []
    third_ack = threading.Event()

    def stream() -> None:
        with httpx.Client(base_url=url, timeout=30.0) as http:
            for b, body in enumerate(bodies):
                try:
                    reply = http.post("/v1/ingest", content=body, headers={"content-type": "application/x-ndjson"})
                except httpx.HTTPError:
                    return
                if reply.status_code == 200:
                    acked.append(b)
                    if len(acked) == 3:
                        third_ack.set()

    poster = threading.Thread(target=stream)
    poster.start()
    assert third_ack.wait(60)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    poster.join()
    assert len(acked) < len(bodies)  # the kill landed mid-stream

    with Store(db) as store:
        rows = store.query("SELECT step_id // 40 AS b, count(*) AS n FROM depth_labels GROUP BY 1").to_pylist()
        per_batch = {r["b"]: r["n"] for r in rows}
        steps = store.counts()["steps"]
    full = 40 * 16 * 5
    assert all(per_batch.get(b) == full for b in acked)  # every acknowledged batch, whole
    assert all(n == full for n in per_batch.values())  # nothing half there
    assert steps == 40 * len(per_batch)
