"""Runtime command: ``sparkgate generate`` (one verify mode, one prompt)."""
from __future__ import annotations

import json
import time

import click

from policies.window import FixedWindow

from .defaults import default_drafter, default_target
from .engine import Engine, EngineConfig, Request
from .modes import MODES


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


def run_requests(engine: Engine, requests: list[Request]) -> tuple[list, float]:
    records = []
    engine.sink = records.append
    for r in requests:
        engine.submit(r)
    start = time.perf_counter()
    engine.run()
    return records, time.perf_counter() - start


def mode_summary(records: list, seconds: float) -> dict:
    rows = [row for rec in records for row in rec.requests]
    committed = sum(len(r.committed_tokens) for r in rows)
    return {
        "steps": len(records),
        "verify_rows": sum(rec.verify_rows for rec in records),
        "mean_window": round(sum(r.window for r in rows) / len(rows), 3),
        "mean_accepted": round(sum(r.accepted for r in rows) / len(rows), 3),
        "committed_tokens": committed,
        "committed_tokens_per_s": round(committed / seconds, 1),
        "tier_misses": sum(not rec.graph_hit for rec in records),
    }


@click.command()
@click.option("--prompt", required=True, help="Prompt text (UTF-8 bytes are the tokens).")
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--mode", type=click.Choice(MODES), default="static", show_default=True)
@click.option("--gamma", default=7, show_default=True)
@click.option("--window", default=3, show_default=True, help="Fixed window for compact/cap_accept/shadow.")
@click.option("--temperature", default=0.0, show_default=True)
@click.option("--seed", default=0, show_default=True)
def generate(prompt, max_new_tokens, mode, gamma, window, temperature, seed):
    """Generate a continuation with the runtime in one verify mode."""
    target = default_target(seed)
    engine = Engine(target, default_drafter(target), EngineConfig(gamma=gamma, max_batch=1),
                    policy=FixedWindow(window))
    records, seconds = run_requests(engine, [Request("cli", encode(prompt), max_new_tokens, temperature, seed, mode)])
    click.echo(decode(engine.finished["cli"].output))
    click.echo(json.dumps(mode_summary(records, seconds)), err=True)
