"""``sparkgate bench dashboard``'s parts: the synthetic store it builds, and a first render of every page."""

from __future__ import annotations

import sys

from sparkgate.collectors import cost_tables
from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.dashboards import bench


def test_the_store_holds_the_labels_asked_for_and_every_page_renders_from_its_snapshot(tmp_path, monkeypatch):
    per_step = bench.GAMMA * bench.BATCH
    built = bench.build_store(tmp_path, labels=3 * per_step * bench.REPLICAS)
    assert (built["steps"], built["depth_labels"]) == (3 * bench.REPLICAS, 3 * bench.REPLICAS * per_step)
    assert (tmp_path / "snapshots" / "CURRENT").exists()
    with Store(tmp_path / "events.duckdb") as store:
        assert [d.action for d in ledger.decisions(store)] == ["start", "hold"]  # the start and one evaluation
        # the Tiers page draws its cost-table section: tables stored, and steps that recorded their prediction
        assert [e.version for e in cost_tables.entries(store)] == ["bench", "bench+a1"]
        served = store.query("SELECT count(table_step_ms) AS n, count(DISTINCT cost_table_version) AS v FROM steps")
        assert served.to_pylist() == [{"n": 3 * bench.REPLICAS, "v": 2}]
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # measure sets the app's arguments
    seconds = bench.measure(["--snapshot-dir", str(tmp_path / "snapshots")])
    assert list(seconds) == ["server_warmup", *bench.PAGES] and all(s > 0 for s in seconds.values())
