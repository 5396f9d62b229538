"""The wire forms: NDJSON (fast path, pinpointed bad lines, NaN fallback) and Arrow IPC parsing."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_dicts, from_ipc, from_ndjson, to_ipc
from tests.collectors.strategies import compact_row, ndjson, step, step_records


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


def _one(**changes) -> dict:
    record = json.loads(json.dumps(synthetic_wire(1, 2, 4, "r0", seed=1, ts=1.75e9).to_pylist()[0]))
    for path, value in changes.items():
        if "__" in path:
            slot, name = path.split("__")
            record["requests"][int(slot.removeprefix("row"))][name] = value
        else:
            record[path] = value
    return record


WHOLE, NUMBER = "expected an integer", "not a boolean"


@pytest.mark.parametrize(
    "changes, field, message",
    [
        ({"gamma": 4.5}, "gamma", WHOLE),
        ({"step_id": 1e-3}, "step_id", WHOLE),
        ({"row1__window": 2.5}, "requests[1].window", WHOLE),
        ({"row0__committed_tokens": [1, 2.5]}, "requests[0].committed_tokens[1]", WHOLE),
        ({"verify_ms": True}, "verify_ms", NUMBER),
        ({"graph_hit": None, "ts": False}, "ts", NUMBER),  # no boolean field beside it to hide behind
        ({"row1__temperature": True}, "requests[1].temperature", NUMBER),
        ({"row0__confidence": [0.9, False, 0.5, 0.4]}, "requests[0].confidence[1]", NUMBER),
    ],
)
def test_a_value_arrow_would_turn_into_another_number_is_rejected_by_field(changes, field, message):
    """Arrow truncates a fraction in an int64 field and reads `true` into a float64 field as 1.0, on the fast
    path and the object path alike."""
    record = _one(**changes)
    for parsed in (from_ndjson(json.dumps(record).encode() + b"\n"), from_dicts([record])):
        assert parsed.wire.num_rows == 0
        (problem,) = parsed.rejected[0].problems
        assert problem.field == field and message in problem.message


def test_boolean_literals_inside_strings_are_kept():
    record = _one(replica_id="true-false", graph_hit=True)
    parsed = from_ndjson(json.dumps(record).encode() + b"\n")
    assert parsed.wire.column("replica_id").to_pylist() == ["true-false"] and not parsed.rejected


def test_integers_written_as_floats_and_beyond_float_precision_are_kept_exactly():
    assert from_ndjson(json.dumps(_one(gamma=4.0)).encode() + b"\n").wire.column("gamma").to_pylist() == [4]
    big = _one(step_id=2**60 + 1)  # float64 cannot hold it: the exact per-line pass takes it
    assert from_ndjson(json.dumps(big).encode() + b"\n").wire.column("step_id").to_pylist() == [2**60 + 1]


@given(st.lists(step_records(), min_size=1, max_size=6))
def test_the_fast_path_reads_what_the_object_path_reads(records):
    objs = [r.to_dict() for r in records]
    body = b"".join(json.dumps(o).encode() + b"\n" for o in objs)
    fast, slow = from_ndjson(body), from_dicts(objs)
    assert fast.wire.equals(slow.wire) and not fast.rejected and not slow.rejected


def test_invalid_utf8_is_rejected_by_line_not_stored_later():
    good = json.dumps(_one()).encode()
    body = good + b"\n" + good.replace(b'"r0"', b'"r\xff0"').replace(b'"step_id": 0', b'"step_id": 1') + b"\n"
    parsed = from_ndjson(body)
    assert parsed.wire.num_rows == 1 and [r.position for r in parsed.rejected] == [1]
    assert "invalid JSON" in parsed.rejected[0].problems[0].message


def test_ndjson_a_key_given_twice_rejects_its_line_naming_the_key():
    """The decoder keeps the last of two keys: a line whose ``gamma`` a reader sees as 4 would store 9."""
    twice = json.dumps(step(2).to_dict()).replace('"gamma": 4', '"gamma": 4, "gamma": 9').encode()
    parsed = from_ndjson(ndjson(step(1)) + twice + b"\n" + ndjson(step(3)))
    assert parsed.wire.column("step_id").to_pylist() == [1, 3]
    (rejected,) = parsed.rejected
    assert rejected.position == 1 and "key 'gamma' appears more than once" in rejected.problems[0].message
