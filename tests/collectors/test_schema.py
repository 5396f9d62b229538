"""The record schema: a step record survives its wire form and the store unchanged, v2 and v3 fields included,
and records of versions 1 and 2 (without them) are still read."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.schema import StepRecord, id_problem
from sparkgate.collectors.validate import validate
from sparkgate.collectors.wire import from_ndjson
from tests.collectors.strategies import compact_row, static_row, step

V2_FIELDS = ("epoch", "arm", "step_cpu_ms", "contract")
V3_FIELDS = ("table_step_ms",)


def test_round_trip_through_the_wire_form():
    record = step(requests=[static_row(), compact_row()])
    assert StepRecord.from_dict(record.to_dict()) == record
    v3 = step(requests=[static_row()], epoch=6, arm="control", step_cpu_ms=3.5, contract="c1", table_step_ms=4.25)
    assert StepRecord.from_dict(v3.to_dict()) == v3


def _older(record: StepRecord, version: int, dropped: tuple[str, ...]) -> dict:
    return {k: v for k, v in record.to_dict().items() if k not in dropped} | {"schema_version": version}


def test_new_fields_reach_the_store_and_older_records_are_still_read(store):
    v3 = step(1, requests=[static_row()], epoch=6, arm="control", step_cpu_ms=3.5, contract="c1", table_step_ms=4.25)
    v2 = _older(step(2, requests=[static_row()], epoch=6, arm="control", step_cpu_ms=3.5, contract="c1"), 2, V3_FIELDS)
    v1 = _older(step(3, requests=[static_row()]), 1, V2_FIELDS + V3_FIELDS)
    body = "".join(json.dumps(r) + "\n" for r in (v3.to_dict(), v2, v1)).encode()
    assert store.ingest(from_ndjson(body), "test").quarantined == 0
    rows = store.query(
        "SELECT step_id, schema_version, epoch, arm, step_cpu_ms, contract, table_step_ms FROM steps ORDER BY 1"
    )
    v2_stored = {"epoch": 6, "arm": "control", "step_cpu_ms": 3.5, "contract": "c1"}
    assert rows.to_pylist() == [
        {"step_id": 1, "schema_version": 3, **v2_stored, "table_step_ms": 4.25},
        {"step_id": 2, "schema_version": 2, **v2_stored, "table_step_ms": None},
        {"step_id": 3, "schema_version": 1} | dict.fromkeys(V2_FIELDS + V3_FIELDS),
    ]
    bad = step(4, requests=[static_row()], epoch=7, arm="both")
    result = store.ingest(from_ndjson(json.dumps(bad.to_dict()).encode()), "test")
    assert result.quarantined == 1 and result.prepared.quarantined[0].problems[0].field == "arm"


def test_a_negative_or_non_finite_table_prediction_is_quarantined_by_name(store):
    for i, value in enumerate((-1.0, float("inf"))):
        record = step(10 + i, requests=[static_row()], table_step_ms=value)
        result = store.ingest(from_ndjson(json.dumps(record.to_dict()).encode()), "test")
        assert result.quarantined == 1
        assert [p.field for p in result.prepared.quarantined[0].problems] == ["table_step_ms"]


@given(st.text(max_size=600) | st.sampled_from(["", "r" * 512, "r" * 513, "a\udc80", "a\u202eb", "a\x1bb"]))
def test_the_id_rules_a_producer_checks_are_the_step_validators(text):
    refused_by_validator = "replica_id" in {p.field for p in validate(step(replica_id=text))}
    assert (id_problem(text) is not None) == refused_by_validator
