"""``sparkgate bench writers``: what the controller's HTTP service holds with concurrent writers and readers,
and what a large consistency report costs the ingest beside it.

A real service (uvicorn on 127.0.0.1, a fresh DuckDB file) takes ``--writers`` threads posting NDJSON
bodies of ``--body-steps`` step records and ``--readers`` threads reading ``/v1/status`` and
``/v1/decisions``. Each round runs two arms back to back, in alternating order: ``plain`` (that load
alone) and ``with_report`` (the same load while another client posts a 10,000-check consistency report
every ``--report-every-s`` seconds). Per arm: records/s, and p50/p99 of the writers' request latency.
The verdict is the per-round ratio of p99s (``with_report / plain``), its median and range over rounds:
the target is a median at most 2.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import click
import httpx

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import DEFAULT_MAX_BODY, serve_in_thread
from sparkgate.collectors.metrics import peak_rss_mb
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.policies.rollout import parse_rollout_policy

from .service import create_app
from .supervisor import Controller

REPORT_CHECKS = 10_000
TARGET_RATIO = 2.0
# A step of these records (16 requests) is about 10.2 kB of NDJSON (11 kB leaves a margin): a body of more
# steps than this passes the endpoint's limit and is refused, so the arm would time refusals (tests measure it).
MAX_BODY_STEPS = DEFAULT_MAX_BODY // 11_000


def _bodies(writer: int, count: int, steps: int, first: int) -> list[bytes]:
    return [
        b"".join(
            json.dumps(r).encode() + b"\n"
            for r in synthetic_wire(steps, 16, 7, f"w{writer}", first_step=first + i * steps, seed=i).to_pylist()
        )
        for i in range(count)
    ]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_arm(url: str, writers: int, readers: int, seconds: float, steps: int, report_every_s: float | None,
            first_step: int) -> dict:  # fmt: skip
    """One arm: the writers' latencies and records/s over ``seconds``, with or without reports beside them."""
    stop = threading.Event()
    latencies: list[list[float]] = [[] for _ in range(writers)]
    posted = [0] * writers
    bodies = [_bodies(w, 40, steps, first_step) for w in range(writers)]

    def write(w: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for i, body in enumerate(bodies[w]):
                if stop.is_set():
                    return
                start = time.perf_counter()
                reply = http.post("/v1/records", content=body, headers={"content-type": "application/x-ndjson"})
                latencies[w].append(time.perf_counter() - start)
                if reply.status_code == 200:
                    posted[w] += steps
                if i == len(bodies[w]) - 1:
                    return

    def read() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.is_set():
                http.get("/v1/status")
                http.get("/v1/decisions", params={"limit": 10})

    def report() -> None:
        n = 0
        with httpx.Client(base_url=url, timeout=60) as http:
            while not stop.wait(report_every_s or 0):
                checks = [{"request_id": f"{first_step}-{n}-{i}", "tokens": 10} for i in range(REPORT_CHECKS)]
                http.post("/v1/consistency", json={"replica_id": "w0", "checks": checks})
                n += 1

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    threads += [threading.Thread(target=read) for _ in range(readers)]
    if report_every_s is not None:
        threads.append(threading.Thread(target=report))
    start = time.perf_counter()
    for t in threads:
        t.start()
    deadline = start + seconds
    while time.perf_counter() < deadline and any(t.is_alive() for t in threads[:writers]):
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    flat = [x for per in latencies for x in per]
    return {"records_per_s": sum(posted) / elapsed, "requests": len(flat),
            "p50_ms": 1000 * _quantile(flat, 0.5), "p99_ms": 1000 * _quantile(flat, 0.99)}  # fmt: skip


def run(writers: int, readers: int, seconds: float, steps: int, rounds: int, report_every_s: float) -> dict:
    policy = parse_rollout_policy({})
    arms: dict[str, list[dict]] = {"plain": [], "with_report": []}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.duckdb") as store:
        app = create_app(Controller(store, policy, resamples=20), Ingestor(store))
        with serve_in_thread(app) as url:
            first = 0
            for r in range(rounds):
                order = ("plain", "with_report") if r % 2 == 0 else ("with_report", "plain")
                results = {}
                for arm in order:
                    every = report_every_s if arm == "with_report" else None
                    results[arm] = run_arm(url, writers, readers, seconds, steps, every, first)
                    first += 10_000_000  # fresh step ids per arm, so no body is a duplicate
                for arm, result in results.items():
                    arms[arm].append(result)
                ratios.append(results["with_report"]["p99_ms"] / results["plain"]["p99_ms"])
    return {
        "benchmark": "writers",
        "writers": writers,
        "readers": readers,
        "seconds_per_arm": seconds,
        "body_steps": steps,
        "rounds": rounds,
        "report_checks": REPORT_CHECKS,
        "report_every_s": report_every_s,
        "arms": {
            arm: {
                "records_per_s_median": statistics.median(x["records_per_s"] for x in runs),
                "p50_ms_median": statistics.median(x["p50_ms"] for x in runs),
                "p99_ms_median": statistics.median(x["p99_ms"] for x in runs),
                "runs": runs,
            }
            for arm, runs in arms.items()
        },
        "p99_ratio_median": statistics.median(ratios),
        "p99_ratio_range": [min(ratios), max(ratios)],
        "p99_ratio_runs": ratios,
        "target_ratio": TARGET_RATIO,
        "met": statistics.median(ratios) <= TARGET_RATIO,
    }


@click.command("writers")
@click.option("--writers", default=6, show_default=True, type=click.IntRange(min=1), help="Concurrent writer clients.")
@click.option("--readers", default=2, show_default=True, type=click.IntRange(min=0), help="Concurrent reader clients.")
@click.option("--seconds", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds per arm and round.")  # fmt: skip
@click.option("--body-steps", default=50, show_default=True, type=click.IntRange(1, MAX_BODY_STEPS),
              help="Step records per body.")  # fmt: skip
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Rounds; each runs both arms, in alternating order.")  # fmt: skip
@click.option("--report-every-s", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds between 10,000-check reports.")  # fmt: skip
def bench_writers(writers: int, readers: int, seconds: float, body_steps: int, rounds: int,
                  report_every_s: float) -> None:  # fmt: skip
    """Records/s and writer latency with concurrent readers, with and without large consistency reports."""
    result = run(writers, readers, seconds, body_steps, rounds, report_every_s)
    click.echo(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}, indent=2))
