"""``sparkgate bench dashboard``'s parts: the synthetic store it builds, and a first render of every page."""

from __future__ import annotations

import sys

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
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # measure sets the app's arguments
    seconds = bench.measure(["--snapshot-dir", str(tmp_path / "snapshots")])
    assert list(seconds) == list(bench.PAGES) and all(s > 0 for s in seconds.values())
