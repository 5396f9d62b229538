"""Store queries for one window and slice: slice values and filters, time bounds, window checks."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_dicts
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.queries import (
    Slice,
    Window,
    label_columns,
    load_bucket_label,
    miss_reasons,
    request_histograms,
    slice_values,
    step_buckets,
)
from tests.conftest import T0, ingest_synthetic


def _retask(wire: pa.Table, task: str, temperature: float) -> list[dict]:
    objs = wire.to_pylist()
    for obj in objs:
        for row in obj["requests"]:
            row.update(task=task, temperature=temperature)
    return objs


def test_slices_by_task_temperature_load_and_replica(store):
    store.ingest(from_dicts(_retask(synthetic_wire(1, 32, 7, "a", ts=T0), "code", 0.7)), "t")
    ingest_synthetic(store, 5, T0, replica="b", first_step=10, batch=8)
    by_task = {v: evaluate(store, slice_=Slice(task=v)) for v in slice_values(store, "task", Window())}
    assert set(by_task) == {"code", "synthetic"}
    assert by_task["code"].aggregate.accept_hist.sum() == 32
    assert by_task["code"].steps is None  # steps mix tasks: no step figures under a task slice
    assert evaluate(store, slice_=Slice(temperature=0.7)).aggregate.accept_hist.sum() == 32
    assert slice_values(store, "load", Window()) == [3, 5]  # batches of 8 and 32
    small = evaluate(store, slice_=Slice(load_bucket=3))
    assert small.aggregate.accept_hist.sum() == 40 and small.report()["latency"].keys() == {"8-15"}
    assert evaluate(store, slice_=Slice(replica_id="a")).report()["tiers"]["steps"] == 1


def test_window_bounds_select_rows_by_time(store):
    ingest_synthetic(store, 10, T0)
    ingest_synthetic(store, 10, T0 + 100, first_step=10)
    assert evaluate(store, Window(since=T0 + 50)).report()["tiers"]["steps"] == 10
    assert evaluate(store, Window(until=T0 + 50)).report()["tiers"]["steps"] == 10
    with pytest.raises(ValueError, match="window.since"):
        Window(since=T0 + 1, until=T0)
    with pytest.raises(ValueError, match="window.until"):
        Window(until=float("nan"))


def test_load_buckets_and_slice_descriptions():
    assert [load_bucket_label(b) for b in (0, 3, 5)] == ["1-1", "8-15", "32-63"]
    assert Slice(task="code").per_request and Slice(temperature=0.0).per_request
    assert not Slice(load_bucket=3, replica_id="a").per_request
    assert Slice(temperature=0.0, replica_id="a").to_dict() == {"temperature": 0.0, "replica_id": "a"}
    with pytest.raises(ValueError, match="by='colour'"):
        slice_values(None, "colour", Window())


def test_row_queries_select_the_window_and_slice_they_are_given(store):
    ingest_synthetic(store, 10, T0, replica="a", batch=8)
    ingest_synthetic(store, 6, T0 + 100, replica="b", batch=16, graph_hit=False, miss_reason="over_max_tier")
    everything, window, only_b = Window(), Window(since=T0 + 50), Slice(replica_id="b")
    assert len(label_columns(store, everything, Slice())) == (10 * 8 + 6 * 16) * 7
    assert len(label_columns(store, window, Slice())) == len(label_columns(store, everything, only_b)) == 6 * 16 * 7
    assert len(label_columns(store, everything, Slice(load_bucket=3))) == 10 * 8 * 7  # batches of 8
    assert label_columns(store, window, Slice()).depths == 7
    hist = request_histograms(store, everything, Slice(replica_id="a"), 8)
    assert hist["accept_hist"].sum() == 10 * 8 and hist["accept_hist"].shape == (4, 8, 8)
    assert miss_reasons(store, everything, Slice()) == {"over_max_tier": 6}
    assert miss_reasons(store, Window(until=T0 + 50), Slice()) == {}
    buckets = step_buckets(store, everything, Slice()).to_pylist()
    assert [(b["bucket"], b["steps"], b["misses"]) for b in buckets] == [(3, 10, 0), (4, 6, 6)]


def test_a_step_that_carried_no_request_sits_in_the_first_load_bucket(store):
    # log2(0) is -inf, which no INTEGER holds: one such step used to make every read of its window fail.
    ingest_synthetic(store, 4, T0, batch=8)
    store.ingest(from_dicts([dict(synthetic_wire(1, 1, 7, "r0", first_step=99, ts=T0 + 1).to_pylist()[0],
                                  batch_size=0, requests=[])]), "t")  # fmt: skip
    assert slice_values(store, "load", Window()) == [0, 3]
    assert step_buckets(store, Window(), Slice()).column("steps").to_pylist() == [1, 4]
    assert evaluate(store).report()["tiers"]["steps"] == 5
