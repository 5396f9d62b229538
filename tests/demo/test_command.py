"""The demo's policy and its output directory."""

from __future__ import annotations

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
