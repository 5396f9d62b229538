"""The Tiers page against the fixture store: the miss rate by reason."""

from __future__ import annotations

from tests.dashboards.known_store import MISSES, SHADOW_STEPS, metrics, run_app, snapshot_args


def test_tiers_shows_the_miss_rate_by_reason(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="tiers")
    shown = metrics(app)
    assert shown["Tier miss rate"] == f"{MISSES / SHADOW_STEPS:.2%}" == "5.00%"
    assert shown["Misses"] == str(MISSES) and shown["Steps"] == str(SHADOW_STEPS)
    reasons = app.dataframe[0].value
    assert reasons.to_dict("records") == [
        {"reason": "over_max_tier", "steps": MISSES, "share of steps": MISSES / SHADOW_STEPS}
    ]
