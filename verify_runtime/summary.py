"""Run a set of requests through an engine, timed, and summarise its step records.

One summary serves the CLI and the end-to-end benchmark, so both report the
same figures the same way: ``tokens_per_s`` counts the tokens delivered to
requests (outputs cut at ``max_new_tokens`` or EOS), over wall time including
prefill; ``decode_tokens_per_s`` counts the same tokens over the decode steps'
own clock (the sum of ``step_ms``: draft through commit), the part a window
policy changes. Prefill is the same work under every policy, so it only dilutes
a comparison of policies, by a share that depends on prompt and output lengths.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sparkgate.collectors.schema import StepRecord

from .engine import Engine, Request


def run_timed(engine: Engine, requests: list[Request]) -> tuple[list[StepRecord], dict[str, list[int]], float]:
    """(step records, outputs by request id, wall seconds of its steps) for ``requests`` run to completion."""
    run = run_interleaved({"": (engine, requests)})[""]
    return run.records, run.outputs, run.seconds


@dataclass
class TimedRun:
    """One engine's share of an interleaved run: its records and outputs, and the wall and thread CPU
    seconds of its own steps (admission and prefill included)."""

    records: list[StepRecord]
    outputs: dict[str, list[int]]
    seconds: float
    cpu_seconds: float


def run_interleaved(runs: dict[str, tuple[Engine, list[Request]]]) -> dict[str, TimedRun]:
    """Run several engines to completion one step each in turn, in the order given.

    Each engine is timed over its own steps only, so the arms of a comparison share the
    machine's state within milliseconds of each other: a neighbour that slows the cores
    for a second slows every arm's steps in that second, instead of whichever arm ran
    through it alone. With one engine this is ``Engine.run``, timed.
    """
    timed = {name: TimedRun([], {}, 0.0, 0.0) for name in runs}
    for name, (engine, requests) in runs.items():
        engine.sink = timed[name].records.append
        for r in requests:
            engine.submit(r)
    pending = list(runs)
    while pending:
        for name in pending:
            engine, run = runs[name][0], timed[name]
            start, cpu = time.perf_counter(), time.thread_time()
            engine.step()
            run.seconds += time.perf_counter() - start
            run.cpu_seconds += time.thread_time() - cpu
        pending = [name for name in pending if runs[name][0].queue or runs[name][0].active]
    for name, (engine, _) in runs.items():
        timed[name].outputs = {rid: r.output for rid, r in engine.finished.items()}
    return timed


def summarize(records: list[StepRecord], outputs: dict[str, list[int]], seconds: float) -> dict:
    rows = [row for rec in records for row in rec.requests]
    tokens = sum(len(o) for o in outputs.values())
    decode_seconds = sum(rec.step_ms for rec in records) / 1000.0
    return {
        "tokens_per_s": round(tokens / seconds, 2),
        "decode_tokens_per_s": round(tokens / decode_seconds, 2),
        "decode_share": round(decode_seconds / seconds, 3),
        "committed_tokens": sum(len(r.committed_tokens) for r in rows),
        "mean_window": round(sum(r.window for r in rows) / len(rows), 3),
        "mean_accepted": round(sum(r.accepted for r in rows) / len(rows), 3),
        "mean_verify_rows": round(sum(rec.verify_rows for rec in records) / len(records), 2),
        "steps": len(records),
        "tier_misses": sum(not rec.graph_hit for rec in records),
        # Where a decode step's time goes, mean ms per step by stage.
        "stage_ms": {
            stage: round(sum(getattr(rec, f"{stage}_ms") for rec in records) / len(records), 3)
            for stage in ("draft", "schedule", "verify", "accept")
        },
    }
