"""Runtime command: ``sparkgate generate`` (one verify mode, one prompt)."""

from __future__ import annotations

import json

import click

from sparkgate.policies.window import FixedWindow

from .admission import positions_needed
from .cli_checks import SEED, check_gamma, check_positions
from .defaults import default_drafter, default_target
from .engine import Engine, EngineConfig, Request
from .modes import MODES
from .summary import run_timed, summarize


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")


@click.command()
@click.option("--prompt", required=True, help="Prompt text (UTF-8 bytes are the tokens).")
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--mode", type=click.Choice([str(m) for m in MODES]), default="static", show_default=True)
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1))
@click.option("--window", default=3, show_default=True, type=click.IntRange(min=0),
              help="Fixed window for compact/cap_accept/shadow.")  # fmt: skip
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0), help="0 is greedy.")
@click.option("--seed", default=0, show_default=True, type=SEED)
def generate(prompt, max_new_tokens, mode, gamma, window, temperature, seed):
    """Generate a continuation with the runtime in one verify mode."""
    tokens = encode(prompt)
    if not tokens:
        raise click.BadParameter("'' is empty: give at least one character", param_hint=["--prompt"])
    target = default_target(seed)
    drafter = default_drafter(target)
    check_gamma(gamma, drafter)
    check_positions(
        positions_needed(len(tokens), max_new_tokens, gamma),
        target.args.max_seq_len,
        f"a prompt of {len(tokens)} bytes, --max-new-tokens {max_new_tokens} and --gamma {gamma}",
        "--max-new-tokens",
    )
    engine = Engine(target, drafter, EngineConfig(gamma=gamma, max_batch=1), policy=FixedWindow(window))
    records, outputs, seconds = run_timed(engine, [Request("cli", tokens, max_new_tokens, temperature, seed, mode)])
    click.echo(decode(outputs["cli"]))
    click.echo(json.dumps(summarize(records, outputs, seconds)), err=True)
