"""SGLang /server_info poller against loopback servers: dedup, buffer clears, restarts, resume, and the
contract with SGLang's own record and reply shapes."""

from __future__ import annotations

import pytest

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.schema import CALIBRATED_AT_SOURCE, TIER_UNREPORTED
from sparkgate.collectors.sglang import CLEAR_KEY, EPOCH_SHIFT, SGLangPoller, dp_ranks
from sparkgate.controller.evaluate import evaluate
from tests.collectors.loopback import scripted_server
from tests.collectors.sglang_stand_in import Server, running
from tests.conftest import R1, R2, record, req, server_info

# Absent fields, as a server writes them (omit_defaults): no graph key, no timings. A ReqDetail's fields but
# rid, confidence and survival are required; the last two are dumped together or not at all.
R3 = record(3, "compact", [req("d", 4, 1)], graph_key=-1, step_gpu_ms=None, step_cpu_ms=None, draft_gpu_ms=None,
            target_verify_gpu_ms=None)  # fmt: skip
NO_CONFIDENCE = record(12, "static", [req("z", 5, 1, confidence=None, survival=None)])
# Bad input no SGLang build writes (its cap_trim is a required int, 0 or more): quarantined with the field named.
R4_BAD = record(4, "cap-accept", [req("e", 3, 2, cap_trim=-1)])


def test_poller_dedups_survives_clear_and_restart(store):
    polls = [
        server_info([R1, R2], [], rank_key=True),
        server_info([R1, R2, R3], [record(10, "static", [req("x", 5, 4)])], rank_key=True),
        server_info([], [], rank_key=True),  # buffer cleared
        server_info([R1], [record(11, "static", [req("y", 5, 0)])], rank_key=True),  # rank 0 restarted
        server_info([R1, R4_BAD], [NO_CONFIDENCE], rank_key=True),
    ]
    ingestor = Ingestor(store)
    with scripted_server("/server_info", polls) as url:
        poller = SGLangPoller(url, ingestor, name="sg", clear_buffer=False)
        results = [poller.poll_once() for _ in polls]
    assert [r.steps if r else None for r in results] == [2, 2, None, 2, 0]
    assert results[4].quarantined == 2
    problems = [[p.field for p in q.problems] for q in results[4].prepared.quarantined]
    assert problems == [["requests[0].full_accept"], ["requests[0].confidence", "requests[0].survival"]]
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
    assert rows["d"]["committed_tokens"] == [1, 7]
    step3 = store.query("SELECT tier_rows, verify_rows FROM steps WHERE step_id = 3").to_pylist()[0]
    assert step3 == {"tier_rows": 4, "verify_rows": 4}


@pytest.mark.parametrize(
    "components, step_ms, draft_ms",
    [
        (["core", "reqs"], 0.0, 0.0),  # the least the docs ask for: no timing at all, stored as unmeasured
        (["core", "reqs", "step_cpu_time"], 0.0, 0.0),  # an absent CPU time is also a decode after a prefill
        (["core", "reqs", "step_gpu_time", "draft_gpu_time"], 1000.0, 1000.0),  # timed past the 1 s cap
    ],
)
def test_a_timing_the_engine_left_out_is_unmeasured_unless_it_ran_past_the_cap(store, components, step_ms, draft_ms):
    # dspark_observability.py @ 0b79ccf: a timing is written only with its component on, and _segment_ms
    # leaves out a GPU segment past INFO_DUMP_MAX_STEP_CPU_SECONDS (1 s). Stored as 0 they read as free
    # steps; the step comparisons leave 0 out, and a slow step stays a slow one.
    with scripted_server("/server_info", [server_info([R3], components=components)]) as url:
        SGLangPoller(url, Ingestor(store), name="sg").poll_once()
    stored = store.query("SELECT step_ms, draft_ms, verify_ms FROM steps").to_pylist()
    assert stored == [{"step_ms": step_ms, "draft_ms": draft_ms, "verify_ms": 0.0}]


def test_a_new_poller_resumes_after_what_is_stored(store):
    ingestor = Ingestor(store)
    with scripted_server("/server_info", [server_info([R1, R2])]) as url:
        assert SGLangPoller(url, ingestor, name="sg", clear_buffer=False).poll_once().steps == 2
        assert SGLangPoller(url, ingestor, name="sg", clear_buffer=False).poll_once() is None
    assert store.counts()["quarantine"] == 0


# Contract tests against a stand-in that answers as SGLang's own code does (tests/collectors/sglang_stand_in.py).


def _stored_step(store, step: dict, columns: str) -> dict:
    """``columns`` of the one step a server holding ``step`` gives a poll."""
    server = Server()
    server.push(0, step)
    with running(server) as url:
        SGLangPoller(url, Ingestor(store), name="sg").poll_once()
    return store.query(f"SELECT {columns} FROM steps").to_pylist()[0]


def test_rows_are_the_requests_own_and_the_tier_is_the_padded_graph_key(store):
    compact = record(1, "compact", [req("a", 5, 2), req("b", 3, 2, req_pool_index=1)], graph_key=16)
    step = _stored_step(store, compact, "verify_rows, tier_rows, tier, sts_version")
    assert step == {"verify_rows": 8, "tier_rows": 16, "tier": TIER_UNREPORTED, "sts_version": CALIBRATED_AT_SOURCE}
    # SGLang reports no graph replays: the tier gate has nothing to judge, rather than a miss rate of 0.
    tier_gate = evaluate(store).measurements("compact")["tier_miss_rate"]
    assert tier_gate.value is None and tier_gate.samples == 0


def test_a_cap_accept_step_counts_the_whole_blocks_it_verified(store):
    # SGLang runs the compact layout in compact mode only (DSparkVerifyPlanner.should_run_compact, in
    # python/sglang/srt/speculative/dspark_components/dspark_verify_planner.py
    # @ 00f7df640f18605b5714a5cd8e2bde9087789e7a):
    # cap-accept verifies every request's γ + 1 rows and caps acceptance at the planned verify_len, which
    # the dump reports with the planned layout's graph key.
    capped = record(1, "cap-accept", [req("a", 3, 1), req("b", 2, 1, req_pool_index=1)], graph_key=8)
    step = _stored_step(store, capped, "gamma, verify_rows, tier_rows")
    assert step == {"gamma": 4, "verify_rows": 2 * 5, "tier_rows": 2 * 5}  # two requests of γ + 1 rows
    windows = store.query('SELECT "window" FROM requests ORDER BY request_id').column(0).to_pylist()
    assert windows == [2, 1]  # the windows are still the planned ones, for the scheduler's figures


def test_records_carry_the_contract_the_server_was_launched_with(store):
    """The fingerprint comes from the launch arguments /server_info carries at its top level: the same server
    gives the same one poll after poll, a relaunch with another drafter or STS file a new one, and a new cost
    table none (tables price windows, they do not change what a label means)."""
    server = Server()
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        contracts = []
        for change in ({}, {}, {"speculative_dspark_sps_table_path": "/models/other.json"},
                       {"speculative_draft_model_path": "org/dspark-drafter-8b-v2"},
                       {"speculative_dspark_confidence_sts_path": None}):  # fmt: skip
            server.launch_args.update(change)
            server.push(0, record(len(contracts) + 1, "compact", [req("a", 3, 1)]))
            poller.poll_once()
            contracts.append(store.query("SELECT arg_max(contract, step_id) AS c FROM steps").column("c")[0].as_py())
    assert contracts[0] is not None and len(contracts[0]) == 16
    assert contracts[0] == contracts[1] == contracts[2]
    assert len({contracts[2], contracts[3], contracts[4]}) == 3


def test_requests_without_rid_get_a_stable_identity_per_pool_slot(store):
    # omit_defaults: a ReqDetail whose rid is None carries no "rid" key at all.
    def anonymous(pool, prefix, correct):
        return req(None, 3, correct, req_pool_index=pool, prefix_len=prefix)

    server = Server()
    assert "rid" not in anonymous(0, 10, 1)
    server.push(0, record(1, "compact", [anonymous(0, 10, 1), anonymous(1, 40, 0)]))
    server.push(0, record(2, "compact", [anonymous(0, 12, 2), anonymous(1, 7, 1)]))  # slot 1: a new request
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        result = poller.poll_once()
        server.push(0, record(3, "compact", [anonymous(0, 15, 0)]))  # slot 0's request continues after a clear
        poller.poll_once()
    assert result.quarantined == 0
    ids = store.query("SELECT step_id, request_id FROM requests ORDER BY step_id, request_id").to_pylist()
    assert [(r["step_id"], r["request_id"]) for r in ids] == [
        (1, "~pool0.1"),
        (1, "~pool1.1"),
        (2, "~pool0.1"),
        (2, "~pool1.2"),
        (3, "~pool0.1"),
    ]


def test_synthetic_acceptance_is_quarantined_with_its_reason(store):
    server = Server(simulate_acc_len=2.0)
    server.push(0, R1, R2)
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        result = poller.poll_once()
        assert poller.poll_once() is None  # taken (quarantined) once, not again
    assert (result.steps, result.quarantined, poller.synthetic) == (0, 2, 2)
    problem = result.prepared.quarantined[0].problems[0]
    assert (problem.field, problem.value) == ("simulate_acc_len", 2.0) and "synthetic" in problem.message
    assert store.counts()["steps"] == 0 and store.counts()["quarantine"] == 2


def test_the_buffer_is_cleared_after_each_commit_and_new_records_still_flow(store):
    server = Server(ranks=2, rank_key=True)
    server.push(0, R1)
    server.push(1, record(7, "compact", [req("x", 5, 4)]))
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        assert poller.poll_once().steps == 2
        assert server.buffers == [[], []] and server.posted[-1] == {CLEAR_KEY: True}
        assert poller.poll_once() is None  # nothing new, and nothing committed: no clear asked
        server.push(0, R2)
        assert poller.poll_once().steps == 1
    assert len(server.posted) == 2 and poller.restarts == 0


def test_dp_ranks_are_told_by_the_rank_they_name_not_by_their_place_in_the_reply(store):
    # SGLang lists the ranks' replies as they arrive: here reversed on every other poll. Rank 0 counts from
    # 1000 and rank 1 from 10, both anonymous requests in pool slot 0 at their own prefixes.
    def anonymous(prefix, correct):
        return req(None, 3, correct, req_pool_index=0, prefix_len=prefix)

    server = Server(ranks=2, rank_key=True, arrival=lambda n: [1, 0] if n % 2 else [0, 1])
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        for k in range(4):
            server.push(0, record(1000 + k, "compact", [anonymous(10 + 2 * k, 1)]))
            server.push(1, record(10 + k, "compact", [anonymous(500 + 3 * k, 2)]))
            assert poller.poll_once().steps == 2
    assert poller.restarts == 0
    rows = store.query("SELECT replica_id, step_id, request_id FROM requests ORDER BY ALL").to_pylist()
    assert [(r["replica_id"], r["step_id"]) for r in rows] == [("sg/dp0", 1000 + k) for k in range(4)] + [
        ("sg/dp1", 10 + k) for k in range(4)
    ]
    assert {r["request_id"] for r in rows} == {"~pool0.1"}  # each rank's slot held one request throughout


def test_ranks_that_cannot_be_told_apart_are_refused_with_nothing_ingested_or_cleared(store):
    # As every SGLang release answers a server with two DP ranks: no element says which rank it is.
    server = Server(ranks=2)
    server.push(0, R1)
    server.push(1, record(7, "compact", [req("x", 5, 4)]))
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        with pytest.raises(ValueError, match=r"internal_states\[0\].*names no dp_rank.*arrive"):
            poller.poll_once()
    assert store.counts()["steps"] == 0 and server.posted == [] and server.buffers[0] == [R1]

    # A lone rank needs no name, nor does one without records; a named rank must be a non-negative integer,
    # and named once.
    def element(**key):
        return {"dspark_info_record": {"records": [R1], **key}}

    assert dp_ranks([element()]) == [0]
    assert dp_ranks([{}, {"dspark_info_record": {"records": []}}, element(dp_rank=2)]) == [None, None, 2]
    for bad, message in ((["1", 0], r"\[0\]\.dp_rank: '1'"), ([0, 0], r"\[1\]\.dp_rank: rank 0 appears twice")):
        with pytest.raises(ValueError, match=message):
            dp_ranks([element(dp_rank=r) for r in bad])


def test_a_server_that_refuses_the_clear_is_read_whole_from_then_on(store):
    server = Server(refuse=frozenset({CLEAR_KEY}))
    server.push(0, R1)
    with running(server) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg")
        assert poller.poll_once().steps == 1
        assert not poller.clear_buffer and server.buffers[0] == [R1]
        server.push(0, R2)
        assert poller.poll_once().steps == 1  # dedup by forward_ct still takes only the new record
    assert len(server.posted) == 1


def test_a_release_that_serves_get_server_info(store):
    server = Server(info_path="/get_server_info")
    server.push(0, R1)
    with running(server) as url:
        assert SGLangPoller(url, Ingestor(store), name="sg").poll_once().steps == 1


@pytest.mark.parametrize("greedy", [True, False])
def test_a_greedy_servers_censored_labels_are_recovered_from_its_later_records_across_polls(store, greedy):
    # Step 1 uses up its window of 2 (drafts 5 6 | 7 8 unverified) and commits 5 6 + bonus 7 at positions
    # 10-12; step 2 continues at 13 with 9: draft 3 (7) matched the bonus, draft 4 (8) did not match 9.
    first = record(1, "compact", [req("a", 3, 2, draft_tokens=[5, 6, 7, 8], bonus_token=7, prefix_len=10)])
    second = record(2, "compact", [req("a", 5, 1, draft_tokens=[9, 1, 2, 3], bonus_token=4, prefix_len=13)])
    with scripted_server("/server_info", [server_info([first]), server_info([first, second])]) as url:
        poller = SGLangPoller(url, Ingestor(store), name="sg", clear_buffer=False, greedy=greedy)
        poller.poll_once()
        poller.poll_once()
    rows = store.query(
        "SELECT depth, status::VARCHAR AS status, label FROM depth_labels WHERE step_id = 1 ORDER BY depth"
    ).to_pylist()
    if greedy:
        assert [(r["status"], r["label"]) for r in rows] == [
            ("accepted", True), ("accepted", True), ("recovered", True), ("recovered", False)
        ]  # fmt: skip
    else:  # no temperature in SGLang's records: without the operator's word, nothing is recovered
        assert [r["status"] for r in rows] == ["accepted", "accepted", "censored", "censored"]
