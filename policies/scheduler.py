"""DSpark's prefix scheduler as pure tensor functions.

Every function runs on the survivals' device with fixed-shape ops only: no
``.item()``, no data-dependent shapes, so a CUDA caller never waits on the host.

The pipeline (``CostAwareScheduler`` in ``policies.window`` composes it):

1. ``clean_survival``: NaN to 0, clip to [0, 1], running minimum along depth.
2. ``admission_order``: every (request, depth) candidate in the order the
   scheduler admits them: survival desc, depth asc, request asc, with the first
   ``min_window`` depths of every request forced to the front.
3. ``expected_committed``: ``tau(k) = B + sum of the first k admitted survivals``
   for every budget ``k = 0 .. B*gamma`` (each request always commits one token).
4. ``best_budget``: ``argmax_k tau(k) / T(B, B + k)`` (``T`` from the cost table;
   the 1-D table's ``tau(k) * SPS(B + k)`` is the same quantity).
5. ``assign_windows``: each request's window is its count among the first k.

Because survivals are non-increasing along depth and equal survivals are
admitted shallower-depth first, a request's depth d is admitted only after all
its depths < d: every budget yields per-request prefixes, and a larger budget
never shortens any window.
"""

from __future__ import annotations

import torch


def clean_survival(survival: torch.Tensor) -> torch.Tensor:
    """float32 ``[B, gamma]`` in [0, 1], non-increasing along depth.

    The running minimum repairs calibration round-off (a later depth a hair
    above an earlier one) that would otherwise let ties break prefix order.
    """
    s = torch.nan_to_num(survival.to(torch.float32), nan=0.0).clamp(0.0, 1.0)
    return torch.cummin(s, dim=1).values


def admission_order(survival: torch.Tensor, min_window: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidates in admission order: ``(requests [B*gamma], survivals [B*gamma])``.

    ``survival`` must already be clean. Flattening depth-major (index
    ``depth * B + request``) and sorting stably on survival alone realises the
    full tie-break survival desc, depth asc, request asc in one sort.
    Forced depths (``< min_window``) get a key above any probability, so they
    come first and are counted with their real survival in ``tau``.
    """
    batch_size = survival.shape[0]
    key = survival.clone()
    key[:, :min_window] = 2.0
    order = torch.sort(key.t().reshape(-1), descending=True, stable=True).indices
    return order % batch_size, survival.t().reshape(-1)[order]


def expected_committed(admitted: torch.Tensor, batch_size: int) -> torch.Tensor:
    """``tau[k]`` for k = 0 .. len(admitted): expected tokens committed by the batch."""
    zero = torch.zeros(1, dtype=admitted.dtype, device=admitted.device)
    return batch_size + torch.cat([zero, torch.cumsum(admitted, dim=0)])


def best_budget(tau: torch.Tensor, step_seconds: torch.Tensor) -> torch.Tensor:
    """0-d int64: the budget maximising committed tokens per second.

    Infeasible budgets carry ``inf`` seconds (rate 0, below any feasible rate
    since ``tau >= B >= 1``). Ties go to the smallest budget: argmax returns the
    first maximum, and fewer rows cost no more.
    """
    return torch.argmax(tau / step_seconds)


def assign_windows(requests: torch.Tensor, budget: torch.Tensor | int, batch_size: int) -> torch.Tensor:
    """int64 ``[B]``: how many of the first ``budget`` admitted candidates each request holds."""
    taken = (torch.arange(requests.numel(), device=requests.device) < budget).to(torch.int64)
    windows = torch.zeros(batch_size, dtype=torch.int64, device=requests.device)
    return windows.scatter_add_(0, requests, taken)
