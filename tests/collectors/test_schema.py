"""The record schema: a step record survives its wire form and the store unchanged, v2 fields included, and
version 1 records (without them) are still read."""

from __future__ import annotations

import json

from sparkgate.collectors.schema import StepRecord
from sparkgate.collectors.wire import from_ndjson
from tests.collectors.strategies import compact_row, static_row, step


def test_round_trip_through_the_wire_form():
    record = step(requests=[static_row(), compact_row()])
    assert StepRecord.from_dict(record.to_dict()) == record
    v2 = step(requests=[static_row()], epoch=6, arm="control", step_cpu_ms=3.5, contract="c1")
    assert StepRecord.from_dict(v2.to_dict()) == v2


def test_v2_fields_reach_the_store_and_v1_records_are_still_read(store):
    v2 = step(1, requests=[static_row()], epoch=6, arm="control", step_cpu_ms=3.5, contract="c1")
    v1 = {k: v for k, v in step(2, requests=[static_row()]).to_dict().items()
          if k not in ("epoch", "arm", "step_cpu_ms", "contract")} | {"schema_version": 1}  # fmt: skip
    body = (json.dumps(v2.to_dict()) + "\n" + json.dumps(v1) + "\n").encode()
    assert store.ingest(from_ndjson(body), "test").quarantined == 0
    rows = store.query("SELECT step_id, schema_version, epoch, arm, step_cpu_ms, contract FROM steps ORDER BY 1")
    assert rows.to_pylist() == [
        {"step_id": 1, "schema_version": 2, "epoch": 6, "arm": "control", "step_cpu_ms": 3.5, "contract": "c1"},
        {"step_id": 2, "schema_version": 1, "epoch": None, "arm": None, "step_cpu_ms": None, "contract": None},
    ]
    bad = step(3, requests=[static_row()], epoch=7, arm="both")
    result = store.ingest(from_ndjson(json.dumps(bad.to_dict()).encode()), "test")
    assert result.quarantined == 1 and result.prepared.quarantined[0].problems[0].field == "arm"
