"""The simulated fleet's records for one interval: what each scenario changes, on a fleet without noise
so that every step's time is its model's exactly. The controller is stood in for by its policy and state
(all ``emit_interval`` reads of it); the records go through the real store."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from sparkgate.collectors.store import Store
from sparkgate.controller.simulate_fleet import CHECKS_PER_INTERVAL, SCENARIOS, T0, Fleet, _pair_load, emit_interval
from sparkgate.policies.rollout import DEFAULT_PATH, load_rollout_policy
from sparkgate.policies.vocabulary import Phase

QUIET = Fleet(step_sd=0.0, load_sd=0.0, noise_sd=0.0, cpu_step_sd=0.0, cpu_noise_sd=0.0)
POLICY = load_rollout_policy(DEFAULT_PATH)


def _interval(scenario, onset: bool = True, phase: Phase = Phase.CANARY, fleet: Fleet = QUIET) -> Store:
    state = SimpleNamespace(phase=phase, compact_fraction=0.5, entered_at=T0, revision=3)
    store = Store(":memory:", threads=1)
    emit_interval(store, SimpleNamespace(policy=POLICY, state=state), fleet, scenario, np.random.default_rng(0),
                  T0, [0], onset)  # fmt: skip
    return store


def _steps(store: Store) -> list[dict]:
    return store.query(
        "SELECT replica_id, arm, epoch, step_ms, step_cpu_ms, verify_rows, graph_hit, phase FROM steps"
    ).to_pylist()


def test_every_replica_reports_the_intervals_steps_with_rows_as_verified():
    with _interval(SCENARIOS["none"]) as store:
        steps = _steps(store)
        rows = store.query(
            "SELECT replica_id, step_id, sum(CASE WHEN mode = 'compact' THEN \"window\" + 1 ELSE 8 END) AS rows "
            "FROM requests GROUP BY ALL"
        ).to_pylist()
        verified = store.query("SELECT replica_id, step_id, verify_rows FROM steps").to_pylist()
    per_replica = round(POLICY.evaluation_interval_s * QUIET.steps_per_s)
    assert sorted({s["replica_id"] for s in steps}) == [f"sim-{r}" for r in range(QUIET.replicas)]
    assert len(steps) == QUIET.replicas * per_replica and {s["phase"] for s in steps} == {"canary"}
    assert {s["arm"] for s in steps} == {"treatment", "control"}  # canary switches back
    # γ 7: a compact row verifies its window and one more, a full block all eight.
    assert {(r["replica_id"], r["step_id"], r["rows"]) for r in rows} == {tuple(v.values()) for v in verified}


def test_a_latency_regression_slows_the_treatments_steps_alone_by_its_size():
    for name, onset, slower in (("latency", True, 1.10), ("latency", False, 1.0), ("none", True, 1.0)):
        with _interval(SCENARIOS[name], onset) as store:
            steps = _steps(store)
        for s in steps:
            wall = s["step_ms"] / (QUIET.step_ms_fixed + QUIET.step_ms_per_row * s["verify_rows"])
            cpu = s["step_cpu_ms"] / (QUIET.cpu_ms_fixed + QUIET.cpu_ms_per_row * s["verify_rows"])
            expected = slower if s["arm"] == "treatment" else 1.0
            assert (wall, cpu) == (pytest.approx(expected), pytest.approx(expected)), (name, onset, s)


def test_tier_misses_hit_the_treatment_alone():
    with _interval(replace(SCENARIOS["tier-misses"], tier_misses=1.0)) as store:
        steps = _steps(store)
        reasons = store.query("SELECT DISTINCT miss_reason FROM steps WHERE NOT graph_hit").column(0).to_pylist()
    assert {(s["arm"], s["graph_hit"]) for s in steps} == {("treatment", False), ("control", True)}
    assert reasons == ["over_max_tier"]


def test_a_silent_replica_reports_nothing_and_a_mismatch_is_one_replicas_check():
    with _interval(SCENARIOS["stops-reporting"]) as store:
        assert "sim-0" not in {s["replica_id"] for s in _steps(store)}
        assert store.query("SELECT count(*) FROM requests WHERE replica_id = 'sim-0'").column(0)[0].as_py() == 0
    with _interval(SCENARIOS["consistency"]) as store:
        checks = store.query("SELECT replica_id, count(*) AS n, count(mismatch_at) AS bad FROM consistency_checks "
                             "GROUP BY ALL ORDER BY ALL").to_pylist()  # fmt: skip
    assert checks == [{"replica_id": f"sim-{r}", "n": CHECKS_PER_INTERVAL, "bad": int(r == 0)} for r in range(3)]


def test_outside_switchback_every_step_is_served_static_without_an_arm():
    with _interval(SCENARIOS["latency"], phase=Phase.BASELINE) as store:
        steps = _steps(store)
        modes = store.query("SELECT DISTINCT mode::VARCHAR FROM requests").column(0).to_pylist()
        checks = store.query("SELECT count(*) FROM consistency_checks").column(0)[0].as_py()
    assert {(s["arm"], s["epoch"]) for s in steps} == {(None, None)} and modes == ["static"] and checks == 0


def test_an_epoch_pair_shares_its_load_and_pairs_differ():
    loads = [_pair_load(7, "sim-1", epoch, 0.3) for epoch in range(8)]
    assert loads[0::2] == loads[1::2]  # epochs 2k and 2k + 1 draw the same factor, in any process
    assert len(set(loads[0::2])) == 4 and _pair_load(8, "sim-1", 0, 0.3) != loads[0]
