"""What every page shares: the window choice and what is said when there is nothing to show yet."""

from __future__ import annotations

from sparkgate.collectors.store import Store
from tests.dashboards.known_store import MISSES, metrics, run_app, snapshot_args


def test_window_choice_changes_the_figures(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="tiers", window="All data")
    assert metrics(app)["Steps"] == "300"  # baseline steps included
    assert metrics(app)["Tier miss rate"] == f"{MISSES / 300:.2%}"


def test_no_data_yet_says_what_to_run(monkeypatch, tmp_path):
    app = run_app(monkeypatch, "--snapshot-dir", str(tmp_path / "none"))
    assert "No snapshot has been published" in app.info[0].value and "--snapshot-dir" in app.info[0].value
    app = run_app(monkeypatch, "--db", str(tmp_path / "missing.duckdb"))
    assert "does not exist yet" in app.info[0].value and "sparkgate serve" in app.info[0].value
    with Store(tmp_path / "empty.duckdb") as store:
        store.snapshot(tmp_path / "snapshots")
    args = ("--snapshot-dir", str(tmp_path / "snapshots"))
    assert "No rollout decisions yet" in run_app(monkeypatch, *args).info[0].value
    for page in ("calibration", "acceptance", "tiers", "fleet"):
        assert "No step records yet" in run_app(monkeypatch, *args, page=page).info[0].value


def test_a_stage_that_lasted_no_time_is_not_offered_as_the_previous_stage():
    """Two changes at one instant made the previous stage's window empty, and every windowed page crashed."""
    from sparkgate.controller.queries import Window
    from sparkgate.dashboards.context import PREVIOUS, STAGE, _windows

    decisions = [{"decided_at": t, "action": a} for t, a in ((10.0, "start"), (50.0, "advance"), (50.0, "abort"))]
    options = _windows(None, decisions)
    assert options[STAGE] == (50.0, None) and options[PREVIOUS] == (10.0, 50.0)
    for since, until in options.values():
        Window(since, until)  # each a window the pages can read
    assert PREVIOUS not in _windows(None, decisions[1:])
