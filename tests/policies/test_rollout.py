import re
from importlib import resources

import pytest
import yaml

from sparkgate.policies.gate import DEFAULT_GATES
from sparkgate.policies.rollout import (
    RolloutPolicy,
    RolloutPolicyError,
    Stage,
    load_rollout_policy,
    parse_rollout_policy,
)


def test_packaged_default_file_equals_the_code_defaults():
    shipped = resources.files("sparkgate.policies").joinpath("default_rollout.yaml")
    assert shipped.is_file()
    assert load_rollout_policy() == RolloutPolicy()
    assert load_rollout_policy(str(shipped)) == RolloutPolicy()


def test_empty_and_partial_files_take_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_rollout_policy(empty) == RolloutPolicy()
    partial = tmp_path / "partial.yaml"
    partial.write_text("canary_steps: [0.1, 0.3]\nfallback_window: 2\n")
    policy = load_rollout_policy(partial)
    assert policy.canary_steps == (0.1, 0.3) and policy.fallback_window_value == 2
    assert policy.gates == DEFAULT_GATES


def test_round_trip_through_plain_data():
    policy = parse_rollout_policy(
        {
            "phases": ["baseline", "shadow", "compact"],
            "gates": [
                {"metric": "tier_miss_rate", "threshold": 0.01, "direction": "at_most", "dry_run": True},
                {"metric": "queue_depth", "threshold": 5, "direction": "at_most", "promql": "max(q)", "name": "queue"},
            ],
        }
    )
    assert parse_rollout_policy(yaml.safe_load(yaml.safe_dump(policy.to_dict()))) == policy


def test_stages_walk_the_ladder():
    assert RolloutPolicy().stages() == (
        Stage("baseline", 0.0),
        Stage("shadow", 0.0),
        Stage("canary", 0.05),
        Stage("canary", 0.25),
        Stage("canary", 0.5),
        Stage("compact", 1.0),
        Stage("adaptive", 1.0),
    )
    short = RolloutPolicy(phases=("baseline", "shadow", "compact"))
    assert [s.phase for s in short.stages()] == ["baseline", "shadow", "compact"]


def test_fallback_defaults_to_static():
    assert RolloutPolicy().fallback_window_value == 7
    assert RolloutPolicy(gamma=5, fallback_window=0).fallback_window_value == 0


GATE = {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most"}


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"colour": "red"}, "colour: unknown key"),
        ({"gates": [{**GATE, "treshold": 1}]}, "gates[0].treshold: unknown key"),
        ({"gates": [{"metric": "tier_miss_rate", "direction": "at_most"}]}, "gates[0].threshold: missing"),
        ({"gates": [{**GATE, "threshold": "high"}]}, "gates[0].threshold: expected a number, got 'high'"),
        (
            {"gates": [{**GATE, "threshold": "1e-3"}]},  # how PyYAML reads `threshold: 1e-3`
            "gates[0].threshold: expected a number, got '1e-3' (YAML 1.1 reads 1e-3 as text: write it with a dot",
        ),
        ({"gates": [{**GATE, "threshold": float("nan")}]}, "gates[0].threshold: expected a finite number"),
        ({"gates": [GATE, {**GATE, "metric": "ece"}]}, "gates[1].metric: expected one of"),
        ({"gates": [{**GATE, "direction": "below"}]}, "gates[0].direction: expected one of at_most, at_least"),
        ({"gates": [{**GATE, "min_samples": -1}]}, "gates[0].min_samples: expected an integer >= 0"),
        ({"gates": [{**GATE, "critical": "yes"}]}, "gates[0].critical: expected true or false, got 'yes'"),
        ({"gates": [{**GATE, "phases": ["baseline"]}]}, "gates[0].phases[0]: expected one of shadow"),
        ({"gates": [{**GATE, "promql": " "}]}, "gates[0].promql: expected a non-empty query"),
        ({"gates": [GATE, GATE]}, "gates[1].name: expected a name no other gate uses"),
        # these three validated and meant something else: a name replaced by the metric, a gate never judged,
        # a "critical" gate that never rolls back (the controller ignores critical on a dry run)
        ({"gates": [{**GATE, "name": 0}]}, "gates[0].name: expected a string, got 0"),
        ({"gates": [{**GATE, "phases": []}]}, "gates[0].phases: expected at least one serving phase"),
        ({"gates": [{**GATE, "critical": True, "dry_run": True}]}, "gates[0].critical: expected false on a dry_run"),
        ({"adaptive": {"max_chnage": 0.1}}, "adaptive.max_chnage: unknown key (known: min_interval_s"),
        ({"gates": [{**GATE, 1: 2}]}, "gates[0]: expected keys that are strings, got 1"),
        ({True: 1}, "rollout policy: expected keys that are strings, got True"),  # YAML 1.1 reads `yes:` as true
        ({"gates": {"a": 1}}, "gates: expected a list"),
        ({"gates": ["tier_miss_rate"]}, "gates[0]: expected a mapping"),
        ({"phases": ["shadow", "canary"]}, "phases: expected a list starting with baseline"),
        ({"phases": ["baseline", "compact", "canary"]}, "phases[2]: expected a phase after compact"),
        ({"phases": ["baseline", "rollout"]}, "phases[1]: expected one of baseline"),
        ({"canary_steps": [0.25, 0.05]}, "canary_steps[1]: expected a fraction in (0.25, 1)"),
        ({"canary_steps": [0.5, 1.0]}, "canary_steps[1]"),
        ({"canary_steps": []}, "canary_steps: expected at least one step"),
        ({"observe_fraction": 0}, "observe_fraction: expected a fraction in (0, 1), got 0.0"),
        ({"observe_fraction": True}, "observe_fraction: expected a number, got True"),
        ({"consecutive_passes": 0}, "consecutive_passes: expected an integer >= 1"),
        ({"consecutive_passes": 2.5}, "consecutive_passes: expected an integer, got 2.5"),
        ({"failure_limit": -1}, "failure_limit: expected an integer >= 0"),
        ({"evaluation_interval_s": 0}, "evaluation_interval_s: expected a finite number of seconds > 0"),
        ({"progress_deadline_s": 10}, "progress_deadline_s: expected at least evaluation_interval_s"),
        ({"fallback_window": 8}, "fallback_window: expected an integer in [0, gamma=7] or null, got 8"),
        ({"gamma": 0}, "gamma: expected an integer >= 1"),
        (["baseline"], "rollout policy: expected a mapping"),
    ],
)
def test_bad_policies_fail_naming_the_key_and_value(raw, message):
    with pytest.raises(RolloutPolicyError, match="^" + re.escape(message)):
        parse_rollout_policy(raw)


def test_bad_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("observe_fraction: 2\n")
    with pytest.raises(RolloutPolicyError, match=r"bad\.yaml: observe_fraction: expected a fraction"):
        load_rollout_policy(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("gates: [\n")
    with pytest.raises(RolloutPolicyError, match=r"broken\.yaml: not valid YAML"):
        load_rollout_policy(broken)


def test_a_policy_naming_a_key_twice_is_refused_naming_the_file_and_line(tmp_path):
    twice = tmp_path / "twice.yaml"
    twice.write_text("gates: []\nobserve_fraction: 0.5\ngates: [{name: x}]\n")
    refused = r"twice\.yaml: not valid YAML \(line 3, column 1: key 'gates' appears twice \(first on line 1\)\)$"
    with pytest.raises(RolloutPolicyError, match=refused):
        load_rollout_policy(twice)


def test_a_policy_file_that_is_not_text_is_named_as_such(tmp_path):
    binary = tmp_path / "policy.yaml"
    binary.write_bytes(b"gates: \xff\n")
    with pytest.raises(RolloutPolicyError, match=r"policy\.yaml: not UTF-8 text \(byte 7: invalid start byte\)$"):
        load_rollout_policy(binary)
