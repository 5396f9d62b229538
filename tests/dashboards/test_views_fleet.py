"""The Fleet page: replicas, their versions and contracts, and warnings when they disagree."""

from __future__ import annotations

from sparkgate.collectors.store import Store
from tests.conftest import T0, ingest_synthetic
from tests.dashboards.known_store import metrics, run_app, snapshot_args


def test_fleet_lists_replicas_and_their_versions(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="fleet")
    assert metrics(app)["Replicas"] == "2"
    fleet = app.dataframe[0].value.set_index("replica_id")
    assert fleet.loc["r0", "sts_version"] == "sts-a" and fleet.loc["r1", "sts_version"] == "(none)"
    assert fleet.loc["r0", "steps"] == 200 and fleet.loc["r1", "steps"] == 100
    assert any("sts_version" in w.value for w in app.warning)


def test_replicas_on_different_contracts_are_shown_and_warned_of(monkeypatch, tmp_path):
    with Store(tmp_path / "events.duckdb") as store:
        ingest_synthetic(store, 10, T0, replica="r0", contract="contract-a")
        ingest_synthetic(store, 10, T0, replica="r1", contract="contract-b")
        store.snapshot(tmp_path / "snapshots")
    policy = tmp_path / "policy.yaml"
    policy.write_text("{}\n")
    app = run_app(monkeypatch, "--snapshot-dir", str(tmp_path / "snapshots"), "--policy", str(policy), page="fleet")
    fleet = app.dataframe[0].value.set_index("replica_id")
    assert list(fleet["contract"]) == ["contract-a", "contract-b"]
    assert any("different contracts" in w.value for w in app.warning)


def test_a_replica_is_silent_against_the_fleets_newest_step_not_the_wall_clock(monkeypatch, tmp_path):
    """A stored run read later showed every replica silent; now only the one that stopped before the rest."""
    with Store(tmp_path / "events.duckdb") as store:
        ingest_synthetic(store, 10, T0, replica="r0")
        ingest_synthetic(store, 10, T0 + 600, replica="r1")
        store.snapshot(tmp_path / "snapshots")
    policy = tmp_path / "policy.yaml"
    policy.write_text("stale_after_s: 120\n")
    app = run_app(monkeypatch, "--snapshot-dir", str(tmp_path / "snapshots"), "--policy", str(policy), page="fleet")
    assert metrics(app)["Silent replicas"] == "1" and metrics(app)["Newest step"].endswith(" ago")
    fleet = app.dataframe[0].value.set_index("replica_id")
    assert fleet.loc["r1", "silent_for"] == "" and fleet.loc["r0", "silent_for"].endswith("min")
