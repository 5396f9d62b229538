"""``sparkgate bench verify``: static vs compact verification of one batch, side by side.

Both arms run on the same model, cache and prompts in one process, interleaved
step by step so machine noise hits both alike. Compact windows are drawn from a
binomial with the requested mean, so the packed rows (not ``B × (γ+1)``) decide
the cost. Each step pairs a compact verify with the static one next to it; the
verdict is the median of those paired ratios with its sign-test interval, judged
against ``1.15 × row_ratio + 0.03`` by the interval's upper end, in CPU time on a
CPU (one thread: the cost itself, without the neighbours' share of the cores)
and in wall time on a GPU.
"""

from __future__ import annotations

import json
import statistics
import time

import click
import torch

from sparkgate.collectors.metrics import peak_rss_mb

from .bench_verdict import interval, verdict
from .cli_checks import check_positions
from .device_options import device_options, resolve_graphs
from .kv_cache import KVCache
from .model import ModelArgs, Transformer
from .tiers import TierGrid
from .verify import TargetRunner
from .verify_overhead import narrow_twin, overhead_summary


def prepared_runner(
    batch: int, prompt_len: int, device: str, seed: int = 0, args: ModelArgs | None = None
) -> tuple[TargetRunner, list[int], int]:
    """The default target (the shipped one), or a seeded random model of ``args``, with ``batch`` prefilled
    random prompts of ``prompt_len``."""
    from .defaults import default_target

    torch.manual_seed(seed)
    model = (default_target(seed) if args is None else Transformer(args)).to(device).eval()
    cache = KVCache(model.args, batch, device=device)
    slots = [cache.alloc() for _ in range(batch)]
    runner = TargetRunner(model, cache, TierGrid())
    prompts = torch.randint(0, 256, (batch, prompt_len)).tolist()
    runner.prefill(prompts, slots)
    return runner, slots, model.num_params


# Compact's time over static's may exceed the row ratio by this factor and offset (the per-step costs that
# do not shrink with the rows).
ROW_FACTOR, ROW_OFFSET = 1.15, 0.03


def _timed(runner: TargetRunner, tokens: torch.Tensor, lens: list[int], slots: list[int]):
    """(wall ms, thread CPU ms, tier rows) of one verify."""
    sync = torch.cuda.synchronize if tokens.is_cuda else (lambda: None)
    sync()
    start, cpu = time.perf_counter(), time.thread_time()
    out = runner.verify(tokens, lens, slots)
    sync()
    return (time.perf_counter() - start) * 1000.0, (time.thread_time() - cpu) * 1000.0, out.tier.tier_rows


STATIC_PROMPT_LEN = 64  # tokens before the block time_static_verify verifies


def time_static_verify(batch: int, gamma: int, steps: int = 10, device: str = "cpu") -> float:
    """Median ms of one full-block verify step (the scheduler benchmark's yardstick)."""
    runner, slots, _ = prepared_runner(batch, STATIC_PROMPT_LEN, device)
    tokens = torch.randint(0, 256, (batch, gamma + 1), device=device)
    times = [_timed(runner, tokens, [gamma + 1] * batch, slots)[0] for _ in range(steps + 2)]
    return statistics.median(times[2:])


def run_verify_bench(
    batch: int,
    gamma: int,
    mean_window: float,
    steps: int,
    warmup: int,
    prompt_len: int,
    device: str,
    graphs: bool = False,
    profile: bool = False,
    overhead: bool = False,
) -> dict:
    runner, slots, params = prepared_runner(batch, prompt_len, device)
    twin = None
    if overhead:
        rng = torch.get_rng_state()  # restored after the twin, so the windows are the same with or without it
        twin = prepared_runner(batch, prompt_len, device, args=narrow_twin(runner.model.args))[:2]
        torch.set_rng_state(rng)
    if graphs:
        from .cuda_graphs import GraphTiers

        runner.graphs = GraphTiers(runner.model, runner.cache, runner.grid, gamma, batch)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (batch, gamma + 1), generator=gen).to(device)
    windows_dist = torch.distributions.Binomial(gamma, torch.tensor(mean_window / gamma))
    static_ms, compact_ms, compact_rows, compact_tier_rows, timed_windows = [], [], [], [], []
    wall_ratios = []
    cpu: dict[str, list[float]] = {"static": [], "compact": [], "twin_static": [], "twin_compact": []}
    for i in range(warmup + steps):
        windows = windows_dist.sample((batch,)).long().tolist()
        s_ms, s_cpu, _ = _timed(runner, tokens, [gamma + 1] * batch, slots)
        c_lens = [w + 1 for w in windows]
        c_ms, c_cpu, c_tier = _timed(runner, tokens, c_lens, slots)
        if twin is not None and i >= warmup:  # the same step on the twin, right after the real one
            cpu["twin_static"].append(_timed(twin[0], tokens, [gamma + 1] * batch, twin[1])[1])
            cpu["twin_compact"].append(_timed(twin[0], tokens, c_lens, twin[1])[1])
        if i >= warmup:
            cpu["static"].append(s_cpu)
            cpu["compact"].append(c_cpu)
            static_ms.append(s_ms)
            compact_ms.append(c_ms)
            wall_ratios.append(c_ms / s_ms)
            compact_rows.append(sum(c_lens))
            compact_tier_rows.append(c_tier)
            timed_windows.append(windows)
    cpu_ratios = [c / s for c, s in zip(cpu["compact"], cpu["static"], strict=True)]
    rows_static = batch * (gamma + 1)
    static, compact = statistics.median(static_ms), statistics.median(compact_ms)
    tier_rows_compact = statistics.median(compact_tier_rows)
    row_ratio = tier_rows_compact / rows_static
    result = {
        "device": device,
        "graphs": graphs,
        "threads": torch.get_num_threads(),
        "params": params,
        "batch": batch,
        "gamma": gamma,
        "prompt_len": prompt_len,
        "steps": steps,
        "mean_window": statistics.mean(r / batch - 1 for r in compact_rows),
        "rows_static": rows_static,
        "rows_compact": statistics.median(compact_rows),
        "tier_rows_compact": tier_rows_compact,
        "static_ms": round(static, 3),
        "compact_ms": round(compact, 3),
        "time_ratio": round(compact / static, 4),
        "row_ratio": round(row_ratio, 4),
        "paired_time_ratio": interval(wall_ratios, digits=4),
        # On a GPU the host thread's CPU time is not the step's cost: judge wall time there.
        "verdict": {
            "measure": "cpu" if device == "cpu" else "wall",
            **verdict(
                cpu_ratios if device == "cpu" else wall_ratios,
                round(ROW_FACTOR * row_ratio + ROW_OFFSET, 4),
                at_most=True,
                digits=4,
            ),
        },
    }
    if twin is not None:
        result["overhead"] = overhead_summary(cpu["static"], cpu["compact"], cpu["twin_static"], cpu["twin_compact"])
    if profile:  # after the timed steps, so the profiler's cost stays out of the timings
        from .verify_profile import profiled

        result["profile"] = profiled(runner, tokens, slots, timed_windows)
    return result


@click.command("verify")
@click.option("--batch", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1))
@click.option("--mean-window", default=2.5, show_default=True, type=click.FloatRange(min=0),
              help="Mean compact window (binomial), at most --gamma.")  # fmt: skip
@click.option("--steps", default=30, show_default=True, type=click.IntRange(min=1),
              help="Timed steps per arm (median reported).")  # fmt: skip
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0))
@click.option("--prompt-len", default=64, show_default=True, type=click.IntRange(min=0),
              help="Tokens in the cache before the verified block.")  # fmt: skip
@device_options
@click.option(
    "--threads",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="torch intra-op threads. One by default: at decode-sized row counts a second thread buys "
    "little, and spin-waiting threads make timings collapse when any other process shares the cores.",
)
@click.option(
    "--profile",
    is_flag=True,
    help="Also profile the timed steps again per operator category (matmul, attention, gathers, the rest).",
)
@click.option(
    "--overhead",
    is_flag=True,
    help="Also time every step on a narrow twin of the target (same operators and calls, width 16): the step's "
    "fixed cost, and compact/static of what is left (the arithmetic).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON result.")
def bench_verify(
    batch, gamma, mean_window, steps, warmup, prompt_len, device, graphs, threads, profile, overhead, as_json
):
    """Static vs compact verification cost on one batch; prints JSON."""
    from .defaults import default_target_args

    torch.set_num_threads(threads)
    if mean_window > gamma:
        raise click.BadParameter(f"{mean_window} is more than --gamma {gamma}", param_hint=["--mean-window"])
    if overhead and device != "cpu":
        # A GPU's cost is not the host thread's CPU time, which is what the twin's fixed cost is measured in.
        raise click.BadParameter(f"measures CPU time, so only on --device cpu, not {device}", param_hint="--overhead")
    graphs = resolve_graphs(device, graphs)
    check_positions(
        prompt_len + gamma + 1,  # the prompt's positions, then one block of γ + 1 rows past them
        default_target_args().max_seq_len,
        f"--prompt-len {prompt_len} and a block of --gamma {gamma} + 1",
        "--prompt-len",
    )
    result = run_verify_bench(batch, gamma, mean_window, steps, warmup, prompt_len, device, graphs, profile, overhead)
    result["peak_rss_mb"] = peak_rss_mb()
    if not as_json:
        v = result["verdict"]
        click.echo(
            f"compact/static {v['measure']} time {v['median']:.3f} [{v['low']}, {v['high']}] (target <= {v['target']}: "
            f"{'met' if v['met'] else 'not met'}) at rows {result['row_ratio']:.3f}",
            err=True,
        )
    click.echo(json.dumps(result))
