"""A small store of two replicas' labels over three phases, and an equality of window statistics, shared by
the window_stats and window_sums tests."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.controller.window_sums import WindowStats

T0 = 1e9


def labelled_store() -> Store:
    """Twelve batches of 40 steps a replica, 8.3 s apart from ``T0``: baseline, shadow, canary, four each."""
    s = Store(":memory:")
    for i in range(12):
        for replica in ("a", "b"):
            wire = synthetic_wire(40, 6, 5, replica, first_step=i * 40, seed=i, ts=T0 + i * 8.3, continuing=True)
            wire = wire.set_column(wire.schema.get_field_index("phase"), "phase",
                                   pa.array([("baseline", "shadow", "canary")[i // 4]] * 40))  # fmt: skip
            s.ingest(from_wire(wire), "test")
    return s


def _leaves(x, path=""):
    if dataclasses.is_dataclass(x):
        for f in dataclasses.fields(x):
            yield from _leaves(getattr(x, f.name), f"{path}.{f.name}")
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _leaves(v, f"{path}[{k}]")
    else:
        yield path, x


def assert_same(got: WindowStats, want: WindowStats) -> None:
    """Every leaf of the two statistics (counts exactly, sums to rounding), by name, so a field a read
    forgets fails wherever it sits (a kind, a replica's, a histogram)."""
    a, b = dict(_leaves(got)), dict(_leaves(want))
    assert a.keys() == b.keys()
    for k, x in a.items():
        y = b[k]
        if x is None or y is None:
            assert x is y, k
        elif x.dtype.kind in "iub":
            np.testing.assert_array_equal(x, y, err_msg=k)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=k)
