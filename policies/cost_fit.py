"""Fitting an additive cost table to measured steps, and bounding how far one update may move it.

The online cost model (docs/design.md §6, adaptive) refits a table from the
steps a replica group ran under it. Everything here is a pure function of
tensors: ``StepTimes`` in, a table or a figure out.

- ``fit_additive`` keeps the parent's probes and tiers and re-estimates
  ``bias + alpha(bs) + theta(M)``: a robust least-squares fit of relative error
  (iteratively reweighted towards the median, so a preempted step does not drag
  the table), with a ridge pull towards the parent so a probe no step came near
  keeps its old value. ``alpha[0]`` and ``theta[0]`` stay 0 as the profiler
  writes them (the model has one free constant, the bias).
- ``bounded`` moves a candidate back towards its parent until no prediction on
  the probe grid changes by more than a factor ``1 + max_change``.
- ``median_relative_error`` is the figure both the update rule and the gate read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from sparkgate.policies.cost_model import AdditiveCostTable, CostTable, CostTableError, round_up_to_tier

F64 = torch.float64
# The bias never reaches 0: SGLang's loader refuses bias_seconds <= 0.
MIN_BIAS_S = 1e-6


@dataclass(frozen=True)
class StepTimes:
    """Measured steps: batch size, verify rows and milliseconds, each ``[N]``.

    Invariants: the three tensors have one length; ``ms > 0``.
    """

    batch_size: torch.Tensor
    verify_rows: torch.Tensor
    ms: torch.Tensor

    def __post_init__(self) -> None:
        n = self.ms.numel()
        if self.batch_size.numel() != n or self.verify_rows.numel() != n:
            raise ValueError(
                f"StepTimes: batch_size has {self.batch_size.numel()}, verify_rows {self.verify_rows.numel()}, "
                f"ms {n} values; they must match"
            )
        bad = (~(torch.isfinite(self.ms) & (self.ms > 0))).nonzero().flatten()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"StepTimes: ms[{i}]={float(self.ms[i])}: must be a finite number > 0")

    def __len__(self) -> int:
        return self.ms.numel()

    def take(self, index: torch.Tensor | slice) -> StepTimes:
        return StepTimes(self.batch_size[index], self.verify_rows[index], self.ms[index])


def predict_ms(table: CostTable, steps: StepTimes) -> torch.Tensor:
    """The table's prediction for every step, in milliseconds (batch sizes may differ per step)."""
    sizes = steps.batch_size.to(torch.int64)
    out = torch.empty(len(steps), dtype=F64)
    for size in torch.unique(sizes).tolist():
        at = sizes == size
        out[at] = table.step_seconds(int(size), steps.verify_rows[at]) * 1000.0
    return out


def median_relative_error(table: CostTable, steps: StepTimes) -> float:
    """median |predicted - measured| / measured over ``steps`` (nan for none)."""
    if len(steps) == 0:
        return float("nan")
    measured = steps.ms.to(F64)
    return float(((predict_ms(table, steps) - measured).abs() / measured).median())


def _hat(x: torch.Tensor, probes: tuple[int, ...]) -> torch.Tensor:
    """Piecewise-linear interpolation weights ``[N, len(probes)]``, clamped at the ends as the table reads."""
    xs = torch.tensor(probes, dtype=F64)
    weights = torch.zeros(x.numel(), len(probes), dtype=F64)
    if len(probes) == 1:
        weights[:, 0] = 1.0
        return weights
    x = x.to(F64).clamp(xs[0], xs[-1])
    hi = torch.bucketize(x, xs, right=True).clamp(1, len(probes) - 1)
    lo = hi - 1
    frac = (x - xs[lo]) / (xs[hi] - xs[lo])
    rows = torch.arange(x.numel())
    weights[rows, lo] = 1.0 - frac
    weights[rows, hi] += frac
    return weights


def _design(table: AdditiveCostTable, steps: StepTimes) -> torch.Tensor:
    """Columns: bias, alpha[1:], theta[1:] (seconds), so a coefficient vector is a table."""
    rows = round_up_to_tier(steps.verify_rows.to(F64), table.meta.tiers)
    bias = torch.ones(len(steps), 1, dtype=F64)
    return torch.cat([bias, _hat(steps.batch_size, table.bs_probes)[:, 1:], _hat(rows, table.m_probes)[:, 1:]], 1)


def _coefficients(table: AdditiveCostTable) -> torch.Tensor:
    """The table's values as ``_design``'s coefficients, the end values taken relative to the first probe's."""
    alpha = torch.tensor(table.alpha_seconds, dtype=F64)
    theta = torch.tensor(table.theta_seconds, dtype=F64)
    bias = torch.tensor([table.bias_seconds + float(alpha[0]) + float(theta[0])], dtype=F64)
    return torch.cat([bias, alpha[1:] - alpha[0], theta[1:] - theta[0]])


def _table(parent: AdditiveCostTable, coef: torch.Tensor, version: str | None) -> AdditiveCostTable:
    """The table ``coef`` stands for, with the same prediction everywhere: each curve's least value moves into
    the bias, so every value is >= 0 however the curves fall (a curve that falls after its first probe has
    negative coefficients). Only a bias that would reach 0, a table predicting no time at some probe pair, is
    raised to ``MIN_BIAS_S``."""
    n_alpha = len(parent.bs_probes) - 1
    alpha = torch.cat([torch.zeros(1, dtype=F64), coef[1 : 1 + n_alpha]])
    theta = torch.cat([torch.zeros(1, dtype=F64), coef[1 + n_alpha :]])
    low_alpha, low_theta = float(alpha.min()), float(theta.min())
    return AdditiveCostTable(
        bias_seconds=max(float(coef[0]) + low_alpha + low_theta, MIN_BIAS_S),
        bs_probes=parent.bs_probes,
        alpha_seconds=tuple((alpha - low_alpha).tolist()),
        m_probes=parent.m_probes,
        theta_seconds=tuple((theta - low_theta).tolist()),
        meta=replace(parent.meta, version=version),
    )


@dataclass(frozen=True)
class FitArgs:
    """``ridge``: pull towards the parent, in units of one step's weight per coefficient; ``iters``: reweighting
    rounds; ``floor``: relative residual below which a step's weight stops growing (keeps the weights finite)."""

    ridge: float = 1.0
    iters: int = 20
    floor: float = 0.01


def fit_additive(
    parent: CostTable, steps: StepTimes, version: str | None = None, args: FitArgs = FitArgs()
) -> AdditiveCostTable:
    """A table with ``parent``'s probes, tiers and fingerprints, fitted to ``steps``.

    Minimises the median relative error by iteratively reweighted least squares
    (weight ``1 / (ms * sqrt(|relative residual|))``, the L1 weights in
    relative terms), with a ridge pull ``args.ridge`` towards the parent.
    Every value stays >= 0 and the bias > 0, so SGLang loads the result.
    Raises ``CostTableError`` for a 1-D table (its steps-per-second probes cannot
    be fitted additively) or no steps.
    """
    if not isinstance(parent, AdditiveCostTable):
        raise CostTableError("online updates need an additive table (bias_seconds ...), got a 1-D table")
    if len(steps) == 0:
        raise CostTableError("fit: needs at least one measured step, got none")
    design = _design(parent, steps)
    seconds = steps.ms.to(F64) / 1000.0
    prior = _coefficients(parent)
    # The ridge is scaled so it weighs like `ridge` typical steps whatever the step time's magnitude.
    scale = 1.0 / seconds.median()
    weights = 1.0 / seconds
    coef = prior
    for _ in range(args.iters):
        w = weights.sqrt()
        lhs = torch.cat([design * w[:, None], torch.eye(prior.numel(), dtype=F64) * (args.ridge**0.5) * scale])
        rhs = torch.cat([seconds * w, prior * (args.ridge**0.5) * scale])
        coef = torch.linalg.lstsq(lhs, rhs[:, None]).solution[:, 0]
        relative = ((design @ coef - seconds).abs() / seconds).clamp(min=args.floor)
        weights = 1.0 / (seconds**2 * relative)
    return _table(parent, coef, version)


def grid_ms(table: CostTable, probes: tuple[tuple[int, ...], tuple[int, ...]]) -> torch.Tensor:
    """Predictions ``[len(bs), len(rows)]`` on a grid of batch sizes and verify rows."""
    sizes, rows = probes
    grid = torch.tensor(rows, dtype=F64)
    return torch.stack([table.step_seconds(size, grid) * 1000.0 for size in sizes])


def change(parent: CostTable, candidate: CostTable, probes: tuple[tuple[int, ...], tuple[int, ...]]) -> float:
    """The largest factor by which ``candidate`` moves a prediction of ``parent`` on the grid (>= 1)."""
    ratio = grid_ms(candidate, probes) / grid_ms(parent, probes)
    return float(torch.maximum(ratio, 1.0 / ratio).max())


def bounded(parent: AdditiveCostTable, candidate: AdditiveCostTable, max_change: float) -> AdditiveCostTable:
    """``candidate`` moved back towards ``parent`` (same probes) until no prediction on the probe grid
    changes by more than a factor ``1 + max_change``.

    The tables' coefficients mix linearly, and so do their predictions, so the
    largest step ``t`` in [0, 1] that keeps every grid point within the bound is
    found point by point; ``t = 1`` returns the candidate itself.
    """
    if max_change < 0:
        raise ValueError(f"max_change: expected >= 0, got {max_change}")
    probes = (parent.bs_probes, parent.m_probes)
    p, q = grid_ms(parent, probes), grid_ms(candidate, probes)
    delta = q - p
    hi, lo = p * (1.0 + max_change), p / (1.0 + max_change)
    # Per point, the largest t with lo <= p + t * delta <= hi.
    limit = torch.where(delta > 0, (hi - p) / delta, torch.where(delta < 0, (lo - p) / delta, torch.ones_like(p)))
    t = float(limit.clamp(0.0, 1.0).min())
    if t >= 1.0:
        return candidate
    mixed = _coefficients(parent) + t * (_coefficients(candidate) - _coefficients(parent))
    return _table(parent, mixed, candidate.meta.version)
