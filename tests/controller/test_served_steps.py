"""Reading the steps each table served: errors are arithmetic on the predictions the steps recorded."""

from __future__ import annotations

import numpy as np

from sparkgate.controller.served_steps import relative_errors


def test_a_step_without_a_recorded_prediction_has_no_error():
    errors = relative_errors({"predicted": [None, 3.0, 1.0], "ms": [2.0, 2.0, 2.0]})
    assert np.isnan(errors[0]) and errors[1:].tolist() == [0.5, 0.5]


def test_served_steps_are_the_steps_of_the_tables_asked_for_oldest_first(tmp_path):
    from sparkgate.collectors import cost_tables
    from sparkgate.collectors.cost_tables import TableEntry
    from sparkgate.collectors.store import Store
    from sparkgate.controller.served_steps import groups_with_steps, served_steps
    from tests.conftest import T0
    from tests.controller.timed_steps import BATCHES, STATIC, ingest_timed, scaled

    fitted = scaled(STATIC, 1.25, "static-a+a1")
    with Store(tmp_path / "served.duckdb") as store:
        cost_tables.add(store, cost_tables.static_entry(STATIC, now=T0))
        cost_tables.add(store, TableEntry("static-a+a1", "static-a", "static-a", "online", T0, fitted.to_json_dict()))
        ingest_timed(store, STATIC, STATIC, T0, steps_per_batch=4, arm="control", noise=0.0)
        ingest_timed(store, fitted, STATIC, T0 + 10, steps_per_batch=4, first_step=1000, noise=0.0)
        every = served_steps(store, T0, None, "wall")
        online = served_steps(store, T0, None, "cpu", source="online")
        newest = served_steps(store, T0, None, "wall", newest=3)
        none_of_theirs = served_steps(store, T0, None, "wall", group="another-group")
        groups = groups_with_steps(store, T0, None)
    per_arm = 4 * len(BATCHES)
    assert len(every["ts"]) == 2 * per_arm and every["ts"] == sorted(every["ts"])
    assert {(a, v) for a, v in zip(every["arm"], every["version"])} == {("control", "static-a"),
                                                                        ("treatment", "static-a+a1")}  # fmt: skip
    # Without noise a static step runs as its table predicts and a fitted one 1.25x faster than it ran.
    errors = relative_errors(every)
    assert np.allclose(errors[:per_arm], 0.0) and np.allclose(errors[per_arm:], 0.25)
    assert set(online["version"]) == {"static-a+a1"} and len(online["ts"]) == per_arm
    assert newest["ts"] == every["ts"][-3:]  # the newest three, still oldest first
    assert none_of_theirs["ts"] == [] and groups == ["static-a"]
