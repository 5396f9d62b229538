"""The gates a rollout policy holds: their defaults and which side of a threshold passes."""

from sparkgate.policies.gate import DEFAULT_GATES, Gate
from sparkgate.policies.rollout import RolloutPolicy


def test_default_gates_follow_the_design():
    gates = {g.name: g for g in RolloutPolicy().gates}
    debiased, replica, drift = (gates[n] for n in ("survival_ece_debiased", "survival_ece_debiased_replica",
                                                   "survival_ece_drift"))  # fmt: skip
    assert (debiased.threshold, replica.threshold, drift.threshold) == (0.08, 0.09, 0.03)
    assert debiased.failure_limit == replica.failure_limit == drift.failure_limit == 1
    assert tuple(drift.phases) == ("canary", "compact", "adaptive")  # in shadow it would compare shadow with itself
    assert "survival_ece" not in gates and "survival_ece_upper" not in gates  # noise-driven at 2,000 labels
    assert (gates["upper_bound_utilization"].threshold, gates["upper_bound_utilization"].direction) == (
        0.85,
        "at_least",
    )
    assert gates["tier_miss_rate"].threshold == 0.02
    assert (gates["p99_tpot_ratio"].threshold, gates["p99_ttft_ratio"].threshold) == (1.10, 1.20)
    assert (gates["tokens_per_s_ratio"].threshold, gates["goodput_ratio"].threshold) == (0.97, 0.95)
    assert gates["p99_tpot_ratio"].min_samples == 10  # epoch pairs
    comparisons = ("tokens_per_s_ratio", "p99_tpot_ratio", "p99_ttft_ratio", "goodput_ratio")
    assert all(gates[n].guard for n in (*comparisons, "upper_bound_utilization"))
    assert gates["consistency_mismatches"].critical and gates["consistency_mismatches"].threshold == 0
    assert [g.name for g in DEFAULT_GATES if g.critical] == ["consistency_mismatches", "state_rollback_failures"]


def test_gates_pass_on_the_right_side_and_filter_by_phase():
    at_most = Gate(metric="tier_miss_rate", threshold=0.02, direction="at_most")
    at_least = Gate(metric="upper_bound_utilization", threshold=0.85, direction="at_least", phases=("canary",))
    assert at_most.passes(0.02) and not at_most.passes(0.03)
    assert at_least.passes(0.9) and not at_least.passes(0.8)
    policy = RolloutPolicy(gates=(at_most, at_least))
    assert policy.gates_for("shadow") == (at_most,)
    assert policy.gates_for("canary") == (at_most, at_least)
    assert policy.gates_for("baseline") == ()
