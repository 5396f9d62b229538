"""The wire forms: NDJSON (fast path, pinpointed bad lines, NaN fallback) and Arrow IPC parsing."""

from __future__ import annotations

import json

import pyarrow as pa

from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_ipc, from_ndjson, to_ipc
from tests.collectors.strategies import compact_row, ndjson, step


def test_ndjson_fast_path_and_blank_lines():
    parsed = from_ndjson(b"\n" + ndjson(step(1), step(2, requests=[compact_row()])) + b"\n\n")
    assert parsed.wire.num_rows == 2 and not parsed.rejected
    assert parsed.wire.column("requests").to_pylist()[1][0]["window"] == 2


def test_ndjson_bad_lines_are_pinpointed():
    body = (
        ndjson(step(1))
        + b"{not json\n"
        + json.dumps(step(3).to_dict()).replace('"gamma": 4', '"gamma": "four"').encode()
        + b"\n"
        + ndjson(step(4))
    )
    parsed = from_ndjson(body)
    assert parsed.wire.column("step_id").to_pylist() == [1, 4]
    assert list(parsed.positions) == [0, 3]
    rejected = {r.position: r for r in parsed.rejected}
    assert "invalid JSON" in rejected[1].problems[0].message
    assert rejected[2].problems[0].field == "gamma" and rejected[2].problems[0].value == "four"
    assert rejected[2].payload.startswith(b'{"replica_id"')


def test_ndjson_lines_that_are_not_objects_are_rejected_not_fatal():
    """A `null` line beside a mistyped record once crashed Arrow's JSON reader (SIGSEGV)."""
    body = b"null\n" + json.dumps(dict(step(2).to_dict(), replica_id=[-3, 3])).encode() + b"\n7\n" + ndjson(step(5))
    parsed = from_ndjson(body)
    assert parsed.wire.column("step_id").to_pylist() == [5]
    assert sorted(r.position for r in parsed.rejected) == [0, 1, 2]


def test_ndjson_nan_falls_back_and_reaches_validation(store):
    body = json.dumps(step(1, requests=[compact_row()]).to_dict()).replace("0.9,", "NaN,", 1).encode()
    result = store.ingest(from_ndjson(body), "t")
    assert result.quarantined == 1
    assert result.prepared.quarantined[0].problems[0].field == "requests[0].confidence[0]"


def test_arrow_ipc_round_trip_and_missing_columns():
    wire = synthetic_wire(3, batch=2, gamma=3)
    assert from_ipc(to_ipc(wire)).wire.equals(wire)
    partial = from_ipc(to_ipc(wire.drop_columns(["ts", "sts_version"])))
    assert partial.wire.column("ts").null_count == 3
    garbage = from_ipc(b"definitely not arrow")
    assert garbage.wire.num_rows == 0 and garbage.rejected[0].problems[0].field == "<body>"
    wrong = from_ipc(to_ipc(pa.table({"gamma": pa.array(["x"])})))
    assert wrong.rejected[0].problems[0].field == "gamma"
