"""The sparkgate ingest / export / prune / collect commands."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.store import Store
from tests.collectors.loopback import scripted_server
from tests.collectors.strategies import compact_row, step
from tests.conftest import R1, R2, server_info


def write_ndjson(path, records, extra_lines=()):
    lines = [json.dumps(r.to_dict()) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_ingest_export_and_prune(tmp_path):
    db = tmp_path / "cli.duckdb"
    good = write_ndjson(tmp_path / "a.ndjson", [step(i, requests=[compact_row(request_id=f"r{i}")]) for i in range(5)])
    mixed = write_ndjson(tmp_path / "b.ndjson", [step(10), step(11, gamma=0)], ["{oops"])
    runner = CliRunner()
    result = runner.invoke(main, ["ingest", "--db", str(db), "--batch-lines", "2", str(good), str(mixed)])
    assert result.exit_code == 0, result.output
    summaries = [json.loads(line) for line in result.stdout.splitlines()]
    assert summaries[0] == {"path": str(good), "steps": 5, "requests": 5, "depth_labels": 20, "quarantined": 0}
    assert (summaries[1]["steps"], summaries[1]["quarantined"]) == (1, 2)
    assert "record 1: gamma=0" in result.stderr and "record 2: <line>" in result.stderr
    strict = runner.invoke(main, ["ingest", "--db", str(db), "--strict", str(mixed)])
    assert strict.exit_code == 1  # everything in it is now a duplicate or invalid

    exported = runner.invoke(main, ["export", "--db", str(db), "--out", str(tmp_path / "out")])
    assert json.loads(exported.stdout)["depth_labels"] == 20
    assert list((tmp_path / "out" / "steps").glob("date=*/replica_id=replica-a/*.parquet"))
    bad_since = runner.invoke(main, ["export", "--db", str(db), "--out", str(tmp_path / "o"), "--since", "May 1"])
    assert bad_since.exit_code == 2 and "--since='May 1'" in bad_since.output

    pruned = runner.invoke(main, ["prune", "--db", str(db), "--older-than-days", "0"])
    assert json.loads(pruned.stdout)["deleted"]["steps"] == 6
    with Store(db) as store:
        assert store.counts()["steps"] == 0


def test_collect_sglang_once(tmp_path):
    db = tmp_path / "collect.duckdb"
    with scripted_server("/server_info", [server_info([R1, R2])]) as url:
        result = CliRunner().invoke(
            main,
            [
                "collect",
                "--db",
                str(db),
                "--sglang",
                url,
                "--polls",
                "2",
                "--interval",
                "0",
                "--snapshot-dir",
                str(tmp_path / "snap"),
            ],
        )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["steps"] for line in lines] == [2, 0]
    assert (tmp_path / "snap" / "CURRENT").exists()


def test_collect_needs_a_source():
    result = CliRunner().invoke(main, ["collect"])
    assert result.exit_code == 2 and "--sglang, --vllm, --vllm-responses or --trtllm" in result.output
