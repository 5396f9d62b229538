"""Gate verdicts: pass on the right side (equality passes), inconclusive without enough fresh data,
critical failures standing on stale data, and one outcome per interval."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.controller.gates import interval_outcome, judge, judge_all, judge_baseline, verdict_table
from sparkgate.controller.measurement import Measurement
from sparkgate.policies.gate import Gate
from sparkgate.policies.rollout import parse_rollout_policy

values = st.floats(-1e6, 1e6, allow_nan=False)


@given(values, values, st.sampled_from(["at_most", "at_least"]), st.booleans(), st.booleans())
def test_fresh_data_passes_exactly_on_the_right_side_of_the_threshold(value, threshold, direction, critical, stale):
    gate = Gate(metric="survival_ece", threshold=threshold, direction=direction, critical=critical)
    right_side = value <= threshold if direction == "at_most" else value >= threshold
    verdict = judge(gate, Measurement(value, 10), "old steps" if stale else None)
    if not stale:
        assert verdict.outcome == ("pass" if right_side else "fail")
    else:  # stale data never passes; only a critical failure still counts
        assert verdict.outcome == ("fail" if critical and not right_side else "inconclusive")
    assert (verdict.value, verdict.threshold, verdict.samples) == (value, threshold, 10)


@given(st.floats(0.0, 3.0), st.floats(0.0, 3.0), st.booleans(), st.booleans())
def test_a_gate_judged_by_an_interval_on_stale_data_fails_only_when_critical_and_wholly_beyond(a, b, critical, stale):
    gate = Gate(metric="p99_step_ratio", threshold=1.1, direction="at_most", critical=critical)
    low, high = sorted((a, b))
    verdict = judge(gate, Measurement((low + high) / 2, 12, low, high, "sign test"), "old steps" if stale else None)
    fresh = "pass" if high <= 1.1 else "fail" if low > 1.1 else "inconclusive"
    if not stale:
        assert verdict.outcome == fresh
    else:  # as a value: stale data never passes, and only a critical failure still counts
        assert verdict.outcome == ("fail" if critical and fresh == "fail" else "inconclusive")


def test_equality_passes_and_the_notes_say_why():
    at_most = Gate(metric="tier_miss_rate", threshold=0.02, direction="at_most", min_samples=100)
    assert judge(at_most, Measurement(0.02, 100)).outcome == "pass"
    assert (
        judge(Gate(metric="upper_bound_utilization", threshold=0.9, direction="at_least"), Measurement(0.9, 1)).outcome
        == "pass"
    )
    few = judge(at_most, Measurement(0.0, 99))
    assert (few.outcome, few.note) == ("inconclusive", "99 samples < min_samples 100")
    assert judge(at_most, None).note == "no data" and judge(at_most, None, "no steps").note == "no steps"
    failed = judge(at_most, Measurement(0.5, 1000))
    assert (failed.outcome, failed.note) == ("fail", "0.5 not <= 0.02")
    assert failed.to_dict()["gate"] == "tier_miss_rate" and failed.decides


def test_a_promql_gate_reads_its_own_key_and_a_store_gate_its_metric():
    """A PromQL gate named like a store metric (its name defaults to its metric label) must not replace that
    metric for the store's gates: its measurement has a key of its own."""
    gates = [
        Gate(metric="survival_ece", threshold=0.05, direction="at_most", name="store_ece"),
        Gate(metric="survival_ece", threshold=1.0, direction="at_most", promql="max(up)", dry_run=True),
    ]
    assert gates[1].name == "survival_ece" and gates[1].measured_as == "promql:survival_ece"
    measured = {"survival_ece": Measurement(0.01, 50), "promql:survival_ece": Measurement(2.0, 3)}
    verdicts = [(v.gate, v.value, v.outcome) for v in judge_all(gates, measured)]
    assert verdicts == [("store_ece", 0.01, "pass"), ("survival_ece", 2.0, "fail")]


def test_baseline_waits_for_the_reference_its_gates_need_and_never_fails():
    policy = parse_rollout_policy(
        {
            "gates": [
                {"metric": "accepted_length_ratio", "threshold": 0.9, "direction": "at_least", "min_samples": 40},
                {"metric": "tokens_per_s_ratio", "threshold": 0.9, "direction": "at_least", "min_samples": 25},
                {"metric": "survival_ece", "threshold": 0.05, "direction": "at_most", "min_samples": 5000},
            ]
        }
    )
    assert [judge_baseline(policy, steps).outcome for steps in (0, 39, 40, 10**6)] == [
        "inconclusive",
        "inconclusive",
        "pass",
        "pass",
    ]
    assert judge_baseline(policy, 10**6, "no steps for 900 s").outcome == "inconclusive"
    assert judge_baseline(parse_rollout_policy({"gates": []}), 1).outcome == "pass"


@pytest.mark.parametrize(
    ("direction", "low", "high", "outcome"),
    [
        ("at_most", 0.95, 1.08, "pass"),  # wholly <= 1.10
        ("at_most", 1.00, 1.10, "pass"),  # equality passes
        ("at_most", 1.05, 1.20, "inconclusive"),  # straddles: collect more
        ("at_most", 1.11, 1.30, "fail"),  # wholly beyond
        ("at_least", 1.10, 1.20, "pass"),
        ("at_least", 1.00, 1.20, "inconclusive"),
        ("at_least", 0.90, 1.09, "fail"),
        ("at_most", None, None, "inconclusive"),  # too few pairs for an interval at the level
        # One side open (a replica short of pairs for its own interval): only the side there decides.
        ("at_most", 1.11, None, "fail"),
        ("at_most", 0.95, None, "inconclusive"),  # cannot pass without its good side
        ("at_least", None, 1.09, "fail"),
        ("at_least", None, 1.15, "inconclusive"),
        ("at_most", None, 1.08, "pass"),  # (-inf, 1.08] is wholly below 1.10
    ],
)
def test_a_comparison_is_judged_by_its_interval_not_its_estimate(direction, low, high, outcome):
    gate = Gate(metric="p99_tpot_ratio", threshold=1.10, direction=direction, min_samples=5)
    # The estimate (1.0) is on the good side of an at_most 1.10 in every case: only the interval decides.
    verdict = judge(gate, Measurement(1.0, 12, low, high, "sign test"))
    assert verdict.outcome == outcome, verdict.note
    assert (verdict.low, verdict.high, verdict.method, verdict.samples) == (low, high, "sign test", 12)
    assert judge(gate, Measurement(1.0, 12, 0.9, 1.0, "sign test"), "stale").outcome == "inconclusive"


def _verdict(
    value: float | None, critical: bool = False, dry_run: bool = False, samples: int = 10, guard: bool = False
):
    gate = Gate(metric="tier_miss_rate", threshold=0.5, direction="at_most", critical=critical, guard=guard)
    # A policy refuses critical with dry_run; the supervisor makes a comparing gate a dry run after validation.
    if dry_run:
        gate = gate.model_copy(update={"dry_run": True})
    return judge(gate, Measurement(value, samples), None)


@pytest.mark.parametrize(
    "verdicts, outcome",
    [
        ([], "pass"),
        ([_verdict(0.1), _verdict(0.1)], "pass"),
        ([_verdict(0.1), _verdict(None)], "inconclusive"),
        ([_verdict(None), _verdict(0.9)], "fail"),
        ([_verdict(0.9), _verdict(0.9, critical=True)], "critical"),
        ([_verdict(0.1), _verdict(0.9, critical=True, dry_run=True)], "pass"),  # a dry run never decides
        ([_verdict(0.1), _verdict(None, dry_run=True)], "pass"),
        ([_verdict(0.1), _verdict(None, guard=True)], "pass"),  # a guard's inconclusive holds nothing back
        ([_verdict(0.1), _verdict(0.9, guard=True)], "fail"),  # but its failure counts
    ],
)
def test_interval_outcome_is_the_worst_deciding_verdict(verdicts, outcome):
    assert interval_outcome(verdicts) == outcome


def test_verdict_tables_align():
    policy = parse_rollout_policy({})
    verdicts = [v.to_dict() for v in judge_all(policy.gates, {"survival_ece_debiased": Measurement(0.31, 5000)})]
    table = verdict_table(verdicts).splitlines()
    assert table[0].split()[:2] == ["gate", "value"] and len(table) == len(policy.gates) + 1
    assert "0.310" in table[1] and "fail" in table[1]
    assert len({len(line.split("  ")[0]) for line in table}) == 1  # the gate column is padded to one width


def test_an_interval_that_straddles_says_so_and_one_in_a_grey_zone_names_both_thresholds():
    gate = Gate(metric="p99_tpot_ratio", threshold=1.1, direction="at_most")
    m = Measurement(1.05, 20, 0.95, 1.2, "sign test")
    assert judge(gate, m).note == "interval [0.95, 1.2] straddles 1.1: collect more"
    grey = gate.model_copy(update={"fail_threshold": 1.3})
    assert judge(grey, m).note == "interval [0.95, 1.2] ends between 1.1 and 1.3: collect more"
    assert judge(grey, Measurement(1.25, 20, 1.15, 1.28, "sign test")).outcome == "inconclusive"
    assert judge(grey, Measurement(1.4, 20, 1.31, 1.5, "sign test")).outcome == "fail"
