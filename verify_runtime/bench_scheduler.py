"""``sparkgate bench scheduler``: what choosing windows costs per step.

Times every window policy side by side on the same survivals, and a static
verify of the same shape with the runtime, and reports
``schedule_fraction = cost-aware scheduler ms / static verify ms`` (target
<= 0.03 on CPU). It sits beside the runtime because it needs the runtime's
verify timing; the policies it times import nothing of the runtime.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import click
import torch

from sparkgate.collectors.metrics import peak_rss_mb
from sparkgate.policies.cost_model import AdditiveCostTable, CostTable, load_cost_table
from sparkgate.policies.window import (
    ConfidenceThreshold,
    CostAwareScheduler,
    FixedWindow,
    WindowContext,
    WindowPolicy,
)

from .bench import STATIC_PROMPT_LEN, time_static_verify
from .cli_checks import check_positions
from .device_options import resolve_graphs

TARGET_FRACTION = 0.03
DISTINCT_INPUTS = 16  # cycled so no policy benefits from seeing one matrix over and over


def synthetic_cost_table() -> AdditiveCostTable:
    """A table shaped like a small GPU model's: rows are nearly free up to 64, then linear.

    Scheduler time barely depends on the values; a profiled table can be given instead.
    """
    return AdditiveCostTable(
        bias_seconds=0.004,
        bs_probes=(1, 256),
        alpha_seconds=(0.0, 0.002),
        m_probes=(1, 64, 2048),
        theta_seconds=(0.0, 0.0005, 0.03),
    )


def synthetic_survivals(batch: int, gamma: int, count: int, device: str, seed: int = 0) -> list[torch.Tensor]:
    """Prefix survivals from per-depth confidences spread over [0.3, 1)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.cumprod(0.3 + 0.7 * torch.rand(batch, gamma, generator=gen), dim=1).to(device) for _ in range(count)]


def time_policy(
    policy: WindowPolicy, inputs: list[torch.Tensor], ctxs: list[WindowContext], steps: int, warmup: int = 10
) -> dict[str, float]:
    """Per-call wall time in ms (median, p99) and the mean window it chose."""
    cuda = inputs[0].is_cuda
    for i in range(warmup):
        policy(inputs[i % len(inputs)], ctxs[i % len(ctxs)])
    times, windows = [], []
    for i in range(steps):
        start = time.perf_counter()
        decision = policy(inputs[i % len(inputs)], ctxs[i % len(ctxs)])
        if cuda:
            torch.cuda.synchronize()  # the measurement waits, not the policy
        times.append((time.perf_counter() - start) * 1000.0)
        windows.append(decision.windows)
    times.sort()
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    return {
        "median_ms": statistics.median(times),
        "p99_ms": p99,
        "mean_window": float(torch.stack(windows).float().mean()),
    }


def run_benchmark(batch: int, gamma: int, steps: int, device: str, table: CostTable, table_name: str) -> dict:
    inputs = synthetic_survivals(batch, gamma, DISTINCT_INPUTS, device)
    ctxs = [WindowContext(batch, gamma)]
    # The lagged scheduler decides from the survivals two inputs back, as the runtime would feed it.
    lagged_ctxs = [WindowContext(batch, gamma, inputs[(i - 2) % len(inputs)]) for i in range(len(inputs))]
    cost_aware = CostAwareScheduler(table)
    results = {
        "fixed": time_policy(FixedWindow(gamma), inputs, ctxs, steps),
        "threshold": time_policy(ConfidenceThreshold(0.5, min_window=1), inputs, ctxs, steps),
        "cost_aware": time_policy(cost_aware, inputs, ctxs, steps),
        "cost_aware_lag2": time_policy(CostAwareScheduler(table, lag=2), inputs, lagged_ctxs, steps),
    }
    verify_ms = float(time_static_verify(batch, gamma, device=device))
    scheduler_ms = results["cost_aware"]["median_ms"]
    return {
        "benchmark": "scheduler",
        "batch": batch,
        "gamma": gamma,
        "steps": steps,
        "device": device,
        "threads": torch.get_num_threads(),
        "cost_table": table_name,
        "policies": results,
        "scheduler_ms": scheduler_ms,
        "verify_ms": verify_ms,
        "schedule_fraction": scheduler_ms / verify_ms,
        "target_fraction": TARGET_FRACTION,
    }


@click.command("scheduler")
@click.option("--batch", default=64, show_default=True, type=click.IntRange(min=1), help="Requests per step.")
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1), help="Draft tokens per request.")
@click.option("--steps", default=500, show_default=True, type=click.IntRange(min=1), help="Timed calls per policy.")
@click.option("--device", default="cpu", show_default=True, help="Device the survivals live on.")
@click.option(
    "--cost-table",
    "cost_table",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Cost table JSON (default: a synthetic table; fingerprint not checked).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_scheduler(batch: int, gamma: int, steps: int, device: str, cost_table: Path | None, as_json: bool) -> None:
    """Window-policy time per step, and as a fraction of static verify time."""
    from .defaults import default_target_args

    resolve_graphs(device, graphs=False)  # refuses a --device torch cannot parse
    check_positions(
        STATIC_PROMPT_LEN + gamma + 1,  # the prompt's positions, then one block of γ + 1 rows past them
        default_target_args().max_seq_len,
        f"the static verify's prompt of {STATIC_PROMPT_LEN} tokens and a block of --gamma {gamma} + 1",
        "--gamma",
    )
    table = synthetic_cost_table() if cost_table is None else load_cost_table(cost_table)
    table_name = "synthetic" if cost_table is None else str(cost_table)
    report = run_benchmark(batch, gamma, steps, device, table, table_name)
    report["peak_rss_mb"] = peak_rss_mb()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"scheduler bench: batch={batch} gamma={gamma} steps={steps} device={device}")
    for name, r in report["policies"].items():
        click.echo(
            f"  {name:16s} median {r['median_ms']:.4f} ms  p99 {r['p99_ms']:.4f} ms  mean window {r['mean_window']:.2f}"
        )
    click.echo(
        f"  static verify {report['verify_ms']:.3f} ms -> schedule_fraction "
        f"{report['schedule_fraction']:.4f} (target <= {TARGET_FRACTION})"
    )
