"""``sparkgate dashboard``: Streamlit started headless on loopback with the app's own arguments."""

from __future__ import annotations


def test_dashboard_command_runs_streamlit_headless_on_loopback(monkeypatch, fixture_store):
    from click.testing import CliRunner

    from sparkgate.cli import main

    started = []
    monkeypatch.setattr("os.execv", lambda path, argv: started.append(argv))
    result = CliRunner().invoke(main, ["dashboard", "--db", str(fixture_store.db), "--port", "8600"])
    assert result.exit_code == 0, result.output
    argv = started[0]
    assert argv[argv.index("--server.address") + 1] == "127.0.0.1"
    assert argv[argv.index("--server.headless") + 1] == "true"
    assert argv[argv.index("--browser.gatherUsageStats") + 1] == "false"
    assert argv[argv.index("--") + 1 :][:2] == ["--db", str(fixture_store.db)]
    missing = CliRunner().invoke(main, ["dashboard"])
    assert missing.exit_code == 2 and "exactly one of" in missing.output
