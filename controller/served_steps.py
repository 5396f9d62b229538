"""The steps each cost table served, read for adaptive's update rule, its gate, the report and the dashboards.

A step records the version of the table it was served on and that table's
prediction at the rows it verified (``table_step_ms``), so how well a table
predicted is plain arithmetic on stored rows: nothing here evaluates a table,
and this module (like the dashboards that read it) needs no torch.
"""

from __future__ import annotations

import numpy as np

from sparkgate.collectors.store import Store

from .queries import time_bounds

# The steps' own measure of what a table predicts (Adaptive.step_time).
STEP_COLUMN = {"wall": "step_ms", "cpu": "step_cpu_ms"}


def served_steps(
    store: Store,
    since: float,
    until: float | None,
    step_time: str,
    source: str | None = None,
    *,
    group: str | None = None,
    newest: int | None = None,
) -> dict[str, list]:
    """Steps in [since, until) with the table each was served on, oldest first: ``ts``, ``arm``, ``version``,
    ``batch_size``, ``verify_rows``, ``ms`` (``step_time``) and ``predicted`` (the table's prediction the step
    recorded, ``table_step_ms``; None from a producer that does not record it). Only tables of ``source`` and
    of replica group ``group`` (a step belongs to the group of the table it was served on), and only the
    ``newest`` many steps, when given."""
    column = STEP_COLUMN[step_time]
    clauses, params = time_bounds("s", since, until)
    clauses.append(f"s.{column} > 0")
    for condition, value in (("t.source = ?", source), ("t.replica_group = ?", group)):
        if value is not None:
            clauses.append(condition)
            params.append(value)
    limit = "" if newest is None else f" LIMIT {int(newest)}"
    return store.query(
        f"SELECT * FROM (SELECT s.ts, coalesce(s.arm, 'none') AS arm, s.cost_table_version AS version, "
        f"s.batch_size, s.verify_rows, s.{column} AS ms, s.table_step_ms AS predicted FROM steps s "
        f"JOIN cost_tables t ON s.cost_table_version = t.version WHERE {' AND '.join(clauses)} "
        f"ORDER BY s.ts DESC{limit}) ORDER BY ts",
        params,
    ).to_pydict()


def relative_errors(steps: dict[str, list]) -> np.ndarray:
    """|predicted - measured| / measured of each of ``served_steps``' steps, from the prediction it recorded
    (NaN where it recorded none).

    Not the step's ``predicted_step_ms``: that is the scheduler's price of its plan, which counts every
    request at its window, while cap-accept and shadow rows verify the whole block, so a step runs more rows
    than were priced; the table's own error is its prediction at the rows the step ran.
    """
    predicted = np.array(steps["predicted"], dtype=float)  # None reads as NaN
    measured = np.asarray(steps["ms"], dtype=float)
    return np.abs(predicted - measured) / measured


def groups_with_steps(store: Store, since: float, until: float | None) -> list[str]:
    """Replica groups with steps in [since, until), in name order."""
    clauses, params = time_bounds("s", since, until)
    rows = store.query(
        "SELECT DISTINCT t.replica_group AS g FROM steps s JOIN cost_tables t ON s.cost_table_version = t.version "
        f"WHERE {' AND '.join(clauses)} ORDER BY g",
        params,
    )
    return rows.column("g").to_pylist()
