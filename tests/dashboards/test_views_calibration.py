"""The Calibration page against the fixture store: the gated ECE per depth, the censored compact view
(labelled, never gated) and slices by replica.

Reference figures come from a second path: the ledger read from the writer's
store, or the collectors' ``Aggregate`` built straight from the ingested
records, never from the dashboard's own queries.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.wire import flatten
from tests.dashboards.known_store import metrics, rollback, run_app, shadow_aggregate, snapshot_args, widget


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
    assert metrics(app)["Worst depth ECE (plug-in)"] == f"{worst:.4f}"
    # Beside the window's figure, the gate's verdict as stored (the default policy gates other ECEs than this).
    judged = next(m.value for m in app.markdown if m.value.startswith("**What the gates judged**"))
    assert f"survival_ece: {gate['value']:.4f} against ≤ 0.5 over {gate['samples']:,} samples: pass" in judged
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
