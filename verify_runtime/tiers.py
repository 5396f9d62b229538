"""Graph tiers: the packed row count is rounded up to a captured tier.

A tier hit runs the step at the tier's static row count (``tier_rows -
verify_rows`` padding rows). A miss runs eager at the exact row count and
says why: ``over_max_tier`` (more rows than the largest tier), ``not_captured``
(the tier exists in the grid but was never captured), ``forced_eager``.

On CUDA a hit replays the tier's CUDA graph (``cuda_graphs.GraphTiers``); on CPU
there are no graphs, so a hit runs the same padded static shapes eagerly and
"captured" means the tier was warmed up.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from sparkgate.policies.vocabulary import MissReason

# Fine steps where batches usually land, so padding stays under ~15% of rows;
# one graph per tier is cheap next to the padding it saves.
DEFAULT_TIERS = (8, 16, 24, 32, *range(48, 257, 16), *range(288, 513, 32))


@dataclass(frozen=True)
class TierChoice:
    tier: int  # index into the grid, -1 on a miss
    tier_rows: int  # rows the step runs with
    graph_hit: bool
    miss_reason: MissReason | None


@dataclass(frozen=True)
class TierGrid:
    tiers: tuple[int, ...] = DEFAULT_TIERS
    captured: frozenset[int] | None = None  # None: every tier
    force_eager: bool = False

    def __post_init__(self) -> None:
        if not self.tiers or any(t <= 0 for t in self.tiers) or list(self.tiers) != sorted(set(self.tiers)):
            raise ValueError(f"tiers must be positive and strictly increasing, got {self.tiers}")
        if self.captured is not None and not set(self.captured) <= set(self.tiers):
            raise ValueError(f"captured tiers {sorted(set(self.captured) - set(self.tiers))} are not in the grid")

    @property
    def captured_tiers(self) -> tuple[int, ...]:
        return self.tiers if self.captured is None else tuple(t for t in self.tiers if t in self.captured)

    def reachable(self, max_rows: int) -> tuple[int, ...]:
        """The captured tiers a step of at most ``max_rows`` rows can select: larger ones
        would cost capture time and graph memory and never replay."""
        cover = bisect.bisect_left(self.tiers, max_rows)
        limit = self.tiers[min(cover, len(self.tiers) - 1)]
        return tuple(t for t in self.captured_tiers if t <= limit)

    def select(self, rows: int) -> TierChoice:
        if rows < 1:
            raise ValueError(f"a step needs at least one row, got {rows}")
        if self.force_eager:
            return TierChoice(-1, rows, False, MissReason.FORCED_EAGER)
        index = bisect.bisect_left(self.tiers, rows)
        if index == len(self.tiers):
            return TierChoice(-1, rows, False, MissReason.OVER_MAX_TIER)
        if self.tiers[index] not in self.captured_tiers:
            return TierChoice(-1, rows, False, MissReason.NOT_CAPTURED)
        return TierChoice(index, self.tiers[index], True, None)


def parse_tiers(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` -> ``(8, 16, 32)`` with a clear error on bad input."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"tiers must be comma-separated integers, got {text!r}") from None


def served_grid(grid: TierGrid, device_type: str, graphs: bool) -> TierGrid:
    """The grid a runner serves: ``grid``, or on CUDA without graphs every step a ``forced_eager`` miss at
    its exact rows, since a tier "hit" there would record a graph replay that never ran (on CPU a hit is
    the padded static shapes, as the module says)."""
    return replace(grid, force_eager=True) if device_type == "cuda" and not graphs else grid


def measured_grid(tiers: tuple[int, ...] | list[int] | None) -> TierGrid:
    """The tiers a replica captures: those its cost table was measured at (``meta.tiers``), so the
    table prices exactly the shapes the runtime runs; the default grid when the table names none."""
    return TierGrid(tuple(tiers)) if tiers else TierGrid()
