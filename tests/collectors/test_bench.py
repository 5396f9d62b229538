"""``sparkgate bench ingest``: the ingest benchmark runs end to end and reports its figures."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sparkgate.cli import main


def test_bench_ingest_smoke():
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "ingest",
            "--rows",
            "5000",
            "--rowwise-rows",
            "500",
            "--http-rows",
            "2000",
            "--batch-steps",
            "8",
            "--body-steps",
            "4",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["peak_rss_mb"] > 0  # every benchmark reports its memory beside its timings
    for field in ("rows", "batch_rows_per_s", "rowwise_rows_per_s", "speedup", "http_rows_per_s", "http_lost_rows"):
        assert field in figures
    assert figures["rows"] > 0 and figures["http_lost_rows"] == 0
