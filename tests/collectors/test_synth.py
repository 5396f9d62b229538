"""Synthetic step records: valid under the collectors' own validation, keyed as asked, reproducible by seed."""

from __future__ import annotations

import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.batch import prepare
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(1, 8), st.integers(0, 1000), st.integers(0, 2**31 - 1))
def test_every_synthetic_record_passes_validation(steps, batch, gamma, first_step, seed):
    wire = synthetic_wire(steps, batch, gamma, "r", first_step=first_step, seed=seed, ts=100.0)
    prepared = prepare(from_wire(wire))
    assert not prepared.quarantined
    assert prepared.requests.num_rows == steps * batch and prepared.labels.num_rows == steps * batch * gamma
    assert wire.column("step_id").to_pylist() == list(range(first_step, first_step + steps))
    assert wire.column("ts").to_pylist() == [100.0 + 0.01 * i for i in range(steps)]
    ids = prepared.requests.column("request_id")
    assert pc.count_distinct(ids).as_py() == len(ids)


def test_the_seed_alone_fixes_the_records():
    assert synthetic_wire(4, 8, 5, seed=3).equals(synthetic_wire(4, 8, 5, seed=3))
    assert not synthetic_wire(4, 8, 5, seed=3).equals(synthetic_wire(4, 8, 5, seed=4))
    # Consecutive tables from consecutive first steps never reuse a request id.
    first, second = synthetic_wire(2, 4, 3, first_step=0), synthetic_wire(2, 4, 3, first_step=2)
    ids = [row["request_id"] for wire in (first, second) for step in wire.to_pylist() for row in step["requests"]]
    assert len(set(ids)) == len(ids) == 16


def test_continuing_requests_are_valid_and_give_recovery_rows_to_join(store):
    for first in (0, 10):  # two batches: recovery also joins across commits
        wire = synthetic_wire(10, batch=8, gamma=5, replica_id="r", first_step=first, seed=first, continuing=True)
        assert store.ingest(from_wire(wire), "test").quarantined == 0
    ids = store.query("SELECT count(DISTINCT request_id) AS n FROM requests").to_pylist()[0]["n"]
    recovered = store.query("SELECT count(*) AS n FROM depth_labels WHERE status = 'recovered'").to_pylist()[0]["n"]
    assert ids == 8 and recovered > 0
