"""SGLang /server_info poller against a loopback server: dedup, buffer clears, restarts, resume."""

from __future__ import annotations

import pytest

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.sglang import EPOCH_SHIFT, SGLangPoller
from tests.collectors.loopback import scripted_server
from tests.conftest import R1, R2, record, req, server_info

# Absent fields: no confidence (derived from survival), no tokens, no timings, no graph key.
R3 = record(
    3,
    "compact",
    [req("d", 4, 1, confidence=None, draft_tokens=None, bonus_token=-1)],
    verify_tokens_graph_key=-1,
    step_gpu_ms=-1,
    step_cpu_ms=None,
    draft_gpu_ms=None,
)
R4_BAD = record(4, "cap-accept", [req("e", 3, 2, cap_trim=-1)])  # cap-accept without cap_trim


def test_poller_dedups_survives_clear_and_restart(store):
    polls = [
        server_info([R1, R2], []),
        server_info([R1, R2, R3], [record(10, "static", [req("x", 5, 4)])]),
        server_info([], []),  # buffer cleared
        server_info([R1], [record(11, "static", [req("y", 5, 0)])]),  # rank 0 restarted
        server_info([R1, R4_BAD], []),
    ]
    ingestor = Ingestor(store)
    with scripted_server("/server_info", polls) as url:
        poller = SGLangPoller(url, ingestor, name="sg")
        results = [poller.poll_once() for _ in polls]
    assert [r.steps if r else None for r in results] == [2, 2, None, 2, 0]
    assert results[4].quarantined == 1
    assert results[4].prepared.quarantined[0].problems[0].field == "requests[0].full_accept"
    assert poller.restarts == 1
    steps = store.query("SELECT replica_id, step_id FROM steps ORDER BY replica_id, step_id").to_pylist()
    assert [(s["replica_id"], s["step_id"]) for s in steps] == [
        ("sg/dp0", 1),
        ("sg/dp0", 2),
        ("sg/dp0", 3),
        ("sg/dp0", (1 << EPOCH_SHIFT) | 1),
        ("sg/dp1", 10),
        ("sg/dp1", 11),
    ]
    rows = {
        r["request_id"]: r
        for r in store.query(
            'SELECT request_id, mode, "window", accepted, full_accept, cap_trim, confidence, committed_tokens '
            "FROM requests WHERE step_id < 4"
        ).to_pylist()
    }
    assert (rows["b"]["window"], rows["b"]["full_accept"]) == (2, None)  # compact, censored
    assert (rows["c"]["mode"], rows["c"]["full_accept"], rows["c"]["cap_trim"]) == ("cap_accept", 3, 2)
    assert rows["a"]["committed_tokens"] == [1, 7]  # step 2's row for "a": one accepted draft + bonus
    assert rows["d"]["committed_tokens"] == [-1, -1]
    assert rows["d"]["confidence"] == pytest.approx([0.9, 0.8, 0.7, 0.6])
    step3 = store.query("SELECT tier_rows, verify_rows, step_ms FROM steps WHERE step_id = 3").to_pylist()[0]
    assert step3 == {"tier_rows": 4, "verify_rows": 4, "step_ms": 0.0}


def test_a_new_poller_resumes_after_what_is_stored(store):
    ingestor = Ingestor(store)
    with scripted_server("/server_info", [server_info([R1, R2])]) as url:
        assert SGLangPoller(url, ingestor, name="sg").poll_once().steps == 2
        assert SGLangPoller(url, ingestor, name="sg").poll_once() is None
    assert store.counts()["quarantine"] == 0
