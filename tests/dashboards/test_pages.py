"""Every page against the fixture store (see conftest): the figures shown are the controller's.

Reference figures come from a second path: the ledger read from the writer's
store, or the collectors' ``Aggregate`` built straight from the ingested
records, never from the dashboard's own queries.
"""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.store import Store
from sparkgate.collectors.wire import flatten
from sparkgate.controller import ledger
from sparkgate.controller.metrics import evaluate
from sparkgate.controller.queries import Window
from sparkgate.dashboards import series
from sparkgate.dashboards.source import open_snapshot_reader
from tests.conftest import APP
from tests.dashboards.known_store import MISSES, SHADOW_STEPS


def run_app(monkeypatch, *args: str, page: str | None = None, window: str | None = None) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", *args])
    app = AppTest.from_file(str(APP), default_timeout=60)
    if window is not None:
        app.session_state["sparkgate.window"] = window  # the choice the sidebar radio keeps across pages
    app.run()
    if page is not None:
        app.switch_page(f"views/{page}.py").run()
    assert not app.exception, app.exception[0].message
    return app


def widget(widgets, label: str):
    return next(w for w in widgets if w.label == label)


def snapshot_args(fixture) -> tuple[str, ...]:
    return "--snapshot-dir", str(fixture.snapshot_dir), "--policy", str(fixture.policy_path)


def metrics(app: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


def rollback(fixture) -> dict:
    with Store(fixture.db) as store:
        return ledger.decisions(store)[-1].to_dict()


def shadow_aggregate(fixture) -> Aggregate:
    """What the rollback judged, rebuilt from the ingested records (the shadow steps)."""
    flat = flatten(pa.concat_tables(fixture.wires[1:]))
    return Aggregate.from_tables(flat.requests, explode(flat), 7)


def test_rollout_shows_the_phase_and_the_verdicts_that_rolled_back(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store))
    shown = metrics(app)
    assert shown["Phase"] == "fallback" and shown["Revision"] == "3" and shown["Compact fraction"] == "0%"
    assert "failure limit" in app.error[0].value and "resume" in app.error[0].value
    gates = app.dataframe[0].value.set_index("gate")
    decided = {r["gate"]: r for r in rollback(fixture_store)["reasons"] if "gate" in r}
    assert gates.loc["tier_miss_rate", "value"] == pytest.approx(MISSES / SHADOW_STEPS)
    assert gates.loc["tier_miss_rate", "verdict"] == "fail" and gates.loc["tier_miss_rate", "samples"] == SHADOW_STEPS
    assert gates.loc["survival_ece", "value"] == decided["survival_ece"]["value"]
    assert gates.loc["survival_ece", "threshold"] == "≤ 0.5" and gates.loc["survival_ece", "verdict"] == "pass"
    assert gates.loc["upper_bound_utilization", "dry run"] == "dry run"
    decisions = app.dataframe[1].value
    assert list(decisions["action"]) == ["rollback", "advance", "start"]
    assert decisions.loc[0, "gates failed"] == "upper_bound_utilization, tier_miss_rate"
    commands = app.code[0].value
    assert "sparkgate resume" in commands and "sparkgate abort" not in commands and "promote" not in commands


def test_calibration_shows_the_gated_ece_per_depth(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="calibration")
    # The default window is the stage the rollback judged (the current one holds no steps yet).
    assert app.session_state["sparkgate.window"].startswith("Previous stage")
    reference = shadow_aggregate(fixture_store).survival
    table = app.dataframe[0].value.set_index("depth")
    for depth, ece in reference.ece().items():
        assert table.loc[depth, "ece"] == pytest.approx(ece, abs=1e-12)
        assert table.loc[depth, "samples"] == reference.samples()[depth]
        assert table.loc[depth, "ece_lo"] <= table.loc[depth, "ece_hi"]
    worst = max(reference.ece().values())
    gate = next(r for r in rollback(fixture_store)["reasons"] if r.get("gate") == "survival_ece")
    assert gate["value"] == pytest.approx(worst, abs=1e-12)  # the page's figure is the one the gate judged
    assert metrics(app)["Worst depth ECE"] == f"{worst:.4f}"
    bins = app.dataframe[1].value  # reliability bins of depth 1
    assert bins["count"].sum() == reference.samples()[1]
    assert list(bins["count"]) == [b["count"] for b in reference.reliability(1)]
    assert (bins["freq_lo"] <= bins["freq_y"]).all() and (bins["freq_y"] <= bins["freq_hi"]).all()
    compact = app.dataframe[2].value.set_index("depth")
    flat = flatten(pa.concat_tables(fixture_store.wires[1:]))
    labels = explode(flat).to_pandas()
    censored = labels[labels["status"] == "censored"].groupby("depth").size()
    assert compact["censored"].sum() == censored.sum()
    sts = app.dataframe[3].value
    assert set(sts.index) == {"(none)", "sts-a"}


def test_calibration_compact_view_is_labelled_and_never_gated(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="calibration")
    view = widget(app.radio, "Traffic")
    view.set_value(view.options[1]).run()
    assert "never gated" in view.value
    reference = shadow_aggregate(fixture_store).survival
    bins = app.dataframe[1].value
    assert list(bins["count"]) == [b["count"] for b in reference.reliability(1, ("compact",))]


def test_calibration_slices_by_replica(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="calibration")
    split = widget(app.selectbox, "Split the window by")
    split.set_value("replica").run()
    ece, samples = app.dataframe[-3].value, app.dataframe[-2].value
    for replica, wire in (("r0", fixture_store.wires[1]), ("r1", fixture_store.wires[2])):
        flat = flatten(wire)
        reference = Aggregate.from_tables(flat.requests, explode(flat), 7).survival
        assert ece.loc[replica, "k=1"] == pytest.approx(reference.ece()[1], abs=1e-12)
        assert samples.loc[replica, "k=1"] == reference.samples()[1]


def test_acceptance_shows_utilization_and_window_lengths(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="acceptance")
    reference = shadow_aggregate(fixture_store)
    shown = metrics(app)
    assert shown["Upper-bound utilization (cap_accept)"] == f"{reference.upper_bound_utilization():.4f}"
    assert shown["Shadow utilization (suggested windows)"] == f"{reference.shadow_utilization():.4f}"
    modes = app.dataframe[0].value.set_index("mode")
    requests = flatten(pa.concat_tables(fixture_store.wires[1:])).requests.to_pandas()
    for mode, rows in requests.groupby("mode"):
        assert modes.loc[mode, "requests"] == len(rows)
        assert modes.loc[mode, "mean_accepted"] == pytest.approx(rows["accepted"].mean())
    windows = app.dataframe[1].value
    compact = requests[requests["mode"] == "compact"]["window"].value_counts()
    assert all(windows.loc["compact", w] == n for w, n in compact.items())


def test_tiers_shows_the_miss_rate_by_reason(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="tiers")
    shown = metrics(app)
    assert shown["Tier miss rate"] == f"{MISSES / SHADOW_STEPS:.2%}" == "5.00%"
    assert shown["Misses"] == str(MISSES) and shown["Steps"] == str(SHADOW_STEPS)
    reasons = app.dataframe[0].value
    assert reasons.to_dict("records") == [
        {"reason": "over_max_tier", "steps": MISSES, "share of steps": MISSES / SHADOW_STEPS}
    ]


def test_fleet_lists_replicas_and_their_versions(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="fleet")
    assert metrics(app)["Replicas"] == "2"
    fleet = app.dataframe[0].value.set_index("replica_id")
    assert fleet.loc["r0", "sts_version"] == "sts-a" and fleet.loc["r1", "sts_version"] == "(none)"
    assert fleet.loc["r0", "steps"] == 200 and fleet.loc["r1", "steps"] == 100
    assert any("sts_version" in w.value for w in app.warning)


def test_window_choice_changes_the_figures(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="tiers", window="All data")
    assert metrics(app)["Steps"] == "300"  # baseline steps included
    assert metrics(app)["Tier miss rate"] == f"{MISSES / 300:.2%}"


def test_db_copy_reads_while_the_writer_holds_the_file(monkeypatch, fixture_store, tmp_path):
    db = tmp_path / "events.duckdb"
    shutil.copy(fixture_store.db, db)  # the writer below commits: keep the shared fixture as it is
    with Store(db) as writer:
        app = run_app(monkeypatch, "--db", str(db), "--policy", str(fixture_store.policy_path))
        assert metrics(app)["Phase"] == "fallback"
        # The writer kept its lock and can still commit.
        writer.record_decision(4, "fallback", "shadow", "resume", [{"rule": "operator resume"}], operator="test")
        assert ledger.decisions(writer)[-1].action == "resume"


def test_series_sum_to_the_window_evaluation(fixture_store):

    reader = open_snapshot_reader(fixture_store.snapshot_dir)
    since, until = 1.75e9 + 4, 1.75e9 + 10
    one = series.calibration(reader, reader.token, since, until, since, until - since)
    reference = evaluate(reader, Window(since, until))
    ece, samples = reference.aggregate.survival.ece(), reference.aggregate.survival.samples()
    assert dict(zip(one["depth"], one["ece"])) == pytest.approx(ece, abs=1e-12)
    many = series.calibration(reader, reader.token, since, until, since, 0.5)
    assert many.groupby("depth")["samples"].sum().to_dict() == samples
    utilization = series.acceptance_series(reader, reader.token, since, until, since, until - since)
    row = utilization[utilization["series"].str.startswith("upper-bound")].iloc[0]
    assert row["value"] == pytest.approx(reference.aggregate.upper_bound_utilization())
    tiers = series.tier_series(reader, reader.token, since, until, since, 1.0)
    misses = tiers[tiers["series"] == "miss rate (all reasons)"]
    assert (misses["value"] * misses["samples"]).sum() == pytest.approx(MISSES)
    assert np.isclose(misses["samples"].sum(), SHADOW_STEPS)


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


def test_controller_api_source(monkeypatch, fixture_store, tmp_path):
    from sparkgate.collectors.ingest import Ingestor
    from sparkgate.collectors.ingest_api import serve_in_thread
    from sparkgate.controller.service import create_app
    from sparkgate.controller.supervisor import Controller
    from sparkgate.policies.rollout import load_rollout_policy

    shutil.copy(fixture_store.db, tmp_path / "events.duckdb")
    with Store(tmp_path / "events.duckdb") as store:
        controller = Controller(store, load_rollout_policy(fixture_store.policy_path), resamples=50)
        with serve_in_thread(create_app(controller, Ingestor(store))) as url:
            args = ("--controller", url, "--policy", str(fixture_store.policy_path))
            app = run_app(monkeypatch, *args)
            assert metrics(app)["Phase"] == "fallback" and metrics(app)["Revision"] == "3"
            gates = app.dataframe[0].value.set_index("gate")
            assert gates.loc["tier_miss_rate", "value"] == pytest.approx(MISSES / SHADOW_STEPS)
            assert f"--controller {url}" in app.code[0].value
            app = run_app(monkeypatch, *args, page="calibration", window="All data")
            reference = evaluate(store).report()["calibration"]["survival"]
            table = app.dataframe[0].value.set_index("depth")
            assert table.loc[1, "ece"] == pytest.approx(reference["1"]["ece"], abs=1e-12)
            assert any("needs the stored rows" in i.value for i in app.info)


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
