"""Smoke tests of `sparkgate bench scheduler` (no timing thresholds)."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.verify_runtime import bench_scheduler
from tests.verify_runtime.refusals import refused

ARGS = ["--batch", "4", "--gamma", "3", "--steps", "3", "--json"]


def test_bench_times_every_policy_against_a_real_static_verify():
    result = CliRunner().invoke(bench_scheduler.bench_scheduler, ARGS)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["peak_rss_mb"] > 0  # every benchmark reports its memory beside its timings
    assert set(report["policies"]) == {"fixed", "threshold", "cost_aware", "cost_aware_lag2"}
    assert report["scheduler_ms"] == report["policies"]["cost_aware"]["median_ms"] > 0
    assert report["verify_ms"] > 0
    assert report["schedule_fraction"] == report["scheduler_ms"] / report["verify_ms"]


def test_bench_divides_by_the_runtime_verify_time(monkeypatch):
    monkeypatch.setattr(bench_scheduler, "time_static_verify", lambda batch, gamma, device="cpu": 10.0)
    result = CliRunner().invoke(main, ["bench", "scheduler", *ARGS])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verify_ms"] == 10.0
    assert report["schedule_fraction"] == report["scheduler_ms"] / 10.0


def test_bench_text_output(monkeypatch):
    monkeypatch.setattr(bench_scheduler, "time_static_verify", lambda batch, gamma, device="cpu": 10.0)
    result = CliRunner().invoke(bench_scheduler.bench_scheduler, ARGS[:-1])
    assert result.exit_code == 0 and "schedule_fraction" in result.output


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--batch", "0"], "--batch", "0 is not in the range x>=1"),
        (["--steps", "0"], "--steps", "0 is not in the range x>=1"),
        (["--gamma", "600"], "--gamma", "a block of --gamma 600 + 1: 665 positions, but the target holds 512"),
    ],
)
def test_bench_refuses_bad_input_before_timing(args, option, named):
    output = refused(["bench", "scheduler", *args])
    assert f"'{option}'" in output and named in output


def test_bench_refuses_a_device_torch_does_not_know():
    output = refused(["bench", "scheduler", "--device", "foo"])
    assert "Invalid value for '--device'" in output and "device string: foo" in output
