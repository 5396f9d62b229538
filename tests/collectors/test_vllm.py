"""The vLLM adapter: /metrics counters to a survival curve (intervals, resets), and per-request spec-decode
metrics of saved responses to a curve that resolves censoring."""

from __future__ import annotations

import json
import math

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from sparkgate.collectors.vllm import VLLMScraper, parse_counters, read_responses, response_curve, survival_curve
from tests.collectors.loopback import scripted_server


def exposition(drafts, draft_tokens, accepted, per_position, engines=1) -> str:
    """/metrics as vLLM writes its spec-decode counters, each engine adding the same counts: families and
    labels of ``SpecDecodingProm`` (vllm-project/vllm ``vllm/v1/spec_decode/metrics.py`` @ ee4ceaae), label
    names ``["model_name", "engine"]`` with one value set per engine index (``PrometheusStatLogger``,
    ``vllm/v1/metrics/loggers.py`` @ a6f0308c), rendered by prometheus_client (``_total`` and ``_created``)."""
    registry, labels = CollectorRegistry(), ["model_name", "engine"]
    families = {
        "vllm:spec_decode_num_drafts": drafts,
        "vllm:spec_decode_num_draft_tokens": draft_tokens,
        "vllm:spec_decode_num_accepted_tokens": accepted,
    }
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "per position", labels + ["position"],
                      registry=registry)  # fmt: skip
    for name, value in families.items():
        counter = Counter(name, name, labels, registry=registry)
        for engine in range(engines):
            counter.labels("m", str(engine)).inc(value)
    for engine in range(engines):
        for pos, value in enumerate(per_position):
            per_pos.labels("m", str(engine), str(pos)).inc(value)
    return generate_latest(registry).decode()


METRICS_1 = exposition(100, 300, 150, [80, 50, 20])


def test_vllm_counters_to_survival_curve_with_intervals_and_reset():
    assert survival_curve(parse_counters(METRICS_1)).survival == [0.8, 0.5, 0.2]
    later = exposition(200, 600, 240, [150, 80, 30])
    restarted = exposition(10, 30, 15, [8, 5, 2])
    with scripted_server("/metrics", [METRICS_1, later, restarted], content_type="text/plain") as url:
        scraper = VLLMScraper(url)
        first, second, third = scraper.scrape(), scraper.scrape(), scraper.scrape()
    assert first.survival == [0.8, 0.5, 0.2]
    assert second.drafts == 100 and second.survival == pytest.approx([0.7, 0.3, 0.1])
    assert math.isclose(second.acceptance_rate, 90 / 300) and math.isclose(second.mean_accepted, 0.9)
    assert third.drafts == 10 and third.survival == pytest.approx([0.8, 0.5, 0.2])


def test_the_engines_of_a_data_parallel_server_add_up_and_created_series_are_not_counts():
    one, two = parse_counters(METRICS_1), parse_counters(exposition(100, 300, 150, [80, 50, 20], engines=2))
    assert "_created" in METRICS_1 and 'engine="0"' in METRICS_1
    assert (two.drafts, two.accepted) == (2 * one.drafts, 2 * one.accepted)
    assert survival_curve(two).survival == survival_curve(one).survival == [0.8, 0.5, 0.2]


# vllm-project/vllm vllm/v1/core/sched/scheduler.py @ 00024d314514900f361ad072af6931e403b7f589: one draft per
# request per step, num_draft_tokens = len(scheduled_spec_token_ids), so a request scheduled fewer tokens adds
# fewer; vllm/v1/spec_decode/metrics.py @ ee4ceaae5953d367d8edd2132fd86d6c42506e1e: accepted_per_pos[i] += 1
# for i < num_accepted, every draft counts in num_drafts. vllm/v1/worker/gpu/spec_decode/adaptive_verification.py
# @ 057929c3632766486896597cf27e1425fd838e63: adaptive verification keeps scheduling the full length and counts
# trimmed slots as rejections.
SHORT_DRAFTS = exposition(100, 240, 150, [80, 50, 20])  # 100 drafts of up to 3 positions, 240 tokens scheduled


def test_a_curve_whose_drafts_did_not_all_reach_the_deep_positions_is_marked_censored():
    assert survival_curve(parse_counters(METRICS_1)).censored is None
    short = survival_curve(parse_counters(SHORT_DRAFTS))
    assert short.survival == [0.8, 0.5, 0.2] and "shorter drafts never reached" in short.censored
    # Adaptive verification is invisible in the counters: the operator says so.
    with scripted_server("/metrics", [METRICS_1], content_type="text/plain") as url:
        curve = VLLMScraper(url, adaptive=True).scrape()
    assert curve.censored.startswith("drafts are trimmed after scheduling")
    assert curve.to_dict()["censored"] == curve.censored


# Per-request spec-decode metrics, shaped as vLLM writes them: ``PerRequestMetrics.speculative_decoding`` at the
# top level of a completion response (``vllm/entrypoints/generate/base/protocol.py`` @ 567b35aa), filled by
# ``build_spec_decoding_metrics`` (``vllm/entrypoints/generate/base/serving.py`` @ 015d1c9b). ``per_step_accepted``
# counts accepted drafts without the bonus token; ``per_step_drafted`` the drafts proposed at that step;
# ``acceptance_histogram[j]`` counts steps that accepted exactly j drafts. At ``summary`` the per-step arrays are
# null (non-streaming) or absent (the final stream chunk is dumped with exclude_none).
def spec(accepted, drafted, k=3, detailed=True, by_length=False):
    body = {
        "mean_acceptance_length": 1 + sum(accepted) / len(accepted),
        "draft_acceptance_rate": sum(accepted) / sum(drafted),
        "acceptance_histogram": [sum(a == j for a in accepted) for j in range(k + 1)],
        "num_spec_steps": len(accepted),
        "num_accepted_draft_tokens": sum(accepted),
        "num_draft_tokens": sum(drafted),
        "num_spec_tokens": k,
        "per_step_accepted": accepted if detailed else None,
        "per_step_drafted": drafted if detailed else None,
    }
    if by_length:  # newer builds (docs/features/speculative_decoding/acceptance_metrics.md @ 02cf515f)
        lengths = sorted(set(drafted))
        body["acceptance_histogram_by_draft_length"] = {
            str(d): [sum(a == j and n == d for a, n in zip(accepted, drafted)) for j in range(d + 1)] for d in lengths
        }
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "…"}],
            "usage": {"completion_tokens": 9}, "metrics": {"time_to_first_token_ms": None,
                                                           "speculative_decoding": body}}  # fmt: skip


def test_detailed_responses_resolve_the_censoring_of_short_drafts():
    # Step A proposed 3, accepted 1 (depth 2 rejected, depth 3 known 0); step B proposed 1 and accepted it
    # (censored past depth 1); step C proposed 3 and accepted all.
    curve = response_curve([spec([1, 1], [3, 1]), spec([3], [3]), {"choices": [], "metrics": None}])
    # Depth 1: 3 at risk, 0 fail. Depth 2: A and C at risk (B censored), A fails: 1/2. Depth 3: C only, survives.
    assert curve.survival == pytest.approx([1.0, 0.5, 0.5])
    assert curve.censored is None and curve.drafts == 3 and curve.acceptance_rate == pytest.approx(5 / 7)
    naive = [sum(a >= k for a in (1, 1, 3)) / 3 for k in (1, 2, 3)]
    assert naive == pytest.approx([1.0, 1 / 3, 1 / 3])  # what dividing by every step would have said
    assert curve.survival != pytest.approx(naive)


def test_a_depth_no_step_reached_ends_the_curve_and_summaries_join_detailed_steps():
    # Every step drafted 1 of k = 3 and accepted it: depth 1 survives, deeper ones were never observed.
    short = response_curve([spec([1, 1], [1, 1])])
    assert short.survival == pytest.approx([1.0]) and "no step reached depth 2" in short.censored
    # A summary response's full-width steps are steps of the same estimate, not dropped beside detailed ones.
    mixed = response_curve([spec([1], [3]), spec([3], [3], detailed=False)])
    assert mixed.survival == pytest.approx([1.0, 0.5, 0.5]) and mixed.censored is None
    assert mixed == response_curve([spec([1], [3]), spec([3], [3])])
    # A server that trims drafts after scheduling reports trimmed slots as drafted and rejected.
    trimmed = response_curve([spec([1], [3])], adaptive=True)
    assert trimmed.survival == pytest.approx([1.0, 0.0, 0.0]) and "trimmed after scheduling" in trimmed.censored


def test_summary_responses_are_exact_only_when_every_step_proposed_every_draft():
    full = response_curve([spec([0, 2, 3], [3, 3, 3], detailed=False)])
    assert full.survival == pytest.approx([2 / 3, 2 / 3, 1 / 3]) and full.censored is None
    # Two responses add their histograms bucket by bucket: the curve keeps k depths.
    both = response_curve([spec([0, 2, 3], [3, 3, 3], detailed=False), spec([3], [3], detailed=False)])
    assert both.survival == pytest.approx([3 / 4, 3 / 4, 2 / 4]) and both.drafts == 4
    short = response_curve([spec([0, 1], [3, 1], detailed=False)])
    assert short.censored and "lower bound" in short.censored


# vllm-project/vllm docs/features/speculative_decoding/acceptance_metrics.md @ 02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08:
# "acceptance_histogram_by_draft_length: Maps each observed proposed draft length k to a dense list of k + 1
# accepted-count buckets ... JSON object keys are strings"; "A k = 0 row means a verification step had no valid
# drafts left after adjustment".
def test_a_summary_by_draft_length_resolves_short_drafts_as_the_per_step_arrays_do():
    accepted, drafted = [1, 1, 3, 0], [3, 1, 3, 0]
    summary = response_curve([spec(accepted, drafted, detailed=False, by_length=True)])
    assert summary.survival == pytest.approx([1.0, 0.5, 0.5]) and summary.censored is None
    assert summary.survival == response_curve([spec(accepted, drafted)]).survival
    # Without the map the same summary could only count every step as proposing k = 3: a lower bound.
    assert "lower bound" in response_curve([spec(accepted, drafted, detailed=False)]).censored


# An older build's histogram map ({"0": 39, "1": 1, "3": 3}: acceptance_metrics.md @ cd199986) was read key by
# key as three steps of 0, 1 and 2 accepted drafts.
@pytest.mark.parametrize(
    "key, value, named",
    [("acceptance_histogram_by_draft_length", [1, 2], ": expected an object"),
     ("acceptance_histogram_by_draft_length", {"x": [1]}, ": key 'x' is not a draft length"),
     ("acceptance_histogram_by_draft_length", {"2": [1, 0]}, r"\['2'\]: expected a list of 3 counts"),
     ("acceptance_histogram_by_draft_length", {"1": [1, -1]}, r"\['1'\]\[1\]: expected a count"),
     ("acceptance_histogram", {"0": 39, "1": 1, "3": 3}, ": expected a list of counts"),
     ("acceptance_histogram", [1, True], r"\[1\]: expected a count"),
     ("acceptance_histogram", [1, 0, 0, 0, 2], ": expected at most 4 counts")],
)  # fmt: skip
def test_a_malformed_histogram_is_named_not_read(key, value, named):
    response = spec([1], [3], detailed=False)
    response["metrics"]["speculative_decoding"][key] = value
    with pytest.raises(ValueError, match=f"^response 1: metrics.speculative_decoding.{key}{named}"):
        response_curve([response])


def test_an_older_builds_per_choice_stats_are_named_with_that_builds_flag(tmp_path):
    # vllm-project/vllm docs/features/speculative_decoding/acceptance_metrics.md @
    # cd199986df1171c3255ce2e07e2c63be4385ef9f: --per-request-spec-decode-stats puts them on each choice.
    path = tmp_path / "responses.jsonl"
    stats = {"acceptance_histogram": {"0": 39, "1": 1, "3": 3}, "num_spec_steps": 43, "num_draft_tokens": 129}
    path.write_text(json.dumps({"choices": [{"index": 0, "speculative_decoding_stats": stats}]}) + "\n")
    with pytest.raises(ValueError, match=r"choices\[\]\.speculative_decoding_stats.*--per-request-spec-decode-stats"):
        read_responses(str(path))


def test_a_file_with_no_spec_decode_metrics_is_named_not_read_as_no_drafts(tmp_path):
    path = tmp_path / "responses.jsonl"
    # A stream saved without include_usage, and an n > 1 completion: neither carries the metrics.
    path.write_text(json.dumps({"choices": [{"index": 0, "delta": {}}]}) + "\n" + json.dumps({"metrics": None}) + "\n")
    with pytest.raises(ValueError, match=r"responses\.jsonl: no response carries metrics\.speculative_decoding"):
        read_responses(str(path))


def test_saved_responses_are_read_from_jsonl_and_bad_ones_named(tmp_path):
    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps(spec([1], [3])) + "\n\n" + json.dumps(spec([3], [3])) + "\n")
    assert read_responses(str(path)).survival == pytest.approx([1.0, 0.5, 0.5])
    bad = spec([4], [3])
    with pytest.raises(ValueError, match="response 1: a step accepted 4 of 3 drafts"):
        response_curve([bad])
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1: not JSON"):
        read_responses(str(path))


def test_collect_prints_the_curve_of_saved_responses(tmp_path):
    from click.testing import CliRunner

    from sparkgate.cli import main

    path = tmp_path / "responses.jsonl"
    path.write_text(json.dumps(spec([1], [3])) + "\n")
    result = CliRunner().invoke(main, ["collect", "--vllm-responses", str(path)])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output)
    assert line["vllm_responses"] == str(path) and line["survival"] == pytest.approx([1.0, 0.0, 0.0])
