"""``sparkgate profile``: measure verify step time on this machine and fit a cost table.

For each batch size the profiler prefills that many prompts, then forces a grid
of verify budgets (fractions of the ``B × γ`` drafts, spread evenly over the
requests, as SGLang's profiler forces budget fractions) and times the target's
verify step at each. The additive table ``bias + α(bs) + θ(rows)`` is fitted by
least squares over the medians; the report carries the median relative error
of the fit and a PNG of measured against predicted times.
"""
from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import click
import torch
from tqdm import tqdm

from policies.cost_model import AdditiveCostTable, CostMeta, save_cost_table
from policies.cost_profile import StepSample, fit_additive_table, hardware_fingerprint, median_relative_error

from .kv_cache import KVCache
from .model import Transformer, model_version
from .tiers import DEFAULT_TIERS, TierGrid, parse_tiers
from .verify import TargetRunner

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_FRACTIONS = (0.0, 0.15, 0.3, 0.5, 0.75, 1.0)


@dataclass
class Profile:
    table: AdditiveCostTable
    samples: list[StepSample]
    median_rel_error: float


def even_windows(batch: int, gamma: int, budget: int) -> list[int]:
    """``budget`` drafts spread over ``batch`` requests, none above γ."""
    if not 0 <= budget <= batch * gamma:
        raise ValueError(f"budget {budget} outside [0, {batch * gamma}]")
    base, extra = divmod(budget, batch)
    return [base + (i < extra) for i in range(batch)]


def _time_ms(runner: TargetRunner, tokens: torch.Tensor, lens: list[int], slots: list[int], repeats: int) -> float:
    sync = torch.cuda.synchronize if tokens.is_cuda else (lambda: None)
    runner.verify(tokens, lens, slots)  # warm this shape
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        runner.verify(tokens, lens, slots)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _warm_up(model: Transformer) -> None:
    """First calls pay for allocator and kernel set-up; keep that out of the samples."""
    cache = KVCache(model.args, 2, device=model.output.weight.device, dtype=model.output.weight.dtype)
    runner = TargetRunner(model, cache)
    slots = [cache.alloc(), cache.alloc()]
    runner.prefill([[1] * 16, [2] * 16], slots)
    tokens = torch.ones(2, 8, dtype=torch.long, device=model.output.weight.device)
    for _ in range(3):
        runner.verify(tokens, [8, 3], slots)


def measure(model: Transformer, batches: tuple[int, ...], fractions: tuple[float, ...], gamma: int,
            repeats: int, prompt_len: int = 64, grid: TierGrid | None = None,
            progress: bool = True) -> list[StepSample]:
    device = model.output.weight.device
    grid = grid or TierGrid()
    samples = []
    bar = tqdm(total=len(batches) * len(fractions), desc="profile", unit="shape", disable=not progress)
    gen = torch.Generator().manual_seed(0)
    _warm_up(model)
    for batch in batches:
        cache = KVCache(model.args, batch, device=device, dtype=model.output.weight.dtype)
        runner = TargetRunner(model, cache, grid)
        slots = [cache.alloc() for _ in range(batch)]
        runner.prefill(torch.randint(0, model.args.vocab_size, (batch, prompt_len), generator=gen).tolist(), slots)
        tokens = torch.randint(0, model.args.vocab_size, (batch, gamma + 1), generator=gen).to(device)
        for fraction in fractions:
            lens = [w + 1 for w in even_windows(batch, gamma, round(fraction * batch * gamma))]
            seconds = _time_ms(runner, tokens, lens, slots, repeats)
            samples.append(StepSample(batch, sum(lens), seconds))
            bar.set_postfix(bs=batch, rows=sum(lens), ms=f"{seconds * 1e3:.2f}")
            bar.update(1)
    bar.close()
    return samples


def profile_model(model: Transformer, *, batches=DEFAULT_BATCHES, fractions=DEFAULT_FRACTIONS, gamma: int = 7,
                  repeats: int = 5, grid: TierGrid | None = None, progress: bool = True) -> Profile:
    grid = grid or TierGrid()
    samples = measure(model, batches, fractions, gamma, repeats, grid=grid, progress=progress)
    meta = CostMeta(hardware=hardware_fingerprint(model.output.weight.device), model=model_version(model),
                    tiers=tuple(grid.tiers), created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    version=f"profile-{model_version(model)}-{int(time.time())}")
    # Fewer row probes than measured shapes, so the fit has to generalise and its
    # error says something (one probe per distinct row count would interpolate exactly).
    # Every probe lies inside the measured range so no coefficient floats free.
    low, top = min(s.verify_rows for s in samples), max(s.verify_rows for s in samples)
    m_probes = [low, *(1 << i for i in range(top.bit_length()) if low < 1 << i < top), top]
    table = fit_additive_table(samples, m_probes=_tier_probes(m_probes, grid), meta=meta)
    return Profile(table, samples, median_relative_error(table, samples))


def _tier_probes(probes: list[int], grid: TierGrid) -> list[int]:
    """Probes moved onto tier sizes (rows are rounded up to tiers before fitting)."""
    return sorted({grid.select(p).tier_rows for p in probes})


def plot_profile(profile: Profile, path: str | Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for batch in sorted({s.batch_size for s in profile.samples}):
        pts = [s for s in profile.samples if s.batch_size == batch]
        rows = torch.tensor([float(s.verify_rows) for s in pts])
        predicted = profile.table.step_seconds(batch, rows) * 1e3
        line, = ax.plot(rows, [s.seconds * 1e3 for s in pts], "o", label=f"bs={batch}")
        ax.plot(rows, predicted, "-", color=line.get_color(), alpha=0.7)
    ax.set_xlabel("verify rows")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"measured (dots) vs fitted (lines); median rel. error {profile.median_rel_error:.1%}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


@click.command()
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="Cost-table JSON to write.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="PNG (default: beside --out).")
@click.option("--batch-sizes", default=",".join(map(str, DEFAULT_BATCHES)), show_default=True)
@click.option("--fractions", default=",".join(map(str, DEFAULT_FRACTIONS)), show_default=True,
              help="Budget fractions of the B×γ drafts to force.")
@click.option("--gamma", default=7, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", default=1, show_default=True,
              help="torch intra-op threads; profile with the threading replicas serve with.")
@click.option("--tiers", default=",".join(map(str, DEFAULT_TIERS)), show_default=True,
              help="Graph-tier row counts; recorded in the table so predictions step at tier boundaries.")
def profile(out_path, plot_path, batch_sizes, fractions, gamma, repeats, device, threads, tiers):
    """Measure step time over batch sizes × verify budgets and fit the additive cost table."""
    torch.set_num_threads(threads)
    try:
        grid = TierGrid(parse_tiers(tiers))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tiers") from None
    from .defaults import default_target

    try:
        batches, fracs = _ints(batch_sizes), _floats(fractions)
    except ValueError as exc:
        raise click.BadParameter(f"expected comma-separated numbers ({exc})") from None
    if any(not 0 <= f <= 1 for f in fracs):
        raise click.BadParameter(f"fractions must lie in [0, 1], got {fracs}", param_hint="--fractions")
    result = profile_model(default_target().to(device), batches=batches, fractions=fracs, gamma=gamma,
                           repeats=repeats, grid=grid)
    save_cost_table(result.table, out_path)
    plot_path = plot_path or str(Path(out_path).with_suffix(".png"))
    plot_profile(result, plot_path)
    click.echo(json.dumps({"cost_table": out_path, "plot": plot_path, "samples": len(result.samples),
                           "median_rel_error": round(result.median_rel_error, 4),
                           "version": result.table.meta.version}))
