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


def test_the_dashboards_refuse_to_listen_beyond_loopback_without_a_proxy(tmp_path):
    from click.testing import CliRunner

    from sparkgate.cli import main

    refused = CliRunner().invoke(main, ["dashboard", "--db", str(tmp_path / "x.duckdb"), "--host", "0.0.0.0"])
    assert refused.exit_code == 2 and "no authentication of their own" in refused.output
    assert "--behind-auth-proxy" in refused.output
