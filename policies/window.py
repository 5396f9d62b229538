"""Window policies: how many of the γ drafted tokens each request verifies.

Every policy has one signature (DESIGN §5): calibrated prefix survivals
``S [B, γ]`` (non-increasing along depth, in [0, 1]) and a ``WindowContext`` in,
a ``WindowDecision`` out whose ``windows`` are int64 in ``[0, γ]``, shape ``[B]``,
on the same device as ``S``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class WindowContext:
    """What a policy may look at besides the survivals."""

    batch_size: int
    gamma: int


@dataclass
class WindowDecision:
    windows: torch.Tensor  # [B] int64 in [0, gamma]
    predicted_step_ms: float | None = None
    predicted_tokens_per_s: float | None = None


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
