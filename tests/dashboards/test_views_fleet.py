"""The Fleet page against the fixture store: replicas, their versions and a warning on mixed STS."""

from __future__ import annotations

from tests.dashboards.known_store import metrics, run_app, snapshot_args


def test_fleet_lists_replicas_and_their_versions(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="fleet")
    assert metrics(app)["Replicas"] == "2"
    fleet = app.dataframe[0].value.set_index("replica_id")
    assert fleet.loc["r0", "sts_version"] == "sts-a" and fleet.loc["r1", "sts_version"] == "(none)"
    assert fleet.loc["r0", "steps"] == 200 and fleet.loc["r1", "steps"] == 100
    assert any("sts_version" in w.value for w in app.warning)
