"""``sparkgate profile``: measure decode step time on this machine and fit a cost table.

The table must predict what the scheduler trades against: the whole decode
step the engine records as ``step_ms`` (draft, schedule, verify, accept and
commit), at the context lengths it serves. So the profiler runs the real
engine with the drafter it serves with: for each batch size and each forced
verify budget (a fraction of the ``B × γ`` drafts, spread evenly over the
requests, as SGLang's profiler forces budget fractions) a fresh engine admits
``B`` prompts of ``context`` tokens, takes one unrecorded step, then records
``repeats`` steps; their median ``step_ms`` is the sample. The drafter's cost
depends on the batch only, so the additive table ``bias + α(bs) + θ(rows)``
carries it in ``α``; leaving it out made every step look cheaper in fixed cost
than it is and the scheduler verify too little. The table is fitted by least
squares; the report carries the median relative error of the fit and a PNG of
measured against predicted times. ``meta.model`` is ``step_version``: the
target's and the drafter's versions, since both set the step time.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from sparkgate.collectors.schema import StepRecord
from sparkgate.policies.cost_model import AdditiveCostTable, CostMeta
from sparkgate.policies.cost_profile import (
    StepSample,
    fit_additive_table,
    hardware_fingerprint,
    median_relative_error,
)
from sparkgate.policies.window import WindowContext, WindowDecision

from .drafters import Drafter
from .engine import Engine, EngineConfig, Request
from .model import Transformer, model_version
from .tiers import TierGrid

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_FRACTIONS = (0.0, 0.15, 0.3, 0.5, 0.75, 1.0)
# Prompt tokens each profiled request starts from: the serving workload's contexts
# run from ~96 (prompt) to ~224 tokens (prompt + 128 new), and attention grows with them.
DEFAULT_CONTEXT = 160


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


def step_version(model: Transformer, drafter: Drafter) -> str:
    """What a step-time table was measured for: the target and the drafter (``meta.model``)."""
    return f"{model_version(model)}+{drafter.version}"


@dataclass
class ForcedWindows:
    """A window policy that verifies the same per-request windows every step (a forced budget)."""

    windows: list[int]
    # Built once per device: a step that copies from the host could not be graph-captured.
    _on_device: dict = field(default_factory=dict, init=False, repr=False)

    def __call__(self, survival: torch.Tensor, ctx: WindowContext) -> WindowDecision:
        windows = self._on_device.get(survival.device)
        if windows is None:
            windows = self._on_device[survival.device] = torch.tensor(self.windows, device=survival.device)
        return WindowDecision(windows)


def _step_sample(
    model: Transformer,
    drafter: Drafter,
    windows: list[int],
    gamma: int,
    repeats: int,
    context: int,
    grid: TierGrid,
    gen: torch.Generator,
    graphs: bool = False,
) -> StepSample:
    """The median recorded ``step_ms`` of a full batch whose every request verifies ``windows[i]`` drafts."""
    batch = len(windows)
    engine = Engine(
        model,
        drafter,
        EngineConfig(gamma=gamma, max_batch=batch, default_mode="compact"),
        policy=ForcedWindows(windows),
        tiers=grid,
        graphs=graphs,
    )
    prompts = torch.randint(0, model.args.vocab_size, (batch, context), generator=gen).tolist()
    for i, prompt in enumerate(prompts):  # long enough that nobody finishes while being timed
        engine.submit(Request(f"profile-{i}", prompt, (repeats + 1) * (gamma + 1), seed=i, stop_at_eos=False))
    engine.step()  # the first step also admits and prefills
    records: list[StepRecord] = []
    for _ in range(repeats):
        record = engine.step()
        assert record is not None, "no request finishes while being timed"
        records.append(record)
    return StepSample(batch, records[0].verify_rows, statistics.median(r.step_ms for r in records) / 1e3)


def measure(
    model: Transformer,
    drafter: Drafter,
    batches: tuple[int, ...],
    fractions: tuple[float, ...],
    gamma: int,
    repeats: int,
    context: int = DEFAULT_CONTEXT,
    grid: TierGrid | None = None,
    progress: bool = True,
    graphs: bool = False,
) -> list[StepSample]:
    """One ``StepSample`` per (batch size, budget fraction), in that order; ``graphs``: steps replay
    CUDA-graph tiers, as a CUDA replica serves them."""
    grid = grid or TierGrid()
    gen = torch.Generator().manual_seed(0)
    samples = []
    bar = tqdm(total=len(batches) * len(fractions), desc="profile", unit="shape", disable=not progress)
    for batch in batches:
        for fraction in fractions:
            windows = even_windows(batch, gamma, round(fraction * batch * gamma))
            sample = _step_sample(model, drafter, windows, gamma, repeats, context, grid, gen, graphs)
            samples.append(sample)
            bar.set_postfix(bs=batch, rows=sample.verify_rows, ms=f"{sample.seconds * 1e3:.2f}")
            bar.update(1)
    bar.close()
    return samples


def profile_model(
    model: Transformer,
    drafter: Drafter,
    *,
    batches=DEFAULT_BATCHES,
    fractions=DEFAULT_FRACTIONS,
    gamma: int = 7,
    repeats: int = 5,
    context: int = DEFAULT_CONTEXT,
    grid: TierGrid | None = None,
    progress: bool = True,
    graphs: bool = False,
) -> Profile:
    grid = grid or TierGrid()
    samples = measure(
        model, drafter, batches, fractions, gamma, repeats, context, grid=grid, progress=progress, graphs=graphs
    )
    meta = CostMeta(
        hardware=hardware_fingerprint(model.output.weight.device),
        model=step_version(model, drafter),
        tiers=tuple(grid.tiers),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        version=f"profile-{model_version(model)}-{int(time.time())}",
    )
    # Fewer row probes than measured shapes, so the fit has to generalise and its
    # error says something (one probe per distinct row count would interpolate exactly).
    # Every probe is a row count a step was measured at once rounded to its tier, so no coefficient floats
    # free (the fit refuses a probe no sample lies near: the quick profile measured nothing near 16 rows).
    low, top = min(s.verify_rows for s in samples), max(s.verify_rows for s in samples)
    m_probes = [low, *(1 << i for i in range(top.bit_length()) if low < 1 << i < top), top]
    measured = set(_tier_probes([s.verify_rows for s in samples], grid))
    probes = [p for p in _tier_probes(m_probes, grid) if p in measured]
    table = fit_additive_table(samples, m_probes=probes, meta=meta)
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
        (line,) = ax.plot(rows, [s.seconds * 1e3 for s in pts], "o", label=f"bs={batch}")
        ax.plot(rows, predicted, "-", color=line.get_color(), alpha=0.7)
    ax.set_xlabel("verify rows")
    ax.set_ylabel("decode step time (ms)")
    ax.set_title(f"measured (dots) vs fitted (lines); median rel. error {profile.median_rel_error:.1%}")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
