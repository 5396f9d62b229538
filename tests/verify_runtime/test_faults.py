"""The faults ``sparkgate replica --fault`` fires (the cost-table fault runs end to end in test_replica_cli)."""

from __future__ import annotations

import pytest

from sparkgate.policies.cost_model import FingerprintMismatch, load_cost_table
from sparkgate.policies.cost_profile import hardware_fingerprint
from sparkgate.verify_runtime.arrivals import Arrivals
from sparkgate.verify_runtime.faults import FOREIGN_COST_TABLE, Fault, FaultSize, fire
from tests.conftest import Clock


def test_drift_makes_new_arrivals_sample_at_the_drift_temperature():
    arrivals = Arrivals(iter(()), lambda t: 1.0, Clock(0.0))
    assert "temperature 3.0" in fire(Fault.DRIFT, None, arrivals, FaultSize(drift_temperature=3.0), None)
    assert arrivals.temperature == 3.0


def test_drift_without_an_arrival_process_is_refused():
    with pytest.raises(ValueError, match="needs an arrival process"):
        fire(Fault.DRIFT, None, None, FaultSize(), None)


def test_the_foreign_table_is_refused_here_unless_forced(tmp_path):
    import json

    path = tmp_path / "foreign.json"
    path.write_text(json.dumps(FOREIGN_COST_TABLE))
    with pytest.raises(FingerprintMismatch):
        load_cost_table(path, hardware=hardware_fingerprint("cpu"), model="this-model")
    assert load_cost_table(path, force=True).meta.tiers == (8, 16, 24, 32)


def test_slow_verify_slows_treatment_epochs_only(monkeypatch):
    from types import SimpleNamespace

    from sparkgate.verify_runtime import faults

    clock = SimpleNamespace(now=0.0)

    def perf_counter():  # a clock the busy wait advances by 1 ms per read: the wait is counted, not timed
        clock.now += 0.001
        return clock.now

    def verify():
        clock.now += 0.010  # every verify call takes 10 ms
        return "verified"

    monkeypatch.setattr(faults.time, "perf_counter", perf_counter)
    engine = SimpleNamespace(runner=SimpleNamespace(verify=verify), config=SimpleNamespace(arm="control"))
    fired = fire(Fault.SLOW_VERIFY, SimpleNamespace(engine=engine), None, FaultSize(slow_verify_extra=0.5), None)
    assert fired == "slow-verify: treatment verification 50% slower"
    spent = {}
    for arm in ("control", "treatment"):
        engine.config.arm, start = arm, clock.now
        assert engine.runner.verify() == "verified"
        spent[arm] = clock.now - start
    assert spent["control"] < 0.015 and 0.015 <= spent["treatment"] < 0.025  # 10 ms, then 10 ms + half of it
