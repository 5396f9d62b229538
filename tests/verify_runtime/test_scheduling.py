"""The runtime driven by the policies package: scheduler wiring, lag, the profiler."""

import dataclasses
import json
import math
import os

import pytest
import torch
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.policies.cost_model import StepsPerSecondTable
from sparkgate.policies.window import CostAwareScheduler, WindowDecision
from sparkgate.verify_runtime.drafters import ModelDrafter, NGramDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.model import model_version
from sparkgate.verify_runtime.profiler import (
    ForcedWindows,
    even_windows,
    profile_model,
    step_version,
)
from tests.conftest import tiny_model
from tests.verify_runtime.reference import greedy_decode


def flat_table(max_tokens=4096):
    """Verification is free: the scheduler should verify everything."""
    return StepsPerSecondTable(
        sample_batch_tokens=(1, max_tokens), sample_steps_per_sec=(100.0, 100.0), max_batch_tokens=max_tokens
    )


def test_cost_aware_compact_reproduces_greedy_and_logs_predictions(target):
    records = []
    engine = Engine(
        target,
        ModelDrafter(target, noise=1.5),
        EngineConfig(gamma=4, max_batch=3),
        policy=CostAwareScheduler(flat_table()),
        sink=records.append,
    )
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    for i, p in enumerate(prompts):
        engine.submit(Request(str(i), p, 12, mode="compact", stop_at_eos=False))
    out = engine.run()
    for i, p in enumerate(prompts):
        assert out[str(i)] == greedy_decode(target, p, 12)
    assert all(isinstance(r.predicted_step_ms, float) and r.predicted_step_ms > 0 for r in records)
    # free verification: every request verifies the whole block
    assert all(row.window == 4 for r in records for row in r.requests)


class RecordingLag:
    """A lagged policy that remembers what it was shown."""

    lag = 2

    def __init__(self):
        self.seen = []

    def __call__(self, survival, ctx):
        self.seen.append((survival.clone(), ctx.lagged_survival.clone()))
        return WindowDecision(torch.full((survival.shape[0],), ctx.gamma))


def test_lagged_policies_see_the_survivals_of_two_steps_ago(target):
    policy = RecordingLag()
    engine = Engine(target, ModelDrafter(target, noise=1.5), EngineConfig(gamma=3, max_batch=1), policy=policy)
    engine.submit(Request("a", [1, 2], 20, stop_at_eos=False))
    for _ in range(4):
        engine.step()
    (s0, l0), (s1, l1), (_, l2), (_, l3) = policy.seen
    assert torch.equal(l0, torch.ones_like(s0)) and torch.equal(l1, torch.ones_like(s1))
    assert torch.equal(l2, s0) and torch.equal(l3, s1)


def test_even_windows_spread_the_budget():
    assert even_windows(4, 7, 10) == [3, 3, 2, 2]
    assert sum(even_windows(5, 3, 15)) == 15
    with pytest.raises(ValueError, match="budget 29 outside"):
        even_windows(4, 7, 29)


def test_profile_times_whole_decode_steps_and_fits_a_table():
    model = tiny_model(seed=2).float()
    drafter = NGramDrafter(model.args.vocab_size)
    result = profile_model(
        model, drafter, batches=(1, 4), fractions=(0.0, 0.5, 1.0), gamma=3, repeats=2, context=12, progress=False
    )
    assert len(result.samples) == 6
    # The table is for this target with this drafter: both set the step time.
    assert result.table.meta.model == step_version(model, drafter) == f"{model_version(model)}+{drafter.version}"
    assert result.table.meta.hardware["device"] == "cpu"
    assert [(s.batch_size, s.verify_rows) for s in result.samples] == [(1, 1), (1, 3), (1, 4), (4, 4), (4, 10), (4, 16)]
    assert all(s.seconds > 0 for s in result.samples)
    assert math.isfinite(result.median_rel_error) and result.median_rel_error >= 0


def test_forced_windows_drive_the_engine_at_the_profiled_budget():
    model = tiny_model(seed=2).float()
    records = []
    engine = Engine(
        model,
        NGramDrafter(model.args.vocab_size),
        EngineConfig(gamma=3, max_batch=3, default_mode="compact"),
        policy=ForcedWindows([0, 2, 3]),
        sink=records.append,
    )
    for i in range(3):
        engine.submit(Request(f"r{i}", [1, 2, 3, 4], 8, seed=i, stop_at_eos=False))
    engine.step()
    assert [r.window for r in records[0].requests] == [0, 2, 3] and records[0].verify_rows == 1 + 3 + 4


def test_profile_command_writes_table_and_plot(tmp_path):
    out = tmp_path / "table.json"
    res = CliRunner().invoke(
        main,
        ["profile", "--out", str(out), "--batch-sizes", "1,2", "--fractions", "0,1", "--repeats", "1", "--gamma", "3"],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["samples"] == 4 and (tmp_path / "table.png").stat().st_size > 0
    table = json.loads(out.read_text())
    assert {"bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds", "meta"} <= set(table)


def test_profile_command_rejects_bad_fractions_and_contexts(tmp_path):
    res = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "t.json"), "--fractions", "0,1.5"])
    assert res.exit_code != 0 and "fractions must lie in [0, 1]" in res.output
    res = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "t.json"), "--context", "500"])
    assert res.exit_code == 2 and "--context 500" in res.output and "needs 556 positions" in res.output
    assert not (tmp_path / "t.json").exists()


def test_bench_e2e_runs_and_reports_ratios(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKGATE_CACHE", str(tmp_path))
    res = CliRunner().invoke(
        main, ["bench", "e2e", "--batches", "1,2", "--waves", "1", "--max-new-tokens", "4", "--rounds", "2", "--json"]
    )
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["prefill_threads"] == os.cpu_count() and summary["threads"] == 1
    for batch in ("1", "2"):
        row = summary["batches"][batch]
        assert set(row) == {"static", "fixed_short", "cost_aware", "foresight_decode_ratio", "foresight_wall_ratio"}
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
        stages = row["static"]["stage_ms"]
        assert set(stages) == {"draft", "schedule", "verify", "accept"} and min(stages.values()) > 0
        # Decode steps are part of the wall time, so their rate is the higher one.
        assert all(row[arm]["decode_tokens_per_s"] >= row[arm]["tokens_per_s"] for arm in ("static", "cost_aware"))
    # Every other round runs the arms in reverse, so a drift in machine speed does not favour one arm.
    order = [line.split()[4] for line in res.stderr.splitlines() if line.startswith("bench e2e: batch   1")]
    assert order == ["static", "fixed_short", "cost_aware", "cost_aware", "fixed_short", "static"]


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


def test_profile_command_takes_a_tier_grid(tmp_path):
    out = tmp_path / "table.json"
    res = CliRunner().invoke(
        main,
        [
            "profile",
            "--out",
            str(out),
            "--batch-sizes",
            "2",
            "--fractions",
            "0,1",
            "--repeats",
            "1",
            "--gamma",
            "3",
            "--tiers",
            "4,16",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["meta"]["tiers"] == [4, 16]
    bad = CliRunner().invoke(main, ["profile", "--out", str(out), "--tiers", "16,8"])
    assert bad.exit_code != 0 and "strictly increasing" in bad.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_graph_tiers_are_refused_off_cuda_with_a_usage_error(tmp_path):
    for args in (
        ["bench", "e2e", "--graphs"],
        ["profile", "--out", str(tmp_path / "t.json"), "--graphs"],
        ["bench", "verify", "--graphs"],
    ):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and "CUDA-graph tiers need a CUDA device" in res.output, (args, res.output)
    res = CliRunner().invoke(main, ["bench", "e2e", "--device", "tpu9"])
    assert res.exit_code == 2 and "--device" in res.output
    assert not (tmp_path / "t.json").exists()
