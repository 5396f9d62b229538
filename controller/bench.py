"""``sparkgate bench controller``: one full gate evaluation over stored labels, and a fleet merge.

- evaluation: a fresh DuckDB file holds ``--labels`` synthetic depth labels
  (γ = 7, 32 requests per step; the first tenth recorded in baseline, the rest in
  canary). One evaluation is everything a controller tick computes: every
  metric (all depths, both kinds, bootstrap intervals with 200 resamples,
  equal-mass ECE, AUROC, step latency against the baseline) and a verdict for
  every gate of the default policy. Building the file is not timed.
- merge: ``--replicas`` per-replica ``Aggregate``s merged in one vectorised sum,
  beside the baseline of folding ``Aggregate.merge`` pairwise.

Times are medians of ``--repeats`` runs; the 1-minute load average is printed
with them because the figures scale with whatever else the machine runs.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pyarrow as pa

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import Parsed, flatten, from_wire
from sparkgate.policies.rollout import load_rollout_policy

from .fleet import merge_aggregates
from .gates import judge_all
from .metrics import evaluate

GAMMA, BATCH, BATCH_STEPS, REPLICAS = 7, 32, 2000, 4
EVAL_TARGET_MS, MERGE_TARGET_MS = 1000, 50


def build_store(store: Store, labels: int) -> int:
    """Fill ``store`` with about ``labels`` depth labels over ``REPLICAS`` replicas; returns the stored count."""
    steps = max(1, labels // (GAMMA * BATCH))
    baseline_steps = steps // 10

    def batch(first: int) -> Parsed:
        n = min(BATCH_STEPS, steps - first)
        wire = synthetic_wire(
            n,
            BATCH,
            GAMMA,
            f"replica-{first // BATCH_STEPS % REPLICAS}",
            first_step=first,
            seed=first,
            ts=1.75e9 + first * 0.01,
        )
        phase = "baseline" if first < baseline_steps else "canary"
        return from_wire(wire.set_column(wire.schema.get_field_index("phase"), "phase", pa.array([phase] * n)))

    return sum(r.labels for r in store.ingest_stream((batch(first), "bench") for first in range(0, steps, BATCH_STEPS)))


def time_evaluation(store: Store, repeats: int) -> list[float]:
    """Milliseconds per full evaluation: metrics, bootstrap and every gate's verdict."""
    gates = load_rollout_policy().gates
    runs = []
    for seed in range(repeats):
        start = time.perf_counter()
        evaluation = evaluate(store, seed=seed)
        verdicts = judge_all(gates, evaluation.measurements("canary"))
        runs.append((time.perf_counter() - start) * 1000)
        assert len(verdicts) == len(gates)
    return runs


def replica_aggregates(replicas: int) -> list[Aggregate]:
    """One small aggregate per replica (2 steps of 8 requests each, different seeds)."""
    out = []
    for r in range(replicas):
        flat = flatten(synthetic_wire(2, 8, GAMMA, f"replica-{r}", seed=r))
        out.append(Aggregate.from_tables(flat.requests, explode(flat), GAMMA))
    return out


def time_merge(aggregates: list[Aggregate], repeats: int) -> tuple[list[float], list[float]]:
    """(vectorised merge ms, pairwise fold ms) per run; checks both give the same counts."""
    fast, fold = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        merged = merge_aggregates(aggregates)
        fast.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        folded = functools.reduce(Aggregate.merge, aggregates)
        fold.append((time.perf_counter() - start) * 1000)
        assert np.array_equal(merged.survival.count, folded.survival.count)
    return fast, fold


def run(labels: int, replicas: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-") as tmp, Store(Path(tmp) / "bench.duckdb") as store:
        start = time.perf_counter()
        stored = build_store(store, labels)
        setup_s = time.perf_counter() - start
        eval_runs = time_evaluation(store, repeats)
    merge_runs, fold_runs = time_merge(replica_aggregates(replicas), repeats)
    eval_ms, merge_ms = statistics.median(eval_runs), statistics.median(merge_runs)
    return {
        "labels": stored,
        "eval_ms": round(eval_ms, 1),
        "eval_runs_ms": [round(x, 1) for x in eval_runs],
        "eval_target_ms": EVAL_TARGET_MS,
        "merge_replicas": replicas,
        "merge_ms": round(merge_ms, 2),
        "merge_fold_ms": round(statistics.median(fold_runs), 2),
        "merge_target_ms": MERGE_TARGET_MS,
        "merge_speedup": round(statistics.median(fold_runs) / merge_ms, 1),
        "setup_s": round(setup_s, 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


@click.command("controller")
@click.option("--labels", default=10_000_000, show_default=True, help="Depth labels in the evaluated store.")
@click.option("--replicas", default=1000, show_default=True, help="Aggregates merged.")
@click.option("--repeats", default=3, show_default=True, help="Timed runs (the median is reported).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_controller(labels: int, replicas: int, repeats: int, as_json: bool) -> None:
    """Full gate evaluation over stored labels, and a merge of per-replica aggregates."""
    result = run(labels, replicas, repeats)
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key:>16}: {value}")
