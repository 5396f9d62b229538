"""The ``adaptive:`` section of the rollout policy: how fitted cost tables replace the static ones.

The update rule it parameterises lives in ``controller.cost_updates``; the
method is docs/design.md §6 (adaptive). Every key has a default, so a policy
file without the section adapts with these.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from sparkgate.policies.fields import FROZEN, Float, Int, raise_all, want
from sparkgate.policies.vocabulary import COMPARISON_METRICS, DRIFT_METRICS

# The gate metrics only the adaptive phase measures (controller.adaptive_gates).
ADAPTIVE_METRICS = ("cost_prediction_error", "window_oscillation")
# Gates a cost table can fail: its own, the windows it chooses (utilization, tier misses) and the comparisons,
# which in adaptive judge the fitted tables against the static one, and their drifts. A failure of any other
# (calibration, consistency) is not the table's doing: it takes the rollout's usual path instead of reverting
# the table.
TABLE_METRICS = (*ADAPTIVE_METRICS, "upper_bound_utilization", "tier_miss_rate", *COMPARISON_METRICS, *DRIFT_METRICS)


class Adaptive(BaseModel):
    """Invariants: ``min_interval_s >= 0``; ``max_change > 0``; ``0 <= margin``, ``0 <= dead_band``;
    ``0 < holdout_fraction < 1``; ``2 <= min_steps <= max_steps``."""

    model_config = FROZEN

    min_interval_s: Float = Field(300.0, description="Seconds a replica group keeps a table before the next.")
    max_change: Float = Field(
        0.5, description="One update moves no prediction on the probe grid by more than a factor 1 + this."
    )
    margin: Float = Field(
        0.02,
        description="A candidate is published only when its held-out median relative error is below the "
        "current table's by this much (absolute).",
    )
    dead_band: Float = Field(
        0.10,
        description="No candidate is fitted while the current table's held-out median relative error is at "
        "most this (the hysteresis that keeps a good table from chasing noise).",
    )
    holdout_fraction: Float = Field(0.33, description="The newest share of the window's steps the fit never sees.")
    min_steps: Int = Field(500, description="Steps of a replica group in the window below which nothing is fitted.")
    max_steps: Int = Field(
        2000,
        description="Only the newest this many steps of the window are read (fitted and held out), so a "
        "change in the load shows in the fit after this many steps, not after the whole window.",
    )
    step_time: Literal["wall", "cpu"] = Field(
        "wall", description="What the tables predict: wall time, or the replica's CPU time (shared CPUs)."
    )

    @model_validator(mode="after")
    def _check(self) -> Adaptive:
        problems = []
        if not (math.isfinite(self.min_interval_s) and self.min_interval_s >= 0):
            problems.append(want("min_interval_s", self.min_interval_s, "a finite number of seconds >= 0"))
        if not (math.isfinite(self.max_change) and self.max_change > 0):
            problems.append(want("max_change", self.max_change, "a finite number > 0"))
        for key in ("margin", "dead_band"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                problems.append(want(key, value, "a finite number >= 0"))
        if not (0 < self.holdout_fraction < 1):
            problems.append(want("holdout_fraction", self.holdout_fraction, "a fraction in (0, 1)"))
        if self.min_steps < 2:
            problems.append(want("min_steps", self.min_steps, "an integer >= 2"))
        if self.max_steps < self.min_steps:
            problems.append(want("max_steps", self.max_steps, f"an integer >= min_steps ({self.min_steps})"))
        raise_all(problems)
        return self
