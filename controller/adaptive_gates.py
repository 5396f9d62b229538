"""The adaptive phase's own gate inputs (docs/design.md §6, adaptive).

- ``cost_prediction_error``: how wrong the fitted tables in force are, as the
  median relative error of treatment steps served on a fitted table, with the
  distribution-free interval of a median. Steps on a static table are left out:
  the gate judges what adaptation changed, and a static table that was wrong
  before adaptive is no reason to undo adaptation.
- ``window_oscillation``: whether adaptation makes windows swing. Per
  switchback epoch the mean window of compact rows; per arm the coefficient of
  variation of those means across epochs; treatment minus control (the control
  arm serves the static tables at the same time), with each arm's chi-square
  interval combined by MOVER (``policies.variation``).
"""

from __future__ import annotations

import numpy as np

from sparkgate.collectors.cost_tables import Source
from sparkgate.collectors.store import Store
from sparkgate.policies.intervals import median_interval
from sparkgate.policies.variation import cv_difference
from sparkgate.policies.vocabulary import Arm, Mode

from . import served_steps
from .measurement import Measurement
from .queries import time_bounds


def prediction_error(store: Store, since: float, until: float | None, step_time: str, level: float) -> Measurement:
    """Median |predicted - measured| / measured of treatment steps served on fitted tables, each predicted
    by its table at the rows it ran (``served_steps.relative_errors``)."""
    steps = served_steps.served_steps(store, since, until, step_time, Source.ONLINE)
    treated = np.isin(np.array(steps["arm"], dtype=object), [Arm.TREATMENT, "none"])
    errors = served_steps.relative_errors(steps)[treated]
    errors = errors[~np.isnan(errors)]
    if not len(errors):
        return Measurement(None, 0, why="no treatment step on a fitted table recorded its prediction")
    low, high = median_interval(errors, level)
    method = f"order-statistic interval of the median, {len(errors)} steps, {level:.2%}"
    return Measurement(float(np.median(errors)), len(errors), low, high, method)


def window_oscillation(store: Store, since: float, until: float | None, level: float) -> Measurement:
    """CV of the per-epoch mean compact window, treatment minus control, over [since, until)."""
    bounds, params = time_bounds("s", since, until)
    rows = store.query(
        'SELECT s.arm, avg(r."window") AS w FROM requests r JOIN steps s USING (replica_id, step_id) '
        f"WHERE {' AND '.join(bounds)} AND s.epoch IS NOT NULL AND r.mode = ? GROUP BY s.replica_id, s.epoch, s.arm",
        [*params, Mode.COMPACT],
    ).to_pydict()
    arms = np.array(rows["arm"], dtype=object)
    means = np.array(rows["w"], dtype=float)
    treated, control = means[arms == Arm.TREATMENT], means[arms == Arm.CONTROL]
    n = int(min(len(treated), len(control)))
    if n < 3:
        return Measurement(None, n, why="fewer than 3 epochs of each arm with compact rows")
    estimate, low, high = cv_difference(treated, control, level)
    method = f"chi-square intervals of each arm's CV by MOVER, {len(treated)} treatment and {len(control)} control "
    return Measurement(estimate, n, low, high, method + f"epochs, {level:.2%}")
