"""``sparkgate dashboard``: Streamlit started headless on loopback with the app's own arguments, once its
inputs are checked."""

from __future__ import annotations

import socket

import duckdb
import pytest
from click.testing import CliRunner

from sparkgate.cli import main


def test_dashboard_command_runs_streamlit_headless_on_loopback(monkeypatch, fixture_store):
    started = []
    monkeypatch.setattr("os.execv", lambda path, argv: started.append(argv))
    result = CliRunner().invoke(main, ["dashboard", "--db", str(fixture_store.db), "--port", "0"])
    assert result.exit_code == 0, result.output
    argv = started[0]
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    assert argv[argv.index("--") + 1 :][:2] == ["--db", str(fixture_store.db)]
    missing = CliRunner().invoke(main, ["dashboard"])
    assert missing.exit_code == 2 and "exactly one of" in missing.output


def test_the_dashboards_refuse_to_listen_beyond_loopback_without_a_proxy(tmp_path):
    refused = CliRunner().invoke(main, ["dashboard", "--db", str(tmp_path / "x.duckdb"), "--host", "0.0.0.0"])
    assert refused.exit_code == 2 and "no authentication of their own" in refused.output
    assert "--behind-auth-proxy" in refused.output


def test_a_store_and_snapshots_not_there_yet_are_left_to_the_pages(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr("os.execv", lambda path, argv: started.append(argv))
    for source in (["--db", str(tmp_path / "later.duckdb")], ["--snapshot-dir", str(tmp_path / "later")]):
        assert CliRunner().invoke(main, ["dashboard", *source, "--port", "0"]).exit_code == 0
    assert len(started) == 2 and not list(tmp_path.iterdir())


@pytest.fixture
def files(tmp_path):
    (tmp_path / "text.duckdb").write_text("not a database\n")
    with duckdb.connect(str(tmp_path / "foreign.duckdb")) as con:
        con.execute("CREATE TABLE invoices (id INTEGER)")
    duckdb.connect(str(tmp_path / "blank.duckdb")).close()
    (tmp_path / "bad.yaml").write_text("gates: 5\n")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "code", "named"),
    [
        (["--db", "DIR/text.duckdb"], 2, "Invalid value for '--db': 'DIR/text.duckdb' is not a DuckDB file"),
        (["--db", "DIR/foreign.duckdb"], 2, "'DIR/foreign.duckdb': not a sparkgate store (it holds other tables: inv"),
        (["--db", "DIR/blank.duckdb"], 2, "'DIR/blank.duckdb': an empty database, not a sparkgate store"),
        (["--db", "DIR/none/x.duckdb"], 2, "Invalid value for '--db': 'DIR/none/x.duckdb': no folder 'DIR/none'"),
        (["--controller", "127.0.0.1:8470"], 2, "Invalid value for '--controller': '127.0.0.1:8470'"),
        (["--snapshot-dir", "DIR/s", "--policy", "DIR/bad.yaml"], 2,
         "Invalid value for '--policy': DIR/bad.yaml: gates: expected a list, got 5"),
        (["--snapshot-dir", "DIR/s", "--port", "HELD"], 1, "--host/--port 127.0.0.1:HELD: cannot listen there"),
        (["--snapshot-dir", "DIR/s", "--host", "localhost", "--port", "HELD"], 1,
         "--host/--port localhost:HELD: cannot listen there (127.0.0.1: Address already in use)"),
        (["--snapshot-dir", "DIR/s", "--host", "", "--behind-auth-proxy"], 1, "--host '': give the address"),
    ],
)  # fmt: skip
def test_bad_input_is_named_before_streamlit_starts(monkeypatch, files, argv, code, named):
    started = []
    monkeypatch.setattr("os.execv", lambda path, argv: started.append(argv))
    before = {p: p.read_bytes() for p in files.iterdir()}
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = str(held.getsockname()[1])

        def filled(text: str) -> str:
            return text.replace("DIR", str(files)).replace("HELD", port)

        result = CliRunner().invoke(main, ["dashboard", *map(filled, argv)])
    assert result.exit_code == code and filled(named) in result.output, result.output
    assert "Traceback" not in result.output and not started
    assert {p: p.read_bytes() for p in files.iterdir()} == before


def test_a_store_a_writer_holds_is_let_through_unchanged(monkeypatch, fixture_store):
    import subprocess
    import sys

    started = []
    monkeypatch.setattr("os.execv", lambda path, argv: started.append(argv))
    before = fixture_store.db.read_bytes()
    holder = "import sys, duckdb; con = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", holder, str(fixture_store.db)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as writer:  # fmt: skip
        assert writer.stdout is not None and writer.stdout.readline() == "held\n"
        result = CliRunner().invoke(main, ["dashboard", "--db", str(fixture_store.db), "--port", "0"])
        writer.communicate("")
    assert result.exit_code == 0, result.output
    assert len(started) == 1 and fixture_store.db.read_bytes() == before
