"""Window policies: how many of the γ drafted tokens each request verifies.

Every policy has one signature (docs/design.md §5): calibrated prefix survivals
``S [B, γ]`` (non-increasing along depth, in [0, 1]) and a ``WindowContext`` in,
a ``WindowDecision`` out whose ``windows`` are int64 in ``[0, γ]``, shape ``[B]``,
on the same device as ``S``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from sparkgate.policies.cost_model import CostTable
from sparkgate.policies.scheduler import (
    admission_order,
    assign_windows,
    best_budget,
    clean_survival,
    expected_committed,
)


@dataclass
class WindowContext:
    """What a policy may look at besides the survivals.

    ``lagged_survival``: ``[B, γ]`` survivals the same requests (same rows) had
    ``lag`` steps ago, for a policy constructed with ``lag > 0``. The runtime
    keeps that history per request because policies hold no state; rows for
    requests younger than the lag hold ones (verify everything until evidence
    arrives). On the host it lets the runtime know the step's budget without
    waiting for the device (see ``WindowDecision.budget``).
    """

    batch_size: int
    gamma: int
    lagged_survival: torch.Tensor | None = None


@dataclass
class WindowDecision:
    """Windows plus, for cost-aware policies, what the step is predicted to cost.

    ``predicted_step_ms`` and ``predicted_tokens_per_s`` (expected committed
    tokens per second for the batch) are 0-d tensors on the survivals' device
    when a scheduler computed them: turning them into floats would make a
    device caller wait, so convert them once the step has finished.
    ``budget`` is ``windows.sum()`` as the scheduler chose it, on the device of
    the survivals it was decided from (the lagged ones when lagged). A decision's
    tensors are read-only: a scheduler may hand the same ones to many decisions.
    """

    windows: torch.Tensor  # [B] int64 in [0, gamma]
    predicted_step_ms: float | torch.Tensor | None = None
    predicted_tokens_per_s: float | torch.Tensor | None = None
    budget: torch.Tensor | None = None


class WindowPolicy(Protocol):
    def __call__(self, survival: torch.Tensor, ctx: WindowContext) -> WindowDecision: ...


@dataclass
class FixedWindow:
    """Every request verifies the same ``k`` drafts (clamped to γ)."""

    k: int

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"FixedWindow.k must be >= 0, got {self.k}")

    def __call__(self, survival: torch.Tensor, ctx: WindowContext) -> WindowDecision:
        k = min(self.k, survival.shape[1])
        return WindowDecision(torch.full((survival.shape[0],), k, dtype=torch.long, device=survival.device))


@dataclass
class ConfidenceThreshold:
    """Each request verifies the depths whose prefix survival is at least ``p``,
    and never fewer than ``min_window`` (clamped to γ)."""

    p: float
    min_window: int = 0

    def __post_init__(self) -> None:
        if not (0.0 <= self.p <= 1.0):
            raise ValueError(f"ConfidenceThreshold.p must be in [0, 1], got {self.p}")
        if self.min_window < 0:
            raise ValueError(f"ConfidenceThreshold.min_window must be >= 0, got {self.min_window}")

    def __call__(self, survival: torch.Tensor, ctx: WindowContext) -> WindowDecision:
        # Counting survivors is a prefix length because clean survivals never increase with depth.
        above = (clean_survival(survival) >= self.p).sum(dim=1)
        return WindowDecision(above.clamp(min=min(self.min_window, survival.shape[1])))


@dataclass
class CostAwareScheduler:
    """DSpark's prefix scheduler (the pipeline is described in ``policies.scheduler``).

    Picks the total budget that maximises expected committed tokens per second
    under ``cost_table``, then gives each request the depths it holds among the
    globally best ``budget`` survivals. Invariants: every window is in
    ``[min(min_window, γ), γ]``; the admitted depths of a request form a prefix;
    the windows sum to ``budget``; a 1-D table's ``max_batch_tokens`` caps the
    rows planned unless ``min_window`` alone needs more.

    When the table prices every budget from ``min_window`` to the full block the
    same (a small batch whose rows all land in one graph tier), every request
    verifies the whole block and nothing is sorted: a padding row costs what a
    real one does, so a draft verified in its place can only add tokens (a
    survival of zero is an estimate), the step runs static's dense shape, and its
    labels stay uncensored. Elsewhere ties go to the smaller budget.

    ``min_window`` defaults to 0, as in SGLang's DSpark planner, whose
    ``min_verify_len`` of 1 counts the anchor row: a request whose first draft
    is unlikely verifies none. Its depth-1 label is not lost: the one row it
    verifies is the bonus, the target's token at depth 1's position, which
    recovers that label for a greedy request and estimates it
    (``next_accept_prob``) for a sampled one.
    ``lag > 0`` decides the budget from ``ctx.lagged_survival`` (the step
    ``t - lag`` survivals, as production servers do so the budget is known on
    the host without a device sync) while the windows within that budget still
    follow the current survivals. The runtime reads ``lag`` to know how much
    history to keep.
    """

    cost_table: CostTable
    min_window: int = 0
    lag: int = 0
    _curves: dict[tuple[int, int, str], torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    # Per curve key whose every budget, from the forced ones to the full block, has one price: the plan's
    # constant part (windows, step ms, budget, seconds), built once and shared read-only by its decisions.
    _flat: dict[tuple[int, int, str], tuple[torch.Tensor, ...] | None] = field(
        default_factory=dict, init=False, repr=False
    )
    _predictions: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.min_window < 0:
            raise ValueError(f"CostAwareScheduler.min_window must be >= 0, got {self.min_window}")
        if self.lag < 0:
            raise ValueError(f"CostAwareScheduler.lag must be >= 0, got {self.lag}")

    def step_seconds_curve(self, batch_size: int, gamma: int, device: torch.device | str) -> torch.Tensor:
        """float32 ``[B*γ + 1]``: predicted seconds at budget k, ``inf`` where k is infeasible.

        Built on the host once per (batch size, γ, device) and cached; the first
        call for a shape copies it to the device, so call this at warm-up for
        the batch sizes you serve to keep that copy out of the first steps.
        """
        key = (batch_size, gamma, str(device))
        curve = self._curves.get(key)
        if curve is None:
            n = batch_size * gamma
            rows = batch_size + torch.arange(n + 1, dtype=torch.float64)
            seconds = self.cost_table.step_seconds(batch_size, rows)
            lo = batch_size * min(self.min_window, gamma)
            max_rows = self.cost_table.max_verify_rows
            hi = n if max_rows is None else max(lo, min(n, max_rows - batch_size))
            seconds[:lo] = math.inf
            seconds[hi + 1 :] = math.inf
            curve = seconds.to(device=device, dtype=torch.float32)
            self._curves[key] = curve
            flat = hi == n and bool((seconds[lo:] == seconds[n]).all())
            self._flat[key] = (
                (
                    torch.full((batch_size,), gamma, dtype=torch.int64, device=device),
                    curve[n] * 1000.0,
                    torch.tensor(n, dtype=torch.int64, device=device),
                    curve[n],
                )
                if flat
                else None
            )
        return curve

    def flat_price(self, batch_size: int, gamma: int, device: torch.device | str) -> bool:
        """Whether every feasible budget up to the full block costs the same (decided on the host, cached
        with the curve)."""
        return self._full_plan(batch_size, gamma, device) is not None

    def _full_plan(self, batch_size: int, gamma: int, device: torch.device | str) -> tuple[torch.Tensor, ...] | None:
        key = (batch_size, gamma, str(device))
        if key not in self._flat:
            self.step_seconds_curve(batch_size, gamma, device)
        return self._flat[key]

    def table_step_ms(self, batch_size: int, verify_rows: int) -> float:
        """``cost_table``'s prediction for a step that verified ``verify_rows`` rows (what the step's time is
        measured against), cached per shape: a step pays a dict lookup, not a table evaluation."""
        key = (batch_size, verify_rows)
        ms = self._predictions.get(key)
        if ms is None:
            ms = self._predictions[key] = self.cost_table.predict_step_ms(batch_size, verify_rows)
        return ms

    def _plan(self, survival: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Admission order's requests, ``tau`` and the cost curve for clean survivals."""
        batch_size, gamma = survival.shape
        requests, admitted = admission_order(survival, min(self.min_window, gamma))
        curve = self.step_seconds_curve(batch_size, gamma, survival.device)
        return requests, expected_committed(admitted, batch_size), curve

    def _lagged(self, survival: torch.Tensor, ctx: WindowContext) -> torch.Tensor:
        lagged = ctx.lagged_survival
        if lagged is None:
            raise ValueError(f"CostAwareScheduler(lag={self.lag}) needs ctx.lagged_survival, got None")
        if lagged.shape != survival.shape:
            raise ValueError(
                f"ctx.lagged_survival: shape {tuple(lagged.shape)} does not match survival {tuple(survival.shape)}"
            )
        return clean_survival(lagged)

    def __call__(self, survival: torch.Tensor, ctx: WindowContext) -> WindowDecision:
        if survival.dim() != 2 or survival.shape[0] != ctx.batch_size or survival.shape[1] != ctx.gamma:
            raise ValueError(
                f"survival: shape {tuple(survival.shape)} does not match "
                f"ctx (batch_size={ctx.batch_size}, gamma={ctx.gamma})"
            )
        batch_size = survival.shape[0]
        if batch_size == 0:
            return WindowDecision(torch.zeros(0, dtype=torch.int64, device=survival.device))
        s = clean_survival(survival)
        full = self._full_plan(batch_size, survival.shape[1], survival.device)
        if full is not None:
            windows, step_ms, budget, seconds = full
            return WindowDecision(windows, step_ms, (batch_size + s.sum()) / seconds, budget)
        requests, tau, curve = self._plan(s)
        if self.lag:
            _, lagged_tau, lagged_curve = self._plan(self._lagged(s, ctx))
            budget = best_budget(lagged_tau, lagged_curve)
            k = budget.to(s.device, non_blocking=True)
        else:
            budget = k = best_budget(tau, curve)
        # index_select, not curve[k]: indexing with a 0-d tensor may read it on the host.
        seconds = curve.index_select(0, k.reshape(1)).squeeze(0)
        committed = tau.index_select(0, k.reshape(1)).squeeze(0)
        return WindowDecision(
            windows=assign_windows(requests, k, batch_size),
            predicted_step_ms=seconds * 1000.0,
            predicted_tokens_per_s=committed / seconds,
            budget=budget,
        )
