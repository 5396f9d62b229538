"""End to end: ``sparkgate demo --quick --json`` as a user runs it (real processes, runtime, DuckDB file).

The run walks the whole ladder on evidence, the drift fault fails the
calibration gate, and the controller falls back by itself; the test checks the
JSON summary, the DuckDB file and the exports it leaves, and that no process
of the fleet outlives the demo.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from collectors.store import Store

LADDER = ["baseline", "shadow", "canary 5%", "canary 25%", "canary 50%", "compact"]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended while we looked
        if text in args and str(os.getpid()) != cmdline.parent.name:
            found.append(args)
    return found


def test_quick_demo_walks_the_ladder_and_falls_back_on_calibration_drift(tmp_path):
    out = tmp_path / "demo"
    run = subprocess.run([sys.executable, "-m", "controller", "demo", "--quick", "--json", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"stdout:\n{run.stdout[-2000:]}\nstderr:\n{run.stderr[-4000:]}"
    summary = json.loads(run.stdout)

    assert summary["ok"] and summary["fault"] == "drift"
    assert summary["phases"] == ["baseline", "shadow", "canary", "compact", "fallback"]
    assert [s["stage"] for s in summary["stages"]] == LADDER + ["compact + fault", "fallback"]
    assert summary["fallback_reason"].startswith("failure limit") and "survival_ece" in summary["fallback_reason"]
    rollback = summary["decisions"][-1]
    assert rollback["action"] == "rollback" and rollback["at_s"] > summary["fault_at_s"]
    assert set(summary["tokens_per_s_by_phase"]) == set(summary["phases"])
    assert all(v > 0 for v in summary["tokens_per_s_by_phase"].values())

    assert Path(summary["db"]) == out / "demo.duckdb"
    with Store(summary["db"]) as store:
        labels = {(r["mode"], r["status"]): r["n"] for r in store.query(
            "SELECT mode::VARCHAR AS mode, status::VARCHAR AS status, count(*) AS n FROM depth_labels "
            "GROUP BY ALL").to_pylist()}
        temperatures = store.query("SELECT DISTINCT replica_id, temperature FROM requests").to_pylist()
    uncensored = {(m, s) for m, s in labels if m != "compact"}
    assert {m for m, _ in uncensored} == {"static", "shadow", "cap_accept"}
    assert labels[("compact", "censored")] > 0 and labels[("cap_accept", "rejected")] > 0
    assert summary["labels"]["censored"] == labels[("compact", "censored")]
    # Only the faulty replica ever sampled; the others stayed greedy.
    assert {r["replica_id"] for r in temperatures if r["temperature"] > 0} == {"replica-c"}

    assert list((out / "parquet" / "depth_labels").rglob("*.parquet"))
    assert (out / "snapshot" / "CURRENT").exists()
    assert summary["dashboard"] == f"sparkgate dashboard --db {out / 'demo.duckdb'} --policy {out / 'rollout.yaml'}"
    assert json.loads((out / "summary.json").read_text())["phases"] == summary["phases"]
    assert _processes_mentioning(str(out)) == []
