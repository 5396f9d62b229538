"""A store with known contents, written by the real controller, for the dashboard tests, and the helpers
that run the app on it and read what a page shows.

Timeline (T0 = 1.75e9):
- T0: the controller starts (baseline, revision 1); 100 baseline steps on r0 follow.
- T0 + 4: a tick passes the baseline check and advances to shadow (revision 2).
- shadow data: r0 announces STS "sts-a" and runs task "prose"; r1 runs without STS, task "code"; 10 of
  the 200 shadow steps miss the graph tiers (over_max_tier).
- shadow runs switchback epochs of 50 ms from T0 + 4 (``SCHEDULE``): its steps carry their epoch and arm,
  and every epoch serves one request record of its arm (treatment requests take 1.5x as long); the
  dry-run comparison gates judge 10 epoch pairs per replica.
- T0 + 10: a tick fails ``tier_miss_rate`` (0.05 > 0.02) with failure_limit 0: rollback to fallback
  (revision 3), recorded with every gate verdict.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from streamlit.testing.v1 import AppTest

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.request_ingest import prepare_requests
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten, from_wire
from sparkgate.controller import ledger
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.policies.switchback import Switchback
from tests.conftest import APP, T0, Clock, request_record

POLICY = {
    "consecutive_passes": 1,
    "failure_limit": 0,
    "canary_steps": [0.25],
    "gates": [
        {"metric": "survival_ece", "threshold": 0.5, "direction": "at_most", "min_samples": 100},
        {"metric": "upper_bound_utilization", "threshold": 0.85, "direction": "at_least", "dry_run": True},
        {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most", "min_samples": 100},
        {"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True},
        {"metric": "p99_step_ratio", "threshold": 1.1, "direction": "at_most", "min_samples": 5, "dry_run": True},
        {"metric": "p99_ttft_ratio", "threshold": 1.2, "direction": "at_most", "min_samples": 5, "dry_run": True},
    ],
    "comparison": {"epoch_s": 0.05, "burn_in_s": 0.0},
}
MISSES, SHADOW_STEPS = 10, 200
SCHEDULE = Switchback(0, 0.05, T0 + 4)


def _set_step(wire: pa.Table, name: str, values) -> pa.Table:
    field = wire.schema.field(name)
    return wire.set_column(wire.schema.get_field_index(name), field, pa.array(values, field.type))


def _set_task(wire: pa.Table, task: str) -> pa.Table:
    lists = wire.column("requests").combine_chunks()
    rows = lists.values
    columns = [pa.array([task] * len(rows)) if f.name == "task" else rows.field(i) for i, f in enumerate(rows.type)]
    rebuilt = pa.ListArray.from_arrays(lists.offsets, pa.StructArray.from_arrays(columns, fields=list(rows.type)))
    return wire.set_column(wire.schema.get_field_index("requests"), "requests", rebuilt)


def steps(
    count: int, replica: str, first_step: int, ts: float, phase: str, task: str, sts: str | None = None, misses: int = 0
) -> pa.Table:
    wire = synthetic_wire(count, 16, 7, replica, first_step=first_step, seed=first_step + len(replica), ts=ts)
    wire = _set_step(wire, "phase", [phase] * count)
    wire = _set_step(wire, "sts_version", [sts] * count)
    wire = _set_step(wire, "cost_table_version", ["ct-1"] * count)
    # One contract for the whole fixture, so the controller judges (and rolls back) the mixed-STS interval;
    # the Fleet page's contract warning is tested on a store of its own.
    wire = _set_step(wire, "contract", ["contract-1"] * count)
    if phase == "shadow":  # revision 2, in switchback epochs
        epochs = [SCHEDULE.epoch(ts) for ts in wire.column("ts").to_pylist()]
        wire = _set_step(wire, "policy_revision", [2] * count)
        wire = _set_step(wire, "epoch", epochs)
        wire = _set_step(wire, "arm", [str(SCHEDULE.arm(replica, e)) for e in epochs])
    hit = np.arange(count) >= misses
    wire = _set_step(wire, "graph_hit", hit)
    wire = _set_step(wire, "miss_reason", [None if h else "over_max_tier" for h in hit])
    return _set_task(wire, task)


def shadow_requests() -> bytes:
    """One request record per replica and shadow epoch, served inside it; treatment's take 1.5x as long."""
    lines = []
    for replica in ("r0", "r1"):
        for epoch in range(SCHEDULE.epoch(T0 + 5), SCHEDULE.epoch(T0 + 6) + 1):
            arm = SCHEDULE.arm(replica, epoch)
            slow, start = 1.5 if arm == "treatment" else 1.0, SCHEDULE.start(epoch) + 0.005
            timeline = {"arrival_ts": start, "first_token_ts": start + 0.02 * slow, "finish_ts": start + 0.03 * slow,
                        "commit_offsets_ms": [20.0 * slow, 30.0 * slow]}  # fmt: skip
            lines.append(request_record(replica_id=replica, request_id=f"{replica}-{epoch}", epoch=epoch, arm=str(arm),
                                        policy_revision=2, **timeline))  # fmt: skip
    return "\n".join(map(json.dumps, lines)).encode()


def ingest(store: Store, wire: pa.Table) -> None:
    assert store.ingest(from_wire(wire), "test").quarantined == 0


@dataclass
class Fixture:
    db: Path
    snapshot_dir: Path
    policy_path: Path
    wires: list[pa.Table]  # every ingested step record, for independent reference figures


def build(root: Path) -> Fixture:
    import yaml

    policy_path = root / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(POLICY))
    policy = parse_rollout_policy(POLICY)
    clock = Clock(T0)
    wires = []
    with Store(root / "events.duckdb") as store:
        controller = Controller(store, policy, clock=clock, resamples=50)
        wires.append(steps(100, "r0", 0, T0 + 1, "baseline", "prose"))
        ingest(store, wires[-1])
        clock.now = T0 + 4
        controller.tick()
        wires.append(steps(SHADOW_STEPS // 2, "r0", 100, T0 + 5, "shadow", "prose", sts="sts-a", misses=MISSES))
        wires.append(steps(SHADOW_STEPS // 2, "r1", 0, T0 + 5, "shadow", "code"))
        for wire in wires[1:]:
            ingest(store, wire)
        store.commit_requests(prepare_requests(shadow_requests()), "test")
        clock.now = T0 + 10
        decision = controller.tick()
        assert decision.phase_to == "fallback", decision
        store.snapshot(root / "snapshots")
    return Fixture(root / "events.duckdb", root / "snapshots", policy_path, wires)


def run_app(monkeypatch, *args: str, page: str | None = None, window: str | None = None) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["app.py", *args])
    app = AppTest.from_file(str(APP), default_timeout=60)
    if window is not None:
        app.session_state["sparkgate.window"] = window  # the choice the sidebar radio keeps across pages
    app.run()
    if page is not None:
        app.switch_page(f"views/{page}.py").run()
    assert not app.exception, app.exception[0].message
    return app


def widget(widgets, label: str):
    return next(w for w in widgets if w.label == label)


def snapshot_args(fixture) -> tuple[str, ...]:
    return "--snapshot-dir", str(fixture.snapshot_dir), "--policy", str(fixture.policy_path)


def metrics(app: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


def rollback(fixture) -> dict:
    with Store(fixture.db) as store:
        return ledger.decisions(store)[-1].to_dict()


def shadow_aggregate(fixture) -> Aggregate:
    """What the rollback judged, rebuilt from the ingested records (the shadow steps)."""
    flat = flatten(pa.concat_tables(fixture.wires[1:]))
    return Aggregate.from_tables(flat.requests, explode(flat), 7)
