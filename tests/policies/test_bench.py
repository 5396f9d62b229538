"""Smoke tests of `sparkgate bench scheduler` (no timing thresholds)."""
import json
import sys
import types

from click.testing import CliRunner

from controller.cli import main
from policies.bench import bench_scheduler

ARGS = ["--batch", "4", "--gamma", "3", "--steps", "3", "--json"]


def test_bench_without_the_runtime_reports_scheduler_figures_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "verify_runtime.bench", None)  # import fails as if absent
    result = CliRunner().invoke(bench_scheduler, ARGS)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verify_ms"] is None and report["schedule_fraction"] is None
    assert "scheduler figures only" in report["note"]
    assert set(report["policies"]) == {"fixed", "threshold", "cost_aware", "cost_aware_lag2"}
    assert report["scheduler_ms"] == report["policies"]["cost_aware"]["median_ms"] > 0


def test_bench_divides_by_the_runtime_verify_time(monkeypatch):
    stub = types.ModuleType("verify_runtime.bench")
    stub.time_static_verify = lambda batch, gamma, device="cpu": 10.0
    monkeypatch.setitem(sys.modules, "verify_runtime.bench", stub)
    result = CliRunner().invoke(main, ["bench", "scheduler", *ARGS])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["verify_ms"] == 10.0
    assert report["schedule_fraction"] == report["scheduler_ms"] / 10.0


def test_bench_text_output_and_bad_arguments(monkeypatch):
    monkeypatch.setitem(sys.modules, "verify_runtime.bench", None)
    result = CliRunner().invoke(bench_scheduler, ARGS[:-1])
    assert result.exit_code == 0 and "verify_ms: null" in result.output
    assert CliRunner().invoke(bench_scheduler, ["--batch", "0"]).exit_code != 0
