"""The sparkgate ingest / export / prune / collect commands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.store import Store
from sparkgate.collectors.vllm import VLLMScraper
from sparkgate.collectors.wire import from_ndjson
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


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (
            ["prune", "--db", "DB", "--older-than-days", "1e308"],
            "'--older-than-days': 1e+308 is not in the range 0<=x<=",
        ),
        (["export", "--db", "DB", "--out", ""], "Invalid value for '--out': '' is empty"),
    ],
)
def test_export_and_prune_refuse_bad_input_leaving_the_store_as_it_was(tmp_path, argv, named):
    db = tmp_path / "cli.duckdb"
    with Store(db) as store:
        Ingestor(store).ingest(from_ndjson(json.dumps(step(1).to_dict()).encode()), "test")
    before = db.read_bytes()
    result = CliRunner().invoke(main, [str(db) if a == "DB" else a for a in argv])
    assert result.exit_code == 2 and named in result.output, result.output
    assert "Traceback" not in result.output and not result.stdout
    assert db.read_bytes() == before and sorted(tmp_path.iterdir()) == [db]


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


CLOSED = "http://127.0.0.1:1"  # nothing listens on port 1


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--vllm", "nope"], "Invalid value for '--vllm': 'nope' is not an http:// or https:// URL"),
        (["--trtllm", "ftp://host"], "Invalid value for '--trtllm': 'ftp://host'"),
        (["--db", "DB", "--sglang", "http://host:99999"], "Invalid value for '--sglang': 'http://host:99999'"),
        (["--db", "DB", "--sglang", "http://"], "Invalid value for '--sglang': 'http://'"),
        (["--vllm", CLOSED, "--snapshot-dir", "SNAP"], "--snapshot-dir needs --db"),
        (["--db", "DB", "--vllm", CLOSED], "--db stores --sglang records: give --sglang, or leave --db out"),
        (["--db", "DB", "--sglang", CLOSED, "--snapshot-dir", "UNDER_A_FILE"], "Invalid value for '--snapshot-dir'"),
        # Usage is checked before the saved responses are read (and printed).
        (["--vllm-responses", "RESPONSES", "--sglang", CLOSED], "--sglang needs --db"),
    ],
)
def test_collect_refuses_bad_input_before_polling_or_writing(tmp_path, argv, named):
    responses = tmp_path / "responses.jsonl"
    responses.write_text("not JSON\n")
    paths = {"DB": tmp_path / "c.duckdb", "SNAP": tmp_path / "snap", "RESPONSES": responses,
             "UNDER_A_FILE": responses / "snap"}  # fmt: skip
    argv = [str(paths.get(a, a)) for a in argv]
    result = CliRunner().invoke(main, ["collect", *argv, "--polls", "1", "--interval", "0"])
    assert result.exit_code == 2 and named in result.output, result.output
    assert "Traceback" not in result.output and not result.stdout
    assert not paths["DB"].exists() and not paths["SNAP"].exists()


def test_collect_fails_naming_each_server_that_no_poll_reached(tmp_path):
    db = tmp_path / "collect.duckdb"
    with scripted_server("/server_info", [server_info([R1, R2])]) as url:
        argv = ["collect", "--db", str(db), "--sglang", url, "--vllm", CLOSED, "--polls", "2", "--interval", "0"]
        result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1 and "Traceback" not in result.output
    error = result.stderr.splitlines()[-1]
    assert error.startswith(f"Error: --vllm {CLOSED}: no poll succeeded (last error: ") and url not in error
    assert [json.loads(line)["steps"] for line in result.stdout.splitlines()] == [2, 0]
    with Store(db) as store:
        assert store.counts()["steps"] == 2  # what the server that answered sent is kept


def test_collect_succeeds_when_a_server_answers_after_failing_first(tmp_path):
    with scripted_server("/server_info", ["not JSON", server_info([R1, R2])]) as url:
        argv = ["collect", "--db", str(tmp_path / "c.duckdb"), "--sglang", url, "--polls", "2", "--interval", "0"]
        result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert '"error"' in result.stderr and json.loads(result.stdout)["steps"] == 2


def test_collect_until_interrupted_fails_when_a_server_never_answered(monkeypatch):
    outcomes = iter([ConnectionError("refused"), KeyboardInterrupt()])

    def scrape(self):
        raise next(outcomes)

    monkeypatch.setattr(VLLMScraper, "scrape", scrape)
    result = CliRunner().invoke(main, ["collect", "--vllm", CLOSED, "--interval", "0"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines()[-1] == f"Error: --vllm {CLOSED}: no poll succeeded (last error: refused)"
