from __future__ import annotations

import pyarrow as pa
import pytest

from collectors.store import Store
from collectors.synth import synthetic_wire
from collectors.wire import from_wire

T0 = 1.75e9


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "controller.duckdb") as s:
        yield s


def with_columns(wire: pa.Table, **values) -> pa.Table:
    """``wire`` with step columns replaced by one value each (e.g. phase, batch_size)."""
    for name, value in values.items():
        wire = wire.set_column(wire.schema.get_field_index(name), name,
                               pa.array([value] * wire.num_rows, wire.schema.field(name).type))
    return wire


def ingest_synthetic(store: Store, steps: int, ts: float, phase: str = "shadow", replica: str = "r0",
                     first_step: int = 0, batch: int = 32, **columns) -> pa.Table:
    """``steps`` valid synthetic steps (10 ms apart from ``ts``) stored as recorded in ``phase``."""
    wire = synthetic_wire(steps, batch, 7, replica, first_step=first_step, seed=first_step, ts=ts)
    wire = with_columns(wire, phase=phase, **columns)
    result = store.ingest(from_wire(wire), "test")
    assert result.quarantined == 0
    return wire
