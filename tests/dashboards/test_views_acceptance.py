"""The Acceptance page against the fixture store: utilization and window lengths per mode.

Reference figures come from a second path: the ledger read from the writer's
store, or the collectors' ``Aggregate`` built straight from the ingested
records, never from the dashboard's own queries.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkgate.collectors.wire import flatten
from tests.dashboards.known_store import metrics, run_app, shadow_aggregate, snapshot_args


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
