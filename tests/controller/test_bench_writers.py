"""Smoke test of ``sparkgate bench writers`` (no timing thresholds: it must run and report both arms)."""

import json

import pytest
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


@pytest.mark.parametrize(
    ("option", "value", "range_"),
    [("--writers", "0", "x>=1"), ("--readers", "-1", "x>=0"), ("--seconds", "0.0", "x>0"),
     ("--body-steps", "0", "1<=x<=6100"), ("--body-steps", "6101", "1<=x<=6100"), ("--rounds", "0", "x>=1"),
     ("--report-every-s", "0.0", "x>0")],
)  # fmt: skip
def test_bench_writers_names_the_option_and_value_out_of_range(option, value, range_):
    small = ["--writers", "1", "--readers", "0", "--seconds", "0.1", "--body-steps", "2", "--rounds", "1"]
    result = CliRunner().invoke(main, ["bench", "writers", *small, option, value])
    assert result.exit_code == 2 and "Traceback" not in result.output and not result.stdout
    assert f"Invalid value for '{option}': {value} is not in the range {range_}" in result.output


def test_the_largest_body_the_option_allows_fits_the_endpoints_limit():
    # MAX_BODY_STEPS comes from a step's estimated size; a writer's last body of that many steps (the
    # largest step ids an arm posts) is measured here.
    from sparkgate.collectors.ingest_api import DEFAULT_MAX_BODY
    from sparkgate.controller import bench_writers

    steps = bench_writers.MAX_BODY_STEPS
    (body,) = bench_writers._bodies(99, 1, steps, first=40 * steps)
    assert len(body) <= 0.97 * DEFAULT_MAX_BODY
