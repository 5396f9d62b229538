"""A small store of two replicas' labels over three phases, and an equality of window statistics, shared by
the window_stats and window_sums tests."""

from __future__ import annotations

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


def assert_same(a: WindowStats, b: WindowStats) -> None:
    assert (a.windowed is None) == (b.windowed is None)
    for kind in ("survival", "conditional", "windowed")[: 3 if a.windowed is not None else 2]:
        for name in a.survival.__dataclass_fields__:
            x, y = getattr(getattr(a, kind), name), getattr(getattr(b, kind), name)
            assert x.shape == y.shape and np.allclose(x, y), (kind, name)
    assert np.array_equal(a.statuses, b.statuses)
    assert np.allclose(a.estimated, b.estimated)
    for name in a.hists:
        assert np.array_equal(a.hists[name], b.hists[name]), name
