"""The goodput curve of ``sparkgate bench e2e --goodput-rates``: request latency from light load to saturation.

For each Poisson arrival rate, static and cost-aware compact serve the same
requests open-loop (a request arrives at its time whether or not the engine is
busy, and waits in the queue), and the engine's request records give TTFT and
TPOT at p50 and p99. The SLO is p99 TPOT at most ``tpot_slo_ms``: given, or 3x
static's median TPOT at the lightest rate (about batch 1). An arm *sustains* a
rate when its p99 TPOT meets the SLO there and at every lighter rate; the
figure is the ratio of the highest rates the two arms sustain.

Arms alternate within a round, in reversed order every other round; each round
gives one ratio, and the report is their median with the order-statistic
interval [min, max] over the rounds and its coverage of the median,
``1 - 2^(1 - rounds)``, because this machine's identical runs differ by 20%.
CPU time per committed token is reported beside wall time: it measures the same
compute without the neighbours' share of the cores.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass

from sparkgate.collectors.request_records import RequestRecord
from sparkgate.policies.cost_model import CostTable
from sparkgate.policies.window import CostAwareScheduler, FixedWindow, WindowPolicy

from .engine import Engine, EngineConfig, Request
from .workload import mixed_workload

ARMS = ("static", "cost_aware")
# The idle engine waits for the next arrival in slices this short, so an arrival is served promptly.
_IDLE_SLICE_S = 0.002


@dataclass(frozen=True)
class Sweep:
    rates: tuple[float, ...]  # requests per second, ascending
    requests: int  # per rate and arm
    max_new_tokens: int
    rounds: int
    max_batch: int
    gamma: int
    tpot_slo_ms: float | None = None


def open_loop(engine: Engine, requests: list[Request], rate: float, seed: int) -> tuple[list[RequestRecord], float]:
    """Serve ``requests`` arriving as a Poisson process at ``rate``; (their records, CPU seconds spent)."""
    records: list[RequestRecord] = []
    engine.request_sink = records.append
    rng, at = random.Random(seed), 0.0
    arrivals: deque[tuple[float, Request]] = deque()
    for request in requests:
        at += rng.expovariate(rate)
        arrivals.append((at, request))
    start, wall, cpu = time.perf_counter(), time.time(), time.process_time()
    while arrivals or engine.queue or engine.active:
        now = time.perf_counter() - start
        while arrivals and arrivals[0][0] <= now:
            t, request = arrivals.popleft()
            request.arrival_ts = wall + t
            engine.submit(request)
        if engine.queue or engine.active:
            engine.step()
        else:
            time.sleep(min(_IDLE_SLICE_S, max(arrivals[0][0] - now, 0.0)))
    return records, time.process_time() - cpu


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(records: list[RequestRecord], cpu_s: float) -> dict:
    ttft = [r.ttft_ms for r in records if r.ttft_ms is not None]
    tpot = [r.tpot_ms for r in records if r.tpot_ms is not None]
    tokens = sum(r.output_tokens for r in records)
    return {
        "ttft_p50_ms": _quantile(ttft, 0.5),
        "ttft_p99_ms": _quantile(ttft, 0.99),
        "tpot_p50_ms": _quantile(tpot, 0.5),
        "tpot_p99_ms": _quantile(tpot, 0.99),
        "cpu_ms_per_token": 1000 * cpu_s / tokens if tokens else None,
    }


def sustained(by_rate: dict[float, dict], slo_ms: float) -> float:
    """The highest rate whose p99 TPOT meets the SLO there and at every lighter rate (0: not even the lightest)."""
    best = 0.0
    for rate in sorted(by_rate):
        p99 = by_rate[rate]["tpot_p99_ms"]
        if p99 is None or p99 > slo_ms:
            break
        best = rate
    return best


def run_goodput(
    target, drafter, table: CostTable, sweep: Sweep, calibrate=None, progress: bool = True, prompts=None
) -> dict:
    """Every arm at every rate, ``sweep.rounds`` interleaved rounds; the curve, the SLO and the ratio.
    ``prompts`` (``.task``, ``.tokens``; default the mixed workload) are served at every rate."""
    policies: dict[str, tuple[str, WindowPolicy]] = {
        "static": ("static", FixedWindow(sweep.gamma)),
        "cost_aware": ("compact", CostAwareScheduler(table)),
    }
    prompts = prompts or mixed_workload(sweep.requests, seed=7)
    curves: list[dict[str, dict[float, dict]]] = []
    for r in range(sweep.rounds):
        curve: dict[str, dict[float, dict]] = {name: {} for name in ARMS}
        for name in ARMS if r % 2 == 0 else ARMS[::-1]:
            mode, policy = policies[name]
            for rate in sweep.rates:
                if progress:
                    print(f"bench goodput: {name} at {rate:g} req/s (round {r + 1}/{sweep.rounds})", file=sys.stderr)
                engine = Engine(target, drafter, EngineConfig(gamma=sweep.gamma, max_batch=sweep.max_batch),
                                policy=policy, calibrate=calibrate)  # fmt: skip
                requests = [Request(f"{p.task}-{i}", p.tokens, sweep.max_new_tokens, mode=mode, task=p.task, seed=i,
                                    stop_at_eos=False) for i, p in enumerate(prompts)]  # fmt: skip
                records, cpu_s = open_loop(engine, requests, rate, seed=r * 1000 + int(rate * 10))
                curve[name][rate] = figures(records, cpu_s)
        curves.append(curve)
    slo = sweep.tpot_slo_ms or 3 * curves[0]["static"][sweep.rates[0]]["tpot_p50_ms"]
    ratios = []
    for curve in curves:
        base = sustained(curve["static"], slo)
        ratios.append(sustained(curve["cost_aware"], slo) / base if base else None)
    valid = [x for x in ratios if x is not None]
    return {
        "rates": list(sweep.rates),
        "tpot_slo_ms": round(slo, 3),
        "curves": [{name: {str(rate): f for rate, f in c[name].items()} for name in ARMS} for c in curves],
        "sustained": [{name: sustained(c[name], slo) for name in ARMS} for c in curves],
        "sustained_ratio": statistics.median(valid) if valid else None,
        "sustained_ratio_interval": [min(valid), max(valid)] if valid else None,
        "interval_coverage": round(1 - 2.0 ** (1 - len(valid)), 3) if valid else None,
        "rounds": len(curves),
    }
