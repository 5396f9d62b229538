"""``sparkgate bench controller``: one controller tick over a long stored history, and a fleet merge.

- evaluation: a fresh DuckDB file holds ``--labels`` synthetic depth labels
  (γ = 7, 32 requests per step, a step every ``--step-s`` seconds, replicas
  taking turns; the first tenth recorded in baseline, the next in shadow, the
  rest in compact). One evaluation is what a controller tick in compact
  computes over its window (the newest five evaluation intervals of the
  default policy, open at the top as a live controller's is): every gate's
  metric (all depths, both kinds, bootstrap intervals with 200 resamples, step
  latency) at the equal-width bins the gates read (equal-mass ECE and AUROC
  are the report's, timed apart), the reads its gates ask for (shadow's full-block
  and windowed references, each replica's labels and windowed labels) and a
  verdict for every gate of the default policy in compact, shadow's references
  kept from the tick before as a controller keeps them
  (``controller.references``), and the window's settled whole buckets slid
  from a tick one evaluation interval earlier where the cache's rule says a
  slide pays (``controller.window_cache``; the third tick of a controller;
  ``eval_window_read``: whether it slid; ``eval_fresh_*``: the same tick,
  after the same two, with no cache; ``eval_slid_cpu_ratio``: their paired
  CPU ratio; ``--window-intervals`` widens the window, as a lookback does); as
  the controller's tick past baseline, it leaves out baseline's step buckets,
  which only the report reads. It reads the ingest-time sums; the baseline, run in the same process
  in paired, alternating rounds, reads the same window's rows. The report is a
  full-history ``evaluate(...).report()``. Building the file is not timed.
- merge: ``--replicas`` per-replica ``Aggregate``s merged in one vectorised sum,
  beside the baseline of folding ``Aggregate.merge`` pairwise.

Times are medians over ``--repeats`` rounds, with wall and CPU time (DuckDB's
threads included) and the ratio of each round's pair; the 1-minute load average
is printed with them because the figures scale with whatever else the machine
runs. Peak resident memory is the process's.
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
from sparkgate.collectors.metrics import peak_rss_mb
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import Parsed, flatten, from_wire
from sparkgate.policies.rollout import load_rollout_policy

from .evaluate import evaluate, optional_reads
from .fleet import merge_aggregates
from .gates import judge_all
from .queries import Window
from .references import References
from .supervisor import lookback_start
from .window_cache import WindowCache

GAMMA, BATCH, BATCH_STEPS, REPLICAS = 7, 32, 2000, 4
EVAL_TARGET_MS, REPORT_TARGET_MS, MERGE_TARGET_MS = 100, 1000, 50
WINDOW_INTERVALS = 5
# The stage whose tick is timed: compact's gates ask for every optional read (shadow's references, each
# replica's labels), so its tick is the dearest of the ladder's.
JUDGED = "compact"


def build_store(store: Store, labels: int, step_s: float = 0.01) -> int:
    """Fill ``store`` with about ``labels`` depth labels over ``REPLICAS`` replicas, a step every ``step_s``
    seconds; returns the stored count."""
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
            ts=1.75e9 + first * step_s,
        )
        ts = 1.75e9 + (first + np.arange(n)) * step_s
        wire = wire.set_column(wire.schema.get_field_index("ts"), "ts", pa.array(ts))
        phase = "baseline" if first < baseline_steps else "shadow" if first < 2 * baseline_steps else "compact"
        return from_wire(wire.set_column(wire.schema.get_field_index("phase"), "phase", pa.array([phase] * n)))

    return sum(r.labels for r in store.ingest_stream((batch(first), "bench") for first in range(0, steps, BATCH_STEPS)))


def _timed(fn) -> tuple[float, float]:
    """(wall ms, CPU ms) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def time_evaluation(
    store: Store, repeats: int, intervals: int = WINDOW_INTERVALS
) -> dict[str, list[tuple[float, float]]]:
    """Per round, (wall ms, CPU ms) of a tick's evaluation from the sums and from the rows (alternating which
    goes first), and of a full-history report."""
    policy = load_rollout_policy()
    gates = policy.gates_for(JUDGED)
    newest = store.query("SELECT max(ts) AS t FROM steps").to_pylist()[0]["t"]
    # A live controller's window: the newest intervals, open at the top (``Supervisor.window``).
    window = Window(lookback_start(newest, intervals * policy.evaluation_interval_s))

    # Shadow's references kept from the tick before, as a controller's next tick finds them; the seed is the
    # controller's (a fixed one), so each round's bootstraps are the same work.
    kept = References()
    step = policy.evaluation_interval_s
    # The two ticks before, when the newest steps were one and two intervals older.
    earlier = [Window(window.since - k * step, newest - k * step + 1e-3) for k in (2, 1)]  # type: ignore[operator]

    def tick(arm: str, cache: WindowCache | None = None, w: Window = window) -> None:
        reads = optional_reads(gates)
        evaluation = evaluate(store, w, use_sums=arm != "rows", baseline=False, references=kept,
                              window_cache=cache, **reads)  # fmt: skip
        assert len(judge_all(gates, evaluation.measurements(JUDGED))) == len(gates)

    def after_two(arm: str) -> tuple[float, float]:
        # A tick after the two before it, as a live controller's third: with the cache (arm "sums") the
        # window's settled buckets slide where the cache's rule says that pays; "fresh" reads them again.
        cache = WindowCache() if arm == "sums" else None
        for w in earlier:
            tick(arm, cache, w)
        timed = _timed(functools.partial(tick, arm, cache))
        if cache is not None:
            runs["read"].append(cache.slid)
        return timed

    runs: dict[str, list] = {"sums": [], "fresh": [], "rows": [], "report": [], "read": []}
    tick("fresh")  # first touch of the file's pages (and the references' read), in no arm
    for seed in range(repeats):
        order = ("sums", "fresh", "rows")
        for arm in order if seed % 2 == 0 else order[::-1]:
            runs[arm].append(after_two(arm) if arm != "rows" else _timed(functools.partial(tick, arm)))
        runs["report"].append(_timed(lambda: evaluate(store, Window(), seed=seed).report(JUDGED)))  # noqa: B023
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


def _ms(runs: list[tuple[float, float]], i: int) -> float:
    return round(statistics.median(r[i] for r in runs), 1)


def run(labels: int, replicas: int, repeats: int, step_s: float = 0.01, intervals: int = WINDOW_INTERVALS) -> dict:
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-") as tmp, Store(Path(tmp) / "bench.duckdb") as store:
        start = time.perf_counter()
        stored = build_store(store, labels, step_s)
        setup_s = time.perf_counter() - start
        history_s = store.query("SELECT max(ts) - min(ts) AS s FROM steps").to_pylist()[0]["s"]
        newest = store.query("SELECT max(ts) AS t FROM steps").to_pylist()[0]["t"]
        window_labels = store.query(
            "SELECT count(*) AS n FROM depth_labels WHERE ts >= ?",
            [lookback_start(newest, intervals * load_rollout_policy().evaluation_interval_s)],
        ).to_pylist()[0]["n"]
        runs = time_evaluation(store, repeats, intervals)
    merge_runs, fold_runs = time_merge(replica_aggregates(replicas), repeats)
    merge_ms = statistics.median(merge_runs)
    ratios = [s[1] / r[1] for s, r in zip(runs["sums"], runs["rows"])]  # CPU time: the cost itself
    slid = [s[1] / f[1] for s, f in zip(runs["sums"], runs["fresh"])]
    return {
        "labels": stored,
        "history_s": round(history_s, 1),
        "window_intervals": intervals,
        "window_labels": window_labels,
        "eval_ms": _ms(runs["sums"], 0),
        "eval_cpu_ms": _ms(runs["sums"], 1),
        "eval_runs_ms": [round(w, 1) for w, _ in runs["sums"]],
        "eval_fresh_ms": _ms(runs["fresh"], 0),
        "eval_fresh_cpu_ms": _ms(runs["fresh"], 1),
        "eval_window_read": "slid" if all(runs["read"]) else "fresh" if not any(runs["read"]) else "mixed",
        "eval_slid_cpu_ratio": round(statistics.median(slid), 3),
        "eval_slid_cpu_ratio_range": [round(min(slid), 3), round(max(slid), 3)],
        "eval_from_rows_ms": _ms(runs["rows"], 0),
        "eval_from_rows_cpu_ms": _ms(runs["rows"], 1),
        "eval_cpu_ratio": round(statistics.median(ratios), 3),
        "eval_cpu_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "eval_target_ms": EVAL_TARGET_MS,
        "report_ms": _ms(runs["report"], 0),
        "report_target_ms": REPORT_TARGET_MS,
        "merge_replicas": replicas,
        "merge_ms": round(merge_ms, 2),
        "merge_fold_ms": round(statistics.median(fold_runs), 2),
        "merge_target_ms": MERGE_TARGET_MS,
        "merge_speedup": round(statistics.median(fold_runs) / merge_ms, 1),
        "setup_s": round(setup_s, 1),
        "peak_rss_mb": peak_rss_mb(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


@click.command("controller")
@click.option("--labels", default=10_000_000, show_default=True, type=click.IntRange(min=1),
              help="Depth labels in the evaluated store.")  # fmt: skip
@click.option("--replicas", default=1000, show_default=True, type=click.IntRange(min=1), help="Aggregates merged.")
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1),
              help="Timed rounds (the median is reported).")  # fmt: skip
@click.option("--step-s", default=0.01, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between steps: with --labels, how long the history is.")  # fmt: skip
@click.option("--window-intervals", default=WINDOW_INTERVALS, show_default=True, type=click.IntRange(min=1),
              help="Evaluation intervals in the tick's window (a lookback reaching back further).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_controller(
    labels: int, replicas: int, repeats: int, step_s: float, window_intervals: int, as_json: bool
) -> None:
    """A controller tick's evaluation over a long history (from the sums and from the rows), a full-history
    report, and a merge of per-replica aggregates."""
    click.echo(f"building a store of {labels:,} labels …", err=True)
    result = run(labels, replicas, repeats, step_s, window_intervals)
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key:>16}: {value}")
