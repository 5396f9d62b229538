"""The Tiers page against the fixture store: the miss rate by reason."""

from __future__ import annotations

import pytest

from sparkgate.collectors import cost_tables
from sparkgate.collectors.cost_tables import TableEntry
from sparkgate.collectors.store import Store
from sparkgate.dashboards import cost_tables as dashboards_cost_tables
from tests.conftest import T0
from tests.controller.timed_steps import STATIC, ingest_timed, scaled
from tests.dashboards.known_store import MISSES, SHADOW_STEPS, metrics, run_app, snapshot_args


def test_tiers_shows_the_miss_rate_by_reason(monkeypatch, fixture_store):
    app = run_app(monkeypatch, *snapshot_args(fixture_store), page="tiers")
    shown = metrics(app)
    assert shown["Tier miss rate"] == f"{MISSES / SHADOW_STEPS:.2%}" == "5.00%"
    assert shown["Misses"] == str(MISSES) and shown["Steps"] == str(SHADOW_STEPS)
    judged = next(m.value for m in app.markdown if m.value.startswith("**What the gates judged**"))
    assert "tier_miss_rate: 0.0500 against ≤ 0.02 over 100 samples: fail" in judged  # the treatment epochs'
    reasons = app.dataframe[0].value
    assert reasons.to_dict("records") == [
        {"reason": "over_max_tier", "steps": MISSES, "share of steps": MISSES / SHADOW_STEPS}
    ]


def test_tiers_shows_the_cost_table_versions_and_each_arms_error(monkeypatch, tmp_path):
    # A store where adaptive published a fitted table: treatment steps served on it, control on the static one.
    db = tmp_path / "adaptive.duckdb"
    policy = tmp_path / "policy.yaml"
    policy.write_text("adaptive: {step_time: cpu}\n")
    fitted = scaled(STATIC, 1.6, "static-a+a1")
    with Store(db) as store:
        cost_tables.add(store, cost_tables.static_entry(STATIC, now=T0))
        cost_tables.add(
            store, TableEntry("static-a+a1", "static-a", "static-a", "online", T0 + 5, fitted.to_json_dict())
        )
        ingest_timed(store, STATIC, fitted, T0, arm="control")
        ingest_timed(store, fitted, fitted, T0 + 10, arm="treatment", first_step=10_000)
    app = run_app(monkeypatch, "--db", str(db), "--policy", str(policy), page="tiers")
    titles = [s.value for s in app.subheader]
    assert titles.index("Cost table versions (adaptive)") == titles.index("Request latency by arm") - 1
    versions = next(d.value for d in app.dataframe if "error_candidate" in d.value.columns)
    assert versions["version"].tolist() == ["static-a", "static-a+a1"]
    assert any("treatment arm serves the fitted tables" in c.value for c in app.caption)
    # The per-arm error the page draws: control steps, predicted by the static table, ran 1.6x its
    # prediction (error 0.6 / 1.6); treatment steps ran as the fitted table predicts them (only the noise).
    with Store(db) as store:
        frame = dashboards_cost_tables.by_bucket(store, "t", T0 - 1, T0 + 60, 3600.0, "cpu")
    error = dict(zip(frame["arm"], frame["prediction_error"]))
    assert error["control"] == pytest.approx(0.6 / 1.6, abs=0.03) and error["treatment"] < 0.06
