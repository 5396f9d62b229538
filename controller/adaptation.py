"""The adaptive phase's part of a controller tick (docs/design.md §6, adaptive): its gate inputs, and the
table updates it publishes.

The supervisor imports this module only once a stage reaches adaptive: cost
tables are fitted and predicted with torch, and the controller's commands start
without it.
"""

from __future__ import annotations

from collections.abc import Iterator

from sparkgate.collectors import cost_tables
from sparkgate.collectors.store import Store
from sparkgate.policies.adaptive import Adaptive
from sparkgate.policies.rollout import RolloutPolicy

from . import adaptive_gates, cost_updates, served_steps
from .measurement import Measurement
from .queries import Window
from .rollout_state import RolloutState


def measurements(
    store: Store, state: RolloutState, metrics: set[str], window: Window, policy: RolloutPolicy
) -> dict[str, Measurement]:
    """The inputs of the adaptive gates among ``metrics``, over ``window`` of ``state``'s stage."""
    level, since = policy.comparison.level, window.since or state.entered_at
    out: dict[str, Measurement] = {}
    if "cost_prediction_error" in metrics:
        out["cost_prediction_error"] = adaptive_gates.prediction_error(
            store, since, window.until, policy.adaptive.step_time, level
        )
    if "window_oscillation" in metrics:
        out["window_oscillation"] = _oscillation(store, state, window, level)
    return out


def _oscillation(store: Store, state: RolloutState, window: Window, level: float) -> Measurement:
    """Over every epoch since the fitted tables in force were published (an oscillation shows across many
    epochs, not in one window); no value while the static tables are served, whose windows are the
    control's own."""
    published = [cost_tables.get(store, version) for _, version in state.tables]
    since = [e.created_at for e in published if e is not None]
    if not since:
        return Measurement(None, 0, why="no fitted table served")
    return adaptive_gates.window_oscillation(store, min(since), window.until, level)


def updates(
    store: Store, spec: Adaptive, state: RolloutState, window: Window, now: float
) -> Iterator[cost_updates.Update]:
    """One update decision per replica group with steps in ``window``; a table to publish is stored before
    it is yielded (the caller persists the decision, then serves it)."""
    served, since = dict(state.tables), window.since or state.entered_at
    for group in served_steps.groups_with_steps(store, since, window.until):
        current = cost_tables.get(store, served.get(group, group))
        if current is None:  # a static table no replica registered: nothing to fit from
            continue
        kept_since = max(current.created_at, state.entered_at) if group in served else state.entered_at
        update = cost_updates.propose(store, spec, cost_updates.Context(current, kept_since, since, window.until, now))
        if update.entry is not None:
            cost_tables.add(store, update.entry)
            yield update
