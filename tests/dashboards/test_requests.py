"""Request-record aggregates: latency by switchback arm, from a snapshot of a real store."""

from __future__ import annotations

import json

import pytest

from sparkgate.collectors.request_ingest import prepare_requests
from sparkgate.collectors.store import Store
from sparkgate.dashboards import requests
from sparkgate.dashboards.source import open_snapshot_reader
from tests.conftest import T0, request_record


def record(i: int, arm: str | None, ttft: float, phase: str = "shadow", **changes) -> dict:
    start = T0 + i
    return request_record(request_id=f"q{i}", arrival_ts=start, first_token_ts=start + ttft / 1000,
                          finish_ts=start + ttft / 1000 + 0.1, commit_offsets_ms=[ttft, ttft + 100.0],
                          epoch=None if arm is None else i, arm=arm, phase=phase, **changes)  # fmt: skip


@pytest.fixture
def reader(tmp_path):
    lines = [record(i, "treatment", 200.0) for i in range(4)] + [record(i, "control", 100.0) for i in range(4, 8)]
    lines += [record(8, None, 50.0), record(9, None, 50.0, phase="baseline")]
    lines += [record(10, "control", 1.0, finish_reason="cancelled")]
    with Store(tmp_path / "events.duckdb") as store:
        assert store.commit_requests(prepare_requests("\n".join(map(json.dumps, lines)).encode()), "t").rows.num_rows
        store.snapshot(tmp_path / "snapshots")
    return open_snapshot_reader(tmp_path / "snapshots")


def test_latency_by_arm_keeps_arms_apart_and_cancelled_requests_out(reader):
    table = requests.latency_by_arm(reader, reader.token, None, None).set_index("arm")
    assert dict(table["requests"]) == {"control": 4, "no switchback": 1, "spans epochs": 1, "treatment": 4}
    assert table.loc["treatment", "ttft_p50_ms"] == 200.0 and table.loc["control", "ttft_p99_ms"] == 100.0
    assert table.loc["control", "tpot_p50_ms"] == pytest.approx(100.0)  # one later token, 100 ms after the first
    assert len(requests.latency_by_arm(reader, reader.token, T0 + 100, None)) == 0


def test_the_histogram_bins_ttft_and_tpot_on_a_log_scale(reader):
    hist = requests.latency_histogram(reader, reader.token, None, None)
    ttft = hist[(hist["measure"] == "TTFT") & (hist["arm"] == "treatment")]
    assert ttft["requests"].sum() == 4 and ttft["ms"].iloc[0] == pytest.approx(199.5, rel=0.02)
    assert set(hist["measure"]) == {"TTFT", "TPOT"}
