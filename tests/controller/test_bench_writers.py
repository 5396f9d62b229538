"""Smoke test of ``sparkgate bench writers`` (no timing thresholds: it must run and report both arms)."""

import json

from click.testing import CliRunner

from sparkgate.cli import main


def test_bench_writers_reports_both_arms_and_their_p99_ratio():
    args = ["bench", "writers", "--writers", "2", "--readers", "1", "--seconds", "0.5", "--body-steps", "4",
            "--rounds", "2", "--report-every-s", "0.2"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["peak_rss_mb"] > 0  # every benchmark reports its memory beside its timings
    assert set(report["arms"]) == {"plain", "with_report"}
    for arm in report["arms"].values():
        assert len(arm["runs"]) == 2 and all(r["requests"] > 0 and r["records_per_s"] > 0 for r in arm["runs"])
    assert len(report["p99_ratio_runs"]) == 2 and report["p99_ratio_range"][0] <= report["p99_ratio_median"]
    assert isinstance(report["met"], bool)
