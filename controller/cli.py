"""The ``sparkgate`` console script.

Subcommands live beside the code they drive and are imported only when invoked,
so ``sparkgate --help`` stays fast and the package import direction of DESIGN §1
holds (this module never imports the runtime at load time).
"""
from __future__ import annotations

import importlib

import click

# name -> ("module:attribute" of a click command, one-line help). Each package
# adds its own commands here.
COMMANDS: dict[str, tuple[str, str]] = {
    "bench": ("controller.cli:bench", "Benchmarks that print JSON ratios against a baseline."),
    "demo": ("controller.demo:demo", "The main job: a local fleet walks the rollout, takes a fault, falls back."),
    "generate": ("verify_runtime.cli:generate", "Generate text with the runtime in one verify mode."),
    "train": ("verify_runtime.train_cli:train", "Train the target LM and the DSpark block drafter on the stdlib corpus."),
    "eval": ("verify_runtime.eval_cli:evaluate", "Offline evaluation (eval drafter: acceptance, calibration, latency)."),
    "calibrate": ("verify_runtime.calibrate_cli:calibrate", "Fit STS temperatures from full-block step records."),
    "ingest": ("collectors.cli:ingest", "Ingest NDJSON files of step records into a DuckDB store."),
    "export": ("collectors.cli:export", "Export stored events as Parquet partitioned by date and replica."),
    "collect": ("collectors.cli:collect", "Poll SGLang DSpark records / vLLM spec-decode metrics."),
    "profile": ("verify_runtime.profiler:profile", "Measure step time here and fit a cost table (JSON + PNG)."),
    "prune": ("collectors.cli:prune", "Delete stored events older than a retention window."),
    "serve": ("controller.commands:serve", "Run the controller: policy/ingest API, gates, rollout, /metrics."),
    "replica": ("verify_runtime.replica:replica", "Run a runtime replica that follows a controller's policy."),
    "status": ("controller.commands:status", "Show the rollout phase, gate verdicts and recent decisions."),
    "promote": ("controller.commands:promote", "Advance the rollout one rung now (operator)."),
    "abort": ("controller.commands:abort", "Roll back to fallback now (operator)."),
    "pause": ("controller.commands:pause", "Hold the rollout at its stage (operator)."),
    "resume": ("controller.commands:resume", "Leave fallback or paused (operator)."),
    "dashboard": ("dashboards.cli:dashboard", "Operator dashboards (Streamlit): rollout, calibration, acceptance, tiers, fleet."),
    "report": ("controller.commands:report", "Metrics over a window: ECE per depth, utilization, misses, latency."),
}

# Benchmarks: `sparkgate bench NAME`.
BENCHMARKS: dict[str, tuple[str, str]] = {
    "verify": ("verify_runtime.bench:bench_verify", "static vs compact verification cost."),
    "ingest": ("collectors.bench:bench_ingest", "Batch vs row-wise ingestion, plus HTTP, in rows/s."),
    "e2e": ("verify_runtime.bench_e2e:bench_e2e", "Engine tokens/s: static vs fixed short window vs cost-aware."),
    "scheduler": ("policies.bench:bench_scheduler", "Window-policy time per step vs static verify time."),
    "controller": ("controller.bench:bench_controller", "Full gate evaluation over stored labels; fleet aggregate merge."),
    "dashboard": ("dashboards.bench:bench_dashboard", "First render of each dashboard page on a synthetic 10M-label store."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are resolved from a registry on first use."""

    def __init__(self, *args, registry: dict[str, tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.registry = registry

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.registry) | set(super().list_commands(ctx)))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.registry:
            return super().get_command(ctx, name)
        module_name, attr = self.registry[name][0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Static help keeps `--help` from importing torch for every subcommand.
        rows = [(name, self.registry[name][1]) for name in sorted(self.registry)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, registry=COMMANDS)
@click.version_option(package_name="sparkgate")
def main() -> None:
    """sparkgate: stage confidence-scheduled speculative decoding safely."""


@click.group(cls=LazyGroup, registry=BENCHMARKS)
def bench() -> None:
    """Benchmarks: each runs its baseline side by side and prints JSON."""
