"""The adaptive phase's update rule: fit a replica group's cost table to its recent steps, slowly.

``propose`` reads as a list of checks, each returning an ``Update`` that says
what was decided and why (docs/design.md §6, adaptive):

1. a group keeps a table at least ``min_interval_s`` (no update storms);
2. nothing is fitted from fewer than ``min_steps`` steps of the group, and only
   its newest ``max_steps`` are read (a change in load shows after that many);
3. the newest ``holdout_fraction`` of the steps is held out; while the current
   table's median relative error on them is within ``dead_band`` it stays
   (hysteresis: a table that is good enough does not chase noise);
4. the candidate is fitted on the older steps, starting from the current table,
   and moved back towards it until no prediction changes by more than a factor
   ``1 + max_change`` (slow: one noisy window cannot swing the scheduler);
5. it is published only if it beats the current table on the held-out steps by
   ``margin``.

A group is named by its static table's version; every fitted table inherits
the static one's probes, tiers and fingerprints (``policies.cost_fit``), so a
replica can check that what it fetched was made for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sparkgate.collectors import cost_tables
from sparkgate.collectors.cost_tables import Source, TableEntry
from sparkgate.collectors.store import Store
from sparkgate.policies.adaptive import Adaptive
from sparkgate.policies.cost_fit import StepTimes, bounded, change, fit_additive, median_relative_error
from sparkgate.policies.cost_model import AdditiveCostTable, CostTableError

from .served_steps import served_steps


@dataclass(frozen=True)
class Update:
    """What the rule decided for one group: ``entry`` is the table to publish (None: keep the current one);
    ``reasons`` say why, as data (``rule`` plus the figures the rule read)."""

    group: str
    reasons: dict[str, Any]
    entry: TableEntry | None = None

    @property
    def published(self) -> bool:
        return self.entry is not None


@dataclass(frozen=True)
class Context:
    """What ``propose`` reads besides the store: the group's table in force (its entry), since when, the
    window of steps, the time now."""

    current: TableEntry
    current_since: float
    since: float
    until: float | None
    now: float


def propose(store: Store, spec: Adaptive, ctx: Context) -> Update:
    """One update decision for ``ctx.current``'s group (the checks are the module docstring's)."""
    group = ctx.current.replica_group

    def hold(rule: str, **figures: Any) -> Update:
        return Update(group, {"rule": rule, "current": ctx.current.version, **figures})

    kept_s = ctx.now - ctx.current_since
    if kept_s < spec.min_interval_s:
        return hold("minimum interval", kept_s=round(kept_s, 3), min_interval_s=spec.min_interval_s)
    read = served_steps(store, ctx.since, ctx.until, spec.step_time, group=group, newest=spec.max_steps)
    steps, ts = step_times(read), read["ts"]
    if len(steps) < spec.min_steps:
        return hold("too few steps", steps=len(steps), min_steps=spec.min_steps)
    cut = len(steps) - max(1, math.ceil(spec.holdout_fraction * len(steps)))
    fitted_on, held_out = steps.take(slice(0, cut)), steps.take(slice(cut, len(steps)))
    current = ctx.current.table()
    error = median_relative_error(current, held_out)
    figures = {"fitted_steps": len(fitted_on), "heldout_steps": len(held_out), "error_current": round(error, 4)}
    if error <= spec.dead_band:
        return hold("within the dead band", dead_band=spec.dead_band, **figures)
    version = next_version(store, group)
    try:
        fitted = fit_additive(current, fitted_on, version)
    except CostTableError as exc:
        return hold("cannot fit", why=str(exc), **figures)
    assert isinstance(current, AdditiveCostTable)  # fit_additive refuses anything else
    candidate = bounded(current, fitted, spec.max_change)
    candidate_error = median_relative_error(candidate, held_out)
    figures |= {
        "error_candidate": round(candidate_error, 4),
        "change": round(change(current, candidate, (current.bs_probes, current.m_probes)), 4),
    }
    if candidate_error > error - spec.margin:
        return hold("candidate does not beat the current table by the margin", margin=spec.margin, **figures)
    entry = TableEntry(
        version,
        group,
        ctx.current.version,
        Source.ONLINE,
        ctx.now,
        candidate.to_json_dict(),
        fitted_since=float(ts[0]),  # the steps the candidate was fitted on, the newest of the window
        fitted_until=float(ts[cut - 1]),
        fitted_steps=len(fitted_on),
        heldout_steps=len(held_out),
        error_parent=error,
        error_candidate=candidate_error,
    )
    return Update(group, {"rule": "beats the current table", "current": ctx.current.version, **figures}, entry)


def step_times(steps: dict[str, list], at: np.ndarray | None = None) -> StepTimes:
    """``served_steps``' steps (those ``at`` selects) as ``StepTimes``."""
    take = slice(None) if at is None else at
    return StepTimes(
        torch.tensor(np.asarray(steps["batch_size"], dtype=np.int64)[take]),
        torch.tensor(np.asarray(steps["verify_rows"], dtype=np.int64)[take]),
        torch.tensor(np.asarray(steps["ms"], dtype=float)[take]),
    )


def next_version(store: Store, group: str) -> str:
    """``GROUP+aN``: the group's N-th fitted table."""
    fitted = sum(e.source == Source.ONLINE for e in cost_tables.entries(store, group))
    return f"{group}+a{fitted + 1}"
