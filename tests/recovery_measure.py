"""Censored-label recovery on the shipped models: the same greedy requests served in compact and in
cap_accept (the same windows and commits; cap_accept verifies the whole block), each stored in a real
store, compared label by label. ``python -m tests.recovery_measure`` prints the figures as JSON; the test
beside it holds them to the targets.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from sparkgate.collectors.schema import StepRecord
from sparkgate.collectors.store import Store
from sparkgate.collectors.wire import from_records
from sparkgate.controller.evaluate import evaluate
from sparkgate.policies.window import FixedWindow
from sparkgate.verify_runtime.defaults import default_calibration
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.shipped import load_shipped
from sparkgate.verify_runtime.workload import mixed_workload

GAMMA, WINDOW = 7, 3


def serve(mode: str, requests: int, new_tokens: int, seed: int) -> list[StepRecord]:
    target, drafter, _ = load_shipped()
    records: list[StepRecord] = []
    config = EngineConfig(gamma=GAMMA, max_batch=8, replica_id="measure")
    engine = Engine(target, drafter, config, policy=FixedWindow(WINDOW), calibrate=default_calibration(drafter),
                    sink=records.append)  # fmt: skip
    for i, prompt in enumerate(mixed_workload(requests, seed=seed, prompt_len=48)):
        engine.submit(Request(f"q{i}", prompt.tokens, new_tokens, mode=mode, task=prompt.task, stop_at_eos=False))
    engine.run()
    return records


def measure(requests: int = 24, new_tokens: int = 48, seed: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        stores = {mode: Store(Path(tmp) / f"{mode}.duckdb") for mode in ("compact", "cap_accept")}
        try:
            for mode, store in stores.items():
                assert store.ingest(from_records(serve(mode, requests, new_tokens, seed)), mode).quarantined == 0
            return _compare(stores["compact"], stores["cap_accept"])
        finally:
            for store in stores.values():
                store.close()


def _compare(compact: Store, full: Store) -> dict:
    sql = (
        'SELECT l.request_id, l.step_id, l.depth, l.status::VARCHAR AS status, l.label, r.position, r."window", '
        "r.accepted FROM depth_labels l JOIN requests r USING (replica_id, step_id, request_id)"
    )
    last = "SELECT request_id, max(position + len(committed_tokens)) AS end FROM requests GROUP BY ALL"
    ends = {r["request_id"]: r["end"] for r in compact.query(last).to_pylist()}
    truth = {(r["request_id"], r["step_id"], r["depth"]): r["label"] for r in full.query(sql).to_pylist()}
    rows = compact.query(sql).to_pylist()
    # Depths the window left unverified (a = w < γ): every one was censored when its row arrived.
    hidden = [r for r in rows if r["accepted"] == r["window"] < GAMMA and r["depth"] > r["window"]]
    recovered = [r for r in hidden if r["status"] == "recovered"]
    agree = sum(r["label"] == truth[(r["request_id"], r["step_id"], r["depth"])] for r in recovered)
    # Settled once the request has committed position + depth - 1 (or a mismatch came earlier).
    resolvable = [r for r in hidden if r["position"] + r["depth"] <= ends[r["request_id"]] or r["status"] != "censored"]
    compact_eval, full_eval = evaluate(compact), evaluate(full)
    compact_ece = compact_eval.report()["calibration"]["compact"]["survival"]
    full_ece = full_eval.report()["calibration"]["survival"]
    within = {
        d: full_ece[d]["ece_interval"][0] <= compact_ece[d]["ece"] <= full_ece[d]["ece_interval"][1]
        for d in full_ece
        if d in compact_ece and full_ece[d]["ece_interval"] is not None
    }
    return {
        "hidden_labels": len(hidden),
        "recovered": len(recovered),
        "recovered_agreeing_with_full_verification": agree,
        "exactness": agree / len(recovered) if recovered else None,
        "coverage_of_resolvable": len(recovered) / len(resolvable) if resolvable else None,
        "coverage_of_all_hidden": len(recovered) / len(hidden) if hidden else None,
        "ece_by_depth": {
            d: {
                "compact_with_recovery": compact_ece[d]["ece"],
                "cap_accept": full_ece[d]["ece"],
                "cap_accept_interval": full_ece[d]["ece_interval"],
                "within": within.get(d),
            }
            for d in sorted(full_ece, key=int)
            if d in compact_ece
        },
        "label_yield": {
            "compact": compact_eval.report()["label_yield"],
            "cap_accept": full_eval.report()["label_yield"],
        },
    }


if __name__ == "__main__":
    json.dump(measure(*(int(a) for a in sys.argv[1:])), sys.stdout, indent=1)
    print()
