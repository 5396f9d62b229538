"""``sparkgate bench controller``: the gate-evaluation and fleet-merge benchmark runs end to end."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.controller.bench import run


def test_benchmark_smoke():
    result = run(labels=20_000, replicas=5, repeats=2, step_s=5.0)
    assert result["labels"] == 89 * 7 * 32 and result["merge_replicas"] == 5
    assert result["history_s"] == 88 * 5.0 and 0 < result["window_labels"] < result["labels"]
    keys = {
        "eval_ms",
        "eval_from_rows_ms",
        "eval_cpu_ratio",
        "eval_slid_cpu_ratio",
        "report_ms",
        "merge_ms",
        "peak_rss_mb",
        "load_avg_1m",
    }
    assert keys <= result.keys() and len(result["eval_runs_ms"]) == 2
    assert result["eval_window_read"] in ("slid", "fresh")


@pytest.mark.parametrize("option", ["--replicas", "--repeats"])
def test_bench_controller_refuses_a_count_of_zero(option):
    argv = ["bench", "controller", "--labels", "500", "--replicas", "2", "--repeats", "1", option, "0", "--json"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2 and f"Invalid value for '{option}': 0 is not in the range x>=1" in result.output
    assert "Traceback" not in result.output and not result.stdout
