"""Turn a parsed body into what one store transaction writes.

``prepare`` splits the steps of a ``Parsed`` into valid ones (with their request
rows and exploded depth labels) and quarantined ones (with every problem and the
original bytes). A step is never split: all of its rows are stored or none are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from sparkgate.collectors.labels import explode
from sparkgate.collectors.schema import REQUEST_SCHEMA, Problem, unicode_safe
from sparkgate.collectors.validate import validate_steps
from sparkgate.collectors.wire import Flat, Parsed, flatten

QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("received_at", pa.float64()),
        pa.field("source", pa.string()),
        pa.field("position", pa.int64()),
        pa.field("replica_id", pa.string()),
        pa.field("step_id", pa.int64()),
        pa.field("reason", pa.string()),
        pa.field("problems", pa.string()),  # JSON list of {field, value, message}
        pa.field("payload", pa.binary()),
    ]
)


@dataclass(frozen=True)
class Quarantined:
    """A record that will not be stored: its input position, key if known, and why."""

    position: int
    replica_id: str | None
    step_id: int | None
    problems: list[Problem]
    payload: bytes

    def to_dict(self) -> dict:
        return {
            "position": self.position,
            # A lone surrogate is refused by field, and must not fail the reply that says so after the commit.
            "replica_id": None if self.replica_id is None else unicode_safe(self.replica_id),
            "step_id": self.step_id,
            "problems": [p.to_dict() for p in self.problems],
        }


@dataclass(frozen=True)
class Prepared:
    """The rows of one transaction. ``flat`` holds the valid steps only."""

    flat: Flat
    requests: pa.Table
    labels: pa.Table
    quarantined: list[Quarantined]

    def quarantine_table(self, source: str, received_at: float) -> pa.Table:
        return quarantine_table(self.quarantined, source, received_at)


def quarantine_table(q: list[Quarantined], source: str, received_at: float) -> pa.Table:
    """Quarantined records as rows of the ``quarantine`` table."""
    return pa.table(
        {
            "received_at": pa.array([received_at] * len(q), pa.float64()),
            "source": pa.array([source] * len(q), pa.string()),
            "position": pa.array([r.position for r in q], pa.int64()),
            "replica_id": pa.array(
                [None if r.replica_id is None else unicode_safe(r.replica_id) for r in q], pa.string()
            ),
            "step_id": pa.array([r.step_id for r in q], pa.int64()),
            "reason": pa.array(["; ".join(str(p) for p in r.problems) for r in q], pa.string()),
            "problems": pa.array([json.dumps([p.to_dict() for p in r.problems], default=repr) for r in q]),
            "payload": pa.array([r.payload for r in q], pa.binary()),
        },
        schema=QUARANTINE_SCHEMA,
    )


def subset(flat: Flat, keep: np.ndarray) -> Flat:
    """The steps where ``keep`` is true, with their request rows and renumbered parents."""
    row_keep = keep[flat.parent]
    renumber = np.cumsum(keep) - 1
    return Flat(
        flat.steps.filter(pa.array(keep)),
        flat.requests.filter(pa.array(row_keep)),
        renumber[flat.parent[row_keep]],
        flat.slot[row_keep],
    )


def stored_requests(flat: Flat) -> pa.Table:
    """Request rows in ``REQUEST_SCHEMA``: keyed by their step and slot."""
    steps = flat.steps
    key = {
        "replica_id": steps.column("replica_id").take(pa.array(flat.parent)),
        "step_id": pa.array(steps.column("step_id").to_numpy()[flat.parent]),
        "ts": pa.array(steps.column("ts").to_numpy()[flat.parent]),
        "slot": pa.array(flat.slot.astype(np.int32)),
    }
    columns = {**key, **{name: flat.requests.column(name) for name in flat.requests.column_names}}
    return pa.table(columns, schema=REQUEST_SCHEMA)


def prepare(parsed: Parsed, stored: np.ndarray | None = None, flat: Flat | None = None) -> Prepared:
    """Validate, split and explode. ``stored[i]`` marks wire rows whose key is already stored."""
    flat = flatten(parsed.wire) if flat is None else flat
    problems = validate_steps(flat, stored)
    keep = np.array([not p for p in problems], dtype=bool)
    replica, step_id = flat.steps.column("replica_id"), flat.steps.column("step_id")
    quarantined = [Quarantined(r.position, None, None, r.problems, r.payload) for r in parsed.rejected]
    for i in np.flatnonzero(~keep):
        position = int(parsed.positions[i])
        quarantined.append(
            Quarantined(
                position, replica[int(i)].as_py(), step_id[int(i)].as_py(), problems[i], parsed.payload(position)
            )
        )
    quarantined.sort(key=lambda r: r.position)
    valid = flat if keep.all() else subset(flat, keep)
    return Prepared(valid, stored_requests(valid), explode(valid), quarantined)
