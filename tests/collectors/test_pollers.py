"""SGLang /server_info poller and vLLM /metrics adapter against loopback servers."""

from __future__ import annotations

import math

import pytest

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.sglang import EPOCH_SHIFT, SGLangPoller
from sparkgate.collectors.vllm import VLLMScraper, parse_counters, survival_curve
from tests.collectors.loopback import scripted_server

GAMMA = 4


def req(rid, verify_len, correct, cap_trim=0, **extra):
    base = {
        "rid": rid,
        "req_pool_index": 0,
        "prefix_len": 10,
        "verify_len": verify_len,
        "acc_len": correct + 1,
        "correct_drafts": correct,
        "cap_trim": cap_trim,
        "bonus_token": 7,
        "draft_tokens": [1, 2, 3, 4],
        "confidence": [0.9, 0.8, 0.7, 0.6],
        "survival": [0.9, 0.72, 0.504, 0.3024],
    }
    base.update(extra)
    return base


def record(ct, mode, reqs, **extra):
    base = {
        "forward_ct": ct,
        "bs": len(reqs),
        "mode": mode,
        "budget": 8,
        "lag_steps": 0,
        "num_running_reqs": len(reqs),
        "num_verify_tokens": sum(r["verify_len"] for r in reqs),
        "verify_tokens_local": 0,
        "verify_tokens_dp_synced": 0,
        "verify_tokens_graph_key": 32,
        "predicted_step_ms": 5.0,
        "predicted_theta": 0.1,
        "step_cpu_ms": 6.0,
        "step_gpu_ms": 5.5,
        "draft_gpu_ms": 1.0,
        "target_verify_gpu_ms": 3.0,
        "reqs": reqs,
    }
    base.update(extra)
    return base


def server_info(*ranks):
    return {
        "internal_states": [
            {
                "dspark_info_record": {
                    "mode": "mixed",
                    "gamma": GAMMA,
                    "verify_num_draft_tokens": GAMMA,
                    "components": [],
                    "records": records,
                    "simulate_acc_len": 2.0,
                }
            }
            for records in ranks
        ]
    }


R1 = record(1, "compact", [req("a", 5, 2), req("b", 3, 2)])
R2 = record(2, "cap-accept", [req("a", 3, 1, cap_trim=0), req("c", 2, 1, cap_trim=2)])
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


METRICS_1 = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{model_name="m"} 100
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 300
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 150
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 80
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 50
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 20
"""


def test_vllm_counters_to_survival_curve_with_intervals_and_reset():
    assert survival_curve(parse_counters(METRICS_1)).survival == [0.8, 0.5, 0.2]
    later = (
        METRICS_1.replace(" 100\n", " 200\n")
        .replace(" 300\n", " 600\n")
        .replace(" 150\n", " 240\n")
        .replace('"0"} 80', '"0"} 150')
        .replace('"1"} 50', '"1"} 80')
        .replace('"2"} 20', '"2"} 30')
    )
    restarted = (
        METRICS_1.replace(" 100\n", " 10\n")
        .replace(" 300\n", " 30\n")
        .replace(" 150\n", " 15\n")
        .replace('"0"} 80', '"0"} 8')
        .replace('"1"} 50', '"1"} 5')
        .replace('"2"} 20', '"2"} 2')
    )
    with scripted_server("/metrics", [METRICS_1, later, restarted], content_type="text/plain") as url:
        scraper = VLLMScraper(url)
        first, second, third = scraper.scrape(), scraper.scrape(), scraper.scrape()
    assert first.survival == [0.8, 0.5, 0.2]
    assert second.drafts == 100 and second.survival == pytest.approx([0.7, 0.3, 0.1])
    assert math.isclose(second.acceptance_rate, 90 / 300) and math.isclose(second.mean_accepted, 0.9)
    assert third.drafts == 10 and third.survival == pytest.approx([0.8, 0.5, 0.2])
