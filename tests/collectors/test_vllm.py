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
