"""``sparkgate bench ingest``: the ingest benchmark runs end to end and reports its figures."""

from __future__ import annotations

import json

import pytest
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
    assert figures["append_rows_per_s"] > 0 and figures["batch_share_of_append"] > 0


def test_the_append_ceiling_stores_what_the_batch_path_stores(tmp_path):
    from sparkgate.collectors import bench
    from sparkgate.collectors.store import Store

    batches = bench._wire_batches(4 * bench._ROWS_PER_STEP, 2, "r")
    rows = [
        bench.bench_batch(tmp_path / "batch.duckdb", batches)[0],
        bench.bench_append(tmp_path / "append.duckdb", batches)[0],
    ]
    counts = []
    for name in ("batch", "append"):
        with Store(tmp_path / f"{name}.duckdb") as store:
            counts.append({t: n for t, n in store.counts().items() if t in ("steps", "requests", "depth_labels")})
    assert rows[0] == rows[1] == counts[0]["depth_labels"] and counts[0] == counts[1]


@pytest.mark.parametrize(
    ("option", "value"),
    [("--rowwise-rows", "0"), ("--http-rows", "0"), ("--clients", "0"), ("--batch-steps", "0"),
     ("--body-steps", "0"), ("--body-steps", "3196")],
)  # fmt: skip
def test_bench_ingest_refuses_a_size_it_cannot_measure(option, value):
    small = ["--rows", "500", "--rowwise-rows", "500", "--http-rows", "500", "--batch-steps", "2", "--body-steps", "2"]
    result = CliRunner().invoke(main, ["bench", "ingest", *small, option, value, "--json"])
    assert result.exit_code == 2 and f"Invalid value for '{option}': {value} is not in the range" in result.output
    assert "Traceback" not in result.output and not result.stdout


def test_the_largest_body_the_option_allows_fits_the_endpoints_limit():
    # MAX_BODY_STEPS comes from a step's estimated size; a body of that many steps, built as the HTTP arm
    # builds it, is measured here, with room for longer ids in later bodies.
    from sparkgate.collectors import bench
    from sparkgate.collectors.ingest_api import DEFAULT_MAX_BODY

    (wire,) = bench._wire_batches(bench.MAX_BODY_STEPS * bench._ROWS_PER_STEP, bench.MAX_BODY_STEPS, "http-9")
    assert wire.num_rows == bench.MAX_BODY_STEPS
    assert len(bench._BODIES["ndjson"][1](wire)) <= 0.97 * DEFAULT_MAX_BODY
