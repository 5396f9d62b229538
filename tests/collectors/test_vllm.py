"""The vLLM /metrics adapter against a loopback server: counters to a survival curve, intervals, resets."""

from __future__ import annotations

import math

import pytest

from sparkgate.collectors.vllm import VLLMScraper, parse_counters, survival_curve
from tests.collectors.loopback import scripted_server

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


# vllm-project/vllm vllm/v1/core/sched/scheduler.py @ 00024d314514900f361ad072af6931e403b7f589: one draft per
# request per step, num_draft_tokens = len(scheduled_spec_token_ids), so a request scheduled fewer tokens adds
# fewer; vllm/v1/spec_decode/metrics.py @ ee4ceaae5953d367d8edd2132fd86d6c42506e1e: accepted_per_pos[i] += 1
# for i < num_accepted, every draft counts in num_drafts. vllm/v1/worker/gpu/spec_decode/adaptive_verification.py
# @ 057929c3632766486896597cf27e1425fd838e63: adaptive verification keeps scheduling the full length and counts
# trimmed slots as rejections.
SHORT_DRAFTS = METRICS_1.replace(" 300\n", " 240\n")  # 100 drafts of up to 3 positions, 240 tokens scheduled


def test_a_curve_whose_drafts_did_not_all_reach_the_deep_positions_is_marked_censored():
    assert survival_curve(parse_counters(METRICS_1)).censored is None
    short = survival_curve(parse_counters(SHORT_DRAFTS))
    assert short.survival == [0.8, 0.5, 0.2] and "shorter drafts never reached" in short.censored
    # Adaptive verification is invisible in the counters: the operator says so.
    with scripted_server("/metrics", [METRICS_1], content_type="text/plain") as url:
        curve = VLLMScraper(url, adaptive=True).scrape()
    assert curve.censored.startswith("adaptive verification") and curve.to_dict()["censored"] == curve.censored
