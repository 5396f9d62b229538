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

from sparkgate.collectors.store import Store
from sparkgate.policies.vocabulary import Mode

from .cost_updates import STEP_COLUMN


def by_interval(store: Store, since: float, until: float, interval_s: float, step_time: str) -> list[dict[str, Any]]:
    """One row per (interval, arm) with steps in it, in time order."""
    column = STEP_COLUMN[step_time]
    return store.query(
        f"""
        WITH w AS (SELECT replica_id, step_id, avg("window") AS mean_window FROM requests
                   WHERE ts >= ? AND ts < ? AND mode = ? GROUP BY ALL)
        SELECT floor((s.ts - ?) / ?)::BIGINT AS interval, coalesce(s.arm, 'none') AS arm, count(*) AS steps,
               median(abs(s.predicted_step_ms - s.{column}) / s.{column}) AS prediction_error,
               avg(w.mean_window) AS mean_window, list(DISTINCT s.cost_table_version ORDER BY s.cost_table_version)
               AS tables
        FROM steps s LEFT JOIN w USING (replica_id, step_id)
        WHERE s.ts >= ? AND s.ts < ? AND s.predicted_step_ms IS NOT NULL AND s.{column} > 0
        GROUP BY ALL ORDER BY interval, arm""",
        [since, until, Mode.COMPACT, since, interval_s, since, until],
    ).to_pylist()


def window_cv(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per arm, the coefficient of variation of the per-interval mean window (None under 2 intervals)."""
    out: dict[str, float | None] = {}
    for arm in sorted({r["arm"] for r in rows}):
        means = [r["mean_window"] for r in rows if r["arm"] == arm and r["mean_window"] is not None]
        out[arm] = statistics.stdev(means) / statistics.fmean(means) if len(means) >= 2 else None
    return out


def report(store: Store, since: float, until: float, interval_s: float, step_time: str) -> dict[str, Any]:
    rows = by_interval(store, since, until, interval_s, step_time)
    return {"step_time": step_time, "interval_s": interval_s, "intervals": rows, "window_cv": window_cv(rows)}
