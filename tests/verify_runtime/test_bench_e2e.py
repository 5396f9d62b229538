"""``sparkgate bench e2e``: the end-to-end benchmark's report, the foresight and replay ratios by hand, and bad
input refused before any profiling or timing."""

import dataclasses
import json
import os

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from tests.verify_runtime.refusals import refused


def test_bench_e2e_runs_and_reports_ratios(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKGATE_CACHE", str(tmp_path))
    res = CliRunner().invoke(
        main, ["bench", "e2e", "--batches", "1,2", "--waves", "1", "--max-new-tokens", "4", "--rounds", "2", "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["prefill_threads"] == os.cpu_count() and summary["threads"] == 1
    assert summary["peak_rss_mb"] > 50
    for batch in ("1", "2"):
        row = summary["batches"][batch]
        figures = {"static", "fixed_short", "cost_aware", "foresight_decode_ratio", "foresight_wall_ratio"}
        assert set(row) == figures | {"peak_rss_mb"} and 50 < row["peak_rss_mb"] <= summary["peak_rss_mb"]
        assert row["foresight_decode_ratio"] >= 1.0  # foresight never verifies more rows than static
        # Prefill does not shrink, so the wall-clock bound lies between 1 and the decode-step bound.
        assert 1.0 <= row["foresight_wall_ratio"] <= row["foresight_decode_ratio"]
        assert row["cost_aware"]["replay_decode_ratio"] > 0
        assert row["static"]["mean_window"] == 7.0 and row["fixed_short"]["mean_window"] <= 2.0
        assert row["cost_aware"]["ratio_to_static"] > 0 and row["cost_aware"]["decode_ratio_to_static"] > 0
        paired = row["cost_aware"]["ratio_to_static_runs"]  # one per round; the reported ratio is their median
        assert len(paired) == 2 and min(paired) <= row["cost_aware"]["ratio_to_static"] <= max(paired)
        # The fastest-run ratio pits each arm's fastest run against static's fastest.
        for arm in ("static", "cost_aware"):
            assert row[arm]["best_tokens_per_s"] == max(row[arm]["tokens_per_s_runs"])
        expected = row["cost_aware"]["best_tokens_per_s"] / row["static"]["best_tokens_per_s"]
        assert row["cost_aware"]["best_ratio_to_static"] == pytest.approx(expected, abs=5e-4)
        # The verdict: the paired rounds over the foresight bound, with an interval two rounds cannot give.
        share = row["cost_aware"]["share_of_foresight"]
        assert share["rounds"] == 2 and share["low"] is None and share["met"] is None
        assert share["target"] == (0.97 if batch == "1" else None)
        expected_share = sorted(r / row["foresight_wall_ratio"] for r in paired)
        assert share["median"] == pytest.approx(sum(expected_share) / 2, abs=2e-3)
        assert all(row[arm]["cpu_ms_per_token"] > 0 for arm in ("static", "cost_aware"))
        assert row["cost_aware"]["cpu_ratio_to_static"]["rounds"] == 2
        stages = row["static"]["stage_ms"]
        assert set(stages) == {"draft", "schedule", "verify", "accept"} and min(stages.values()) > 0
        # Decode steps are part of the wall time, so their rate is the higher one.
        assert all(row[arm]["decode_tokens_per_s"] >= row[arm]["tokens_per_s"] for arm in ("static", "cost_aware"))
    # The arms step in lockstep, in reverse every other round, so no arm always runs first.
    orders = [
        line.split(": ")[-1].split() for line in res.stderr.splitlines() if line.startswith("bench e2e: batch   1")
    ]
    assert orders == [["static", "fixed_short", "cost_aware"], ["cost_aware", "fixed_short", "static"]]


def test_foresight_wall_ratio_dilutes_the_decode_gain_by_what_no_policy_changes():
    from sparkgate.verify_runtime.bench_e2e import foresight_wall_ratio

    assert foresight_wall_ratio(1.3, 1.0) == pytest.approx(1.3)  # all decode: the decode gain
    assert foresight_wall_ratio(1.3, 0.0) == pytest.approx(1.0)  # no decode: nothing to gain
    # 80% decode at 1.25x: 0.2 + 0.8 / 1.25 = 0.84 of static's time.
    assert foresight_wall_ratio(1.25, 0.8) == pytest.approx(1 / 0.84)


def test_replay_prices_windows_on_static_steps_by_hand():
    """Two requests with a* = 3 and 0 at γ = 4, priced 1 ms per step plus 1 ms per row."""
    from sparkgate.policies.cost_model import AdditiveCostTable
    from sparkgate.verify_runtime.bench_e2e import (
        foresight_decode_ratio,
        replay_decode_ratio,
    )
    from tests.collectors.strategies import compact_row, step

    table = AdditiveCostTable(
        bias_seconds=0.001, bs_probes=(1, 8), alpha_seconds=(0.0, 0.0), m_probes=(1, 64), theta_seconds=(0.001, 0.064)
    )
    rows = [dataclasses.replace(compact_row(4, 4, a, f"r{a}"), mode="static", full_accept=a) for a in (3, 0)]
    record = step(1, 4, rows)  # static: 10 rows, 11 ms, 3 + 1 + 0 + 1 = 5 tokens
    # Windows (3, 0): the same 5 tokens from 5 rows (6 ms) -- foresight.
    assert foresight_decode_ratio([record], table) == pytest.approx(11 / 6)
    # Windows (1, 1): 1 + 1 + 0 + 1 = 3 tokens from 4 rows (5 ms): (3 / 5) / (5 / 11).
    assert replay_decode_ratio([record], table, lambda r: [1, 1]) == pytest.approx((3 / 5) / (5 / 11))
    # Verifying everything is static itself.
    assert replay_decode_ratio([record], table, lambda r: [4, 4]) == pytest.approx(1.0)


def test_the_verdict_is_the_far_end_of_the_interval():
    from sparkgate.verify_runtime.bench_verdict import verdict

    nine = [0.96, 0.97, 0.98, 0.99, 1.0, 1.01, 1.02, 1.03, 1.04]
    assert verdict(nine, 0.95) == {"median": 1.0, "low": 0.97, "high": 1.03, "level": 0.9, "rounds": 9,
                                   "target": 0.95, "met": True}  # fmt: skip
    assert verdict([x - 0.03 for x in nine], 0.95)["met"] is False  # its median 0.97 passes; its interval does not
    # smaller is better (a time ratio): the upper end must lie at or under the target
    assert verdict(nine, 1.03, at_most=True)["met"] is True and verdict(nine, 1.02, at_most=True)["met"] is False
    assert verdict([1.0, 1.0], 2.0)["met"] is None  # two rounds give no interval, so no verdict


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--gamma", "9"], "--gamma", "9 is beyond the drafter's max_gamma"),
        (["--max-new-tokens", "500"], "--max-new-tokens", "prompts of 96 tokens, --max-new-tokens 500 and --gamma 7"),
        (["--goodput-rates", "1,a"], "--goodput-rates", "'a' is not a valid number"),
        (["--goodput-rates", "0"], "--goodput-rates", "0.0 is not in the range x>0"),
        (["--goodput-rates", "1", "--goodput-max-new-tokens", "500"], "--goodput-max-new-tokens", "602 positions"),
        (["--tpot-slo-ms", "0"], "--tpot-slo-ms", "0.0 is not in the range x>0"),
        (["--rounds", "0"], "--rounds", "0 is not in the range x>=1"),
    ],
)
def test_bench_e2e_refuses_bad_input_before_profiling_or_timing(tmp_path, monkeypatch, args, option, named):
    monkeypatch.setenv("SPARKGATE_CACHE", str(tmp_path))
    output = refused(["bench", "e2e", "--batches", "1", *args])
    assert f"'{option}'" in output and named in output and not any(tmp_path.iterdir())
