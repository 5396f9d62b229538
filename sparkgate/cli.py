"""The ``sparkgate`` console script: every command, registered explicitly.

This is the one module that sees every layer (docs/design.md §1). Each loader
imports its layer's commands inside a function, so ``sparkgate --help`` and the
controller's commands never load torch, and the import-direction test reads
these imports like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from sparkgate.policies.cli_types import finite_numbers
from sparkgate.policies.errors import InputError

Commands = dict[str, click.Command]


def _runtime() -> Commands:
    from sparkgate.verify_runtime import (
        calibrate_cli,
        cli,
        eval_cli,
        profile_cli,
        replica_cli,
        train_cli,
    )

    return {
        "generate": cli.generate,
        "train": train_cli.train,
        "eval": eval_cli.evaluate,
        "calibrate": calibrate_cli.calibrate,
        "profile": profile_cli.profile,
        "replica": replica_cli.replica,
    }


def _runtime_bench() -> Commands:
    from sparkgate.verify_runtime import bench, bench_e2e, bench_scheduler

    return {"verify": bench.bench_verify, "e2e": bench_e2e.bench_e2e, "scheduler": bench_scheduler.bench_scheduler}


def _collectors() -> Commands:
    from sparkgate.collectors import cli

    return {"ingest": cli.ingest, "export": cli.export, "collect": cli.collect, "prune": cli.prune}


def _collectors_bench() -> Commands:
    from sparkgate.collectors import bench

    return {"ingest": bench.bench_ingest}


def _controller() -> Commands:
    from sparkgate.controller import backtest, commands, cost_table_cli, simulate, simulate_fit

    names = ("serve", "status", "promote", "abort", "pause", "resume", "report")
    return {name: getattr(commands, name) for name in names} | {
        "backtest": backtest.backtest,
        "simulate": simulate.simulate,
        "simulate-fit": simulate_fit.simulate_fit,
        "cost-table": cost_table_cli.cost_table,
    }


def _controller_bench() -> Commands:
    from sparkgate.controller import bench, bench_writers

    return {"controller": bench.bench_controller, "writers": bench_writers.bench_writers}


def _policies() -> Commands:
    from sparkgate.policies import policy_cli

    return {"policy": policy_cli.policy}


def _dashboards() -> Commands:
    from sparkgate.dashboards import cli

    return {"dashboard": cli.dashboard}


def _dashboards_bench() -> Commands:
    from sparkgate.dashboards import bench

    return {"dashboard": bench.bench_dashboard}


def _demo() -> Commands:
    from sparkgate.demo import command

    return {"demo": command.demo}


def _bench() -> Commands:
    return {"bench": bench}


@dataclass(frozen=True)
class Entry:
    """One subcommand: the loader of the layer that defines it, and its one-line help."""

    load: Callable[[], Commands]
    help: str


COMMANDS: dict[str, Entry] = {
    "bench": Entry(_bench, "Benchmarks that print JSON ratios against a baseline."),
    "demo": Entry(_demo, "The main job: a local fleet walks the rollout, takes a fault, falls back."),
    "generate": Entry(_runtime, "Generate text with the runtime in one verify mode."),
    "train": Entry(_runtime, "Train the target LM and the DSpark block drafter on the stdlib corpus."),
    "eval": Entry(_runtime, "Offline evaluation (eval drafter: acceptance, calibration, latency)."),
    "calibrate": Entry(_runtime, "Fit STS temperatures from full-block step records."),
    "profile": Entry(_runtime, "Measure step time here and fit a cost table (JSON + PNG)."),
    "replica": Entry(_runtime, "Run a runtime replica that follows a controller (closed or open-loop load, faults)."),
    "ingest": Entry(_collectors, "Ingest NDJSON files of step records into a DuckDB store."),
    "export": Entry(_collectors, "Export stored events as Parquet partitioned by date and replica."),
    "collect": Entry(_collectors, "Poll SGLang DSpark records / vLLM spec-decode metrics."),
    "prune": Entry(_collectors, "Delete stored events older than a retention window."),
    "serve": Entry(_controller, "Run the controller: policy/ingest API, gates, rollout, /metrics."),
    "status": Entry(_controller, "Show the rollout phase, gate verdicts and recent decisions."),
    "promote": Entry(_controller, "Advance the rollout one rung now (operator)."),
    "abort": Entry(_controller, "Roll back to fallback now (operator)."),
    "pause": Entry(_controller, "Hold the rollout at its stage (operator)."),
    "resume": Entry(_controller, "Leave fallback or paused (operator)."),
    "report": Entry(_controller, "Metrics over a window: ECE per depth, utilization, misses, latency."),
    "backtest": Entry(_controller, "Replay a store's history through a policy beside its decisions; acts on nothing."),
    "simulate": Entry(_controller, "Seeded simulated rollouts through the real controller: how often it is wrong."),
    "simulate-fit": Entry(_controller, "Fit the simulator's fleet model to a runtime's records and check it (KS)."),
    "cost-table": Entry(_controller, "The controller's versioned cost tables: list, show, revert to static."),
    "policy": Entry(_policies, "The rollout policy file: print its JSON Schema, or check a file."),
    "dashboard": Entry(_dashboards, "Operator dashboards (Streamlit): rollout, calibration, acceptance, tiers, fleet."),
}

# `sparkgate bench NAME`.
BENCHMARKS: dict[str, Entry] = {
    "verify": Entry(_runtime_bench, "static vs compact verification cost."),
    "e2e": Entry(_runtime_bench, "Engine tokens/s: static vs fixed short window vs cost-aware."),
    "scheduler": Entry(_runtime_bench, "Window-policy time per step vs static verify time."),
    "ingest": Entry(_collectors_bench, "Batch vs row-wise ingestion, plus HTTP, in rows/s."),
    "controller": Entry(_controller_bench, "Full gate evaluation over stored labels; fleet aggregate merge."),
    "writers": Entry(_controller_bench, "HTTP ingest with concurrent writers and readers, with and without reports."),
    "dashboard": Entry(_dashboards_bench, "First render of each dashboard page on a synthetic 10M-label store."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are loaded from their layer on first use."""

    def __init__(self, *args: Any, registry: dict[str, Entry], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.registry = registry

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.registry)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        entry = self.registry.get(name)
        return None if entry is None else finite_numbers(entry.load()[name])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Static help keeps `--help` from importing torch for every subcommand.
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.registry[name].help) for name in sorted(self.registry)])


class CommandLine(LazyGroup):
    """The console script: bad input a command names (``policies.errors.InputError``, or a file it cannot
    read or write) is printed as that one line, exit 1, instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InputError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            if exc.filename is None:  # a socket or a process, not a path the user gave: a bug's traceback
                raise
            raise click.ClickException(f"{exc.filename}: {exc.strerror or exc}") from None


@click.group(cls=CommandLine, registry=COMMANDS)
@click.version_option(package_name="sparkgate")
def main() -> None:
    """sparkgate: stage confidence-scheduled speculative decoding safely."""


@click.group(cls=LazyGroup, registry=BENCHMARKS)
def bench() -> None:
    """Benchmarks: each runs its baseline side by side and prints JSON."""
