"""The demo's policy, its output directory and the fault sizes it passes to replicas."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from sparkgate.demo.command import DEMO_POLICY, demo_policy, prepare_out
from sparkgate.policies.rollout import load_rollout_policy
from tests.conftest import Clock


def test_the_demo_policy_loads_and_walks_the_whole_ladder():
    policy = load_rollout_policy(DEMO_POLICY)
    assert [(s.phase, s.compact_fraction) for s in policy.stages()] == [
        ("baseline", 0.0),
        ("shadow", 0.0),
        ("canary", 0.05),
        ("canary", 0.25),
        ("canary", 0.5),
        ("compact", 1.0),
        ("adaptive", 1.0),
    ]
    assert {"survival_ece", "consistency_mismatches", "state_rollback_failures"} <= {g.metric for g in policy.gates}
    assert policy.progress_deadline_s < 600  # a stalled demo falls back within minutes, not an hour
    quick = demo_policy(None, quick=True)
    assert quick.evaluation_interval_s < policy.evaluation_interval_s
    assert quick.consecutive_passes < policy.consecutive_passes and quick.gates == policy.gates


def test_prepare_out_refuses_a_directory_it_did_not_make(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(Exception, match="not made by sparkgate demo"):
        prepare_out(tmp_path)
    assert (tmp_path / "mine.txt").exists()
    out = tmp_path / "demo"
    prepare_out(out)
    (out / "old.duckdb").write_text("from the last run")
    prepare_out(out)
    assert not (out / "old.duckdb").exists()


def test_a_bad_policy_is_refused_before_the_last_runs_output_is_emptied(tmp_path):
    from click.testing import CliRunner

    from sparkgate.cli import main

    out = tmp_path / "demo"
    prepare_out(out)
    (out / "demo.duckdb").write_text("the last run's store")
    policy = tmp_path / "typo.yaml"
    policy.write_text("gama: 4\n")
    result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out), "--policy", str(policy)])
    assert result.exit_code == 1 and "typo.yaml: gama: unknown key" in result.output
    assert "Traceback" not in result.output and (out / "demo.duckdb").read_text() == "the last run's store"


def test_the_demo_passes_each_fault_size_as_the_replica_flag_of_its_name_with_the_replica_default():
    from click.testing import CliRunner

    from sparkgate.demo.command import FaultSize
    from sparkgate.verify_runtime import faults
    from sparkgate.verify_runtime.replica_cli import replica

    assert asdict(FaultSize()) == asdict(faults.FaultSize())
    flags = {p.name: p.default for p in replica.params}
    assert {name: flags[name] for name in asdict(FaultSize())} == asdict(FaultSize())
    refused = CliRunner().invoke(replica, ["--controller", "http://127.0.0.1:1", "--slow-verify-extra", "0"])
    assert refused.exit_code != 0 and "--slow-verify-extra" in refused.output


def test_the_demo_refuses_a_fault_size_that_changes_nothing_and_passes_none_a_replica_refuses(tmp_path):
    from click.testing import CliRunner

    from sparkgate.cli import main
    from sparkgate.demo.command import FaultSize, demo
    from sparkgate.verify_runtime.replica_cli import replica

    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out), "--drift-temperature", "0"])
    assert result.exit_code == 2 and "'--drift-temperature': 0.0 is not in the range x>0" in result.output
    assert isinstance(result.exception, SystemExit) and not out.exists()
    ranges = {p.name: p.type for p in demo.params}
    for name, flag in {p.name: p.type for p in replica.params if p.name in asdict(FaultSize())}.items():
        ours = ranges[name]  # the demo's range lies inside the replica's
        assert ours.min > flag.min or (ours.min == flag.min and ours.min_open >= flag.min_open), name
        assert flag.max is None or (ours.max is not None and ours.max <= flag.max), name


class _Sleeper(Clock):
    """The ``time`` module of a run whose sleeps pass at once."""

    def time(self) -> float:
        return self()

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize(("hold_s", "lasts_s"), [(0.0, 6.0), (60.0, 60.0)])
def test_a_run_that_reached_the_top_keeps_the_fleet_running_its_linger_or_its_hold(monkeypatch, hold_s, lasts_s):
    # A fleet and a controller that stand still at the top of the ladder with every pass in (test doubles: the
    # loop is what is tested; tests/demo/test_e2e.py runs the real fleet).
    from types import SimpleNamespace

    from sparkgate.demo import command

    policy = demo_policy(None, quick=False)
    clock = _Sleeper(1000.0)
    monkeypatch.setattr(command, "time", clock)
    top = len(policy.stages()) - 1
    status = {"policy": {"phase": "adaptive"}, "stage": top, "passes": policy.consecutive_passes, "entered_at": 0.0}
    watch = SimpleNamespace(t0=1000.0, policy=policy, poll=lambda: status)
    plan = command.Plan(policy.evaluation_interval_s, 30.0, hold_s=hold_s, deadline_s=540.0 + hold_s)
    fault_at, outcome, ok = command._scenario(SimpleNamespace(check=lambda: None), watch, plan, "none", None)
    assert (fault_at, outcome, ok) == (None, "adaptive held with no fault", True)
    # Settled at the first poll (0.5 s in); then the linger (2 intervals of 3 s) or the hold, whichever is longer.
    assert policy.evaluation_interval_s == 3.0
    assert clock.now - 1000.0 == pytest.approx(0.5 + lasts_s)
