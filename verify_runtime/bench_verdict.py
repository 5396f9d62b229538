"""A benchmark's verdict from paired rounds: the median with its sign-test interval, and a target judged by
the interval's far end, so that one lucky round on a noisy machine cannot meet it (pure functions)."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from sparkgate.policies.intervals import sign_interval

VERDICT_LEVEL = 0.90


def interval(values: list[float], level: float = VERDICT_LEVEL, digits: int = 3) -> dict[str, Any]:
    """The median of paired per-round values with its sign-test interval (None: too few rounds for one)."""
    low, high = sign_interval(np.asarray(values), level)
    return {
        "median": round(statistics.median(values), digits),
        "low": None if low is None else round(low, digits),
        "high": None if high is None else round(high, digits),
        "level": level,
        "rounds": len(values),
    }


def verdict(values: list[float], target: float | None, at_most: bool = False, digits: int = 3) -> dict[str, Any]:
    """``interval`` of ``values`` and whether it meets ``target``: its lower end at least the target, or with
    ``at_most`` its upper end at most the target (None: no target, or no interval)."""
    out = interval(values, digits=digits)
    out["target"] = target
    end = out["high"] if at_most else out["low"]
    out["met"] = None if target is None or end is None else (end <= target if at_most else end >= target)
    return out
