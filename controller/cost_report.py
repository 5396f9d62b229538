"""How the cost tables did, interval by interval: what the demo summary and the dashboards show of adaptive.

Per evaluation interval of ``[since, until)`` and per switchback arm: the
steps, the median |predicted - measured| / measured step time (on the
``step_time`` the tables predict), the mean compact window and the tables
served; over the whole span, per arm, the coefficient of variation of the
per-interval mean window (the oscillation the adaptive gate guards against).
In adaptive the treatment arm serves the fitted tables and the control arm the
static ones at the same time, so the two columns compare like with like.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from sparkgate.collectors import cost_tables
from sparkgate.collectors.store import Store
from sparkgate.policies.cost_errors import CostTableError
from sparkgate.policies.vocabulary import Mode

from . import served_steps

# Fewer steps than this in an (interval, arm) fit their own table too well to bound anything.
MIN_FLOOR_STEPS = 30


def by_interval(
    store: Store, since: float, until: float, interval_s: float, step_time: str, floor: bool = False
) -> list[dict[str, Any]]:
    """One row per (interval, arm) with steps in it, in time order; each step's error is its table's
    prediction at the rows it ran (``served_steps.relative_errors``; None where no step of the row recorded
    one). ``floor`` adds ``floor_error``: the error of a table refitted, unconstrained, to the previous
    interval's steps (both arms), a learner with no minimum interval, dead band, margin or change bound:
    what the step-time noise leaves any table of the layout that learns from recent steps."""
    steps = served_steps.served_steps(store, since, until, step_time)
    errors = served_steps.relative_errors(steps)
    windows = store.query(
        """SELECT floor((s.ts - ?) / ?)::BIGINT AS interval, coalesce(s.arm, 'none') AS arm, avg(r."window") AS w
           FROM requests r JOIN steps s USING (replica_id, step_id)
           WHERE r.ts >= ? AND r.ts < ? AND r.mode = ? GROUP BY ALL""",
        [since, interval_s, since, until, Mode.COMPACT],
    ).to_pylist()
    mean_window = {(r["interval"], r["arm"]): r["w"] for r in windows}
    intervals = np.floor((np.asarray(steps["ts"]) - since) / interval_s).astype(int)
    arms, versions = np.array(steps["arm"], dtype=object), np.array(steps["version"], dtype=object)
    rows = []
    for interval, arm in sorted(set(zip(intervals.tolist(), arms.tolist()))):
        at = (intervals == interval) & (arms == arm)
        row = {
            "interval": interval,
            "arm": arm,
            "steps": int(at.sum()),
            "prediction_error": float(np.nanmedian(errors[at])) if (~np.isnan(errors[at])).any() else None,
            "mean_window": mean_window.get((interval, arm)),
            "tables": sorted(set(versions[at].tolist())),
        }
        if floor:
            row["floor_error"] = _floor(store, steps, intervals == interval - 1, at)
        rows.append(row)
    return rows


def _floor(store: Store, steps: dict[str, list], fitted_on: np.ndarray, scored: np.ndarray) -> float | None:
    """The median relative error on the ``scored`` steps of a table fitted to the ``fitted_on`` ones."""
    # Fitting needs torch. Only the demo's summary asks for the floor, so the dashboards, which read the
    # rest of this module, never load it.
    from sparkgate.policies.cost_fit import fit_additive, median_relative_error

    from .cost_updates import step_times

    if fitted_on.sum() < MIN_FLOOR_STEPS or not scored.any():
        return None
    parent = cost_tables.get(store, np.array(steps["version"], dtype=object)[fitted_on][0])
    if parent is None:
        return None
    try:
        fitted = fit_additive(parent.table(), step_times(steps, fitted_on))
    except CostTableError:
        return None
    return median_relative_error(fitted, step_times(steps, scored))


def window_cv(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per arm, the coefficient of variation of the per-interval mean window (None under 2 intervals)."""
    out: dict[str, float | None] = {}
    for arm in sorted({r["arm"] for r in rows}):
        means = [r["mean_window"] for r in rows if r["arm"] == arm and r["mean_window"] is not None]
        out[arm] = statistics.stdev(means) / statistics.fmean(means) if len(means) >= 2 else None
    return out


def report(
    store: Store, since: float, until: float, interval_s: float, step_time: str, floor: bool = False
) -> dict[str, Any]:
    rows = by_interval(store, since, until, interval_s, step_time, floor)
    return {"step_time": step_time, "interval_s": interval_s, "intervals": rows, "window_cv": window_cv(rows)}
