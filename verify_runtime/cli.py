"""Runtime commands: ``sparkgate generate`` and (until the rollout demo lands) ``sparkgate demo``."""
from __future__ import annotations

import json
import sys
import time

import click
import torch

from policies.window import FixedWindow

from .defaults import default_drafter, default_target
from .engine import Engine, EngineConfig, Request
from .modes import MODES

# A small mixed workload: repetitive code, prose, and a prompt with little to copy.
DEMO_PROMPTS = {
    "code": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "prose": "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "hard": "zq7#Kp!x2@vL",
}


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


@click.command()
@click.option("--max-new-tokens", default=48, show_default=True)
@click.option("--gamma", default=7, show_default=True)
@click.option("--window", default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def demo(max_new_tokens, gamma, window, as_json):
    """Run the same mixed batch in every verify mode and compare what each verified and committed."""
    target = default_target(0)
    summary = {}
    for mode in MODES:
        engine = Engine(target, default_drafter(target), EngineConfig(gamma=gamma, max_batch=8),
                        policy=FixedWindow(window))
        requests = [Request(f"{task}-{i}", encode(text), max_new_tokens, mode=mode, task=task)
                    for i in range(2) for task, text in DEMO_PROMPTS.items()]
        with click.progressbar(length=1, label=f"{mode:<10}", file=sys.stderr) as bar:
            records, seconds = run_requests(engine, requests)
            bar.update(1)
        summary[mode] = mode_summary(records, seconds)
        outputs = {rid: r.output for rid, r in engine.finished.items()}
        summary[mode]["outputs_digest"] = hash(tuple(tuple(outputs[k]) for k in sorted(outputs)))
    digests = {s.pop("outputs_digest") for s in summary.values()}
    result = {"gamma": gamma, "window": window, "modes": summary, "identical_outputs": len(digests) == 1}
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{'mode':<11}{'steps':>6}{'rows':>7}{'window':>8}{'accepted':>10}{'tok/s':>9}")
    for mode, s in summary.items():
        click.echo(f"{mode:<11}{s['steps']:>6}{s['verify_rows']:>7}{s['mean_window']:>8}"
                   f"{s['mean_accepted']:>10}{s['committed_tokens_per_s']:>9}")
    click.echo(f"greedy outputs identical across modes: {result['identical_outputs']}")
