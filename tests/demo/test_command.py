"""The demo's policy, its output directory and the fault sizes it passes to replicas."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from sparkgate.demo.command import DEMO_POLICY, demo_policy, prepare_out
from sparkgate.policies.rollout import load_rollout_policy


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
