"""``prepare``: one transaction's rows, where a step is stored whole or quarantined whole."""

from __future__ import annotations

import json

import numpy as np

from sparkgate.collectors.batch import prepare
from sparkgate.collectors.wire import from_ndjson, from_records
from tests.collectors.strategies import compact_row, ndjson, step


def test_a_step_is_kept_whole_or_quarantined_whole_in_input_order():
    first = step(1, requests=[compact_row(request_id="a")])
    bad = step(2, requests=[compact_row(request_id="ok"), compact_row(window=9, request_id="bad")])
    third = step(3, requests=[compact_row(request_id="b"), compact_row(request_id="c")])
    prepared = prepare(from_ndjson(ndjson(first, bad, third) + b"{oops\n"))
    assert prepared.flat.steps.column("step_id").to_pylist() == [1, 3]
    # Request rows keep their own step's key and slot after the bad step is cut out.
    rows = prepared.requests.to_pylist()
    assert [(r["step_id"], r["slot"], r["request_id"]) for r in rows] == [(1, 0, "a"), (3, 0, "b"), (3, 1, "c")]
    assert prepared.labels.num_rows == 3 * 4 and set(prepared.labels.column("step_id").to_pylist()) == {1, 3}
    assert [(q.position, q.step_id) for q in prepared.quarantined] == [(1, 2), (3, None)]
    assert prepared.quarantined[0].problems[0].field == "requests[1].window"
    assert json.loads(prepared.quarantined[0].payload)["step_id"] == 2
    table = prepared.quarantine_table("unit", 5.0)
    assert table.column("position").to_pylist() == [1, 3] and table.column("source").to_pylist() == ["unit"] * 2
    assert "requests[1].window=9" in table.column("reason").to_pylist()[0]
    assert json.loads(table.column("problems").to_pylist()[0])[0]["field"] == "requests[1].window"


def test_steps_marked_stored_are_quarantined_as_duplicates():
    prepared = prepare(from_records([step(1), step(2), step(3)]), stored=np.array([False, True, False]))
    assert prepared.flat.steps.column("step_id").to_pylist() == [1, 3]
    assert [q.step_id for q in prepared.quarantined] == [2]
    assert "already stored" in str(prepared.quarantined[0].problems[0])
