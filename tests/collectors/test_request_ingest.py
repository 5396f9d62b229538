"""Request records through one store transaction: stored whole or quarantined whole, each key once."""

from __future__ import annotations

import json

from sparkgate.collectors.request_ingest import prepare_requests
from tests.conftest import request_record


def body(*objs) -> bytes:
    return b"".join((o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n" for o in objs)


def test_good_lines_are_stored_and_bad_ones_quarantined_with_every_problem(store):
    bad = request_record(request_id="q1", finish_reason="stopped", commit_tokens=[2])
    prepared = prepare_requests(body(request_record(), bad, b"{not json", request_record(request_id="q2")))
    assert prepared.positions == [0, 3] and [q.position for q in prepared.quarantined] == [1, 2]
    assert {p.field for p in prepared.quarantined[0].problems} == {"finish_reason", "commit_tokens"}
    committed = store.commit_requests(prepared, "test")
    assert committed.summary() == {"request_records": 2, "quarantined": 2}
    rows = store.query("SELECT request_id, ttft_ms FROM request_records ORDER BY request_id").to_pylist()
    assert rows == [{"request_id": "q0", "ttft_ms": 400.0}, {"request_id": "q2", "ttft_ms": 400.0}]
    stored = store.query("SELECT position, reason, payload FROM quarantine ORDER BY position").to_pylist()
    assert [q["position"] for q in stored] == [1, 2] and "finish_reason" in stored[0]["reason"]
    assert json.loads(stored[0]["payload"])["request_id"] == "q1"  # the bytes as they came


def test_a_repeated_key_is_stored_once_within_a_body_and_across_posts(store):
    twice = prepare_requests(body(request_record(), request_record(output_tokens=3)))
    assert store.commit_requests(twice, "test").summary() == {"request_records": 1, "quarantined": 1}
    again = store.commit_requests(prepare_requests(body(request_record())), "retry")
    assert again.summary() == {"request_records": 0, "quarantined": 1}
    assert "already stored" in again.quarantined[0].problems[0].message
    assert store.query("SELECT count(*) AS n FROM request_records").column("n")[0].as_py() == 1


def test_a_line_that_gives_a_field_twice_is_quarantined_naming_it(store):
    line = json.dumps(request_record(request_id="q1")).replace('"finish_reason"', '"output_tokens": 9, "finish_reason"')
    assert line.count('"output_tokens"') == 2
    prepared = prepare_requests(body(request_record(), line.encode()))
    assert prepared.positions == [0]
    (quarantined,) = prepared.quarantined
    assert "key 'output_tokens' appears more than once" in quarantined.problems[0].message
