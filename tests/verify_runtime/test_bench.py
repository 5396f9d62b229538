"""``sparkgate bench verify``: the verify benchmark's fields, and a window beyond gamma refused."""

import json

from click.testing import CliRunner

from sparkgate.cli import main


def test_bench_verify_runs_and_reports_its_fields():
    out = CliRunner().invoke(
        main,
        [
            "bench",
            "verify",
            "--batch",
            "4",
            "--gamma",
            "3",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--prompt-len",
            "8",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip().splitlines()[-1])
    assert result["peak_rss_mb"] > 0  # every benchmark reports its memory beside its timings
    for key in (
        "batch",
        "gamma",
        "rows_static",
        "rows_compact",
        "tier_rows_compact",
        "static_ms",
        "compact_ms",
        "time_ratio",
        "row_ratio",
    ):
        assert key in result
    assert result["rows_static"] == 16 and result["batch"] == 4
    assert result["tier_rows_compact"] >= result["rows_compact"]


def test_bench_verify_rejects_a_window_beyond_gamma():
    out = CliRunner().invoke(main, ["bench", "verify", "--gamma", "3", "--mean-window", "5"])
    assert out.exit_code != 0 and "--mean-window" in out.output
