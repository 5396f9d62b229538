"""Comparison gates: the sign-test interval's coverage, A/A data, and epoch pairs read from a real store."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.request_ingest import prepare_requests
from sparkgate.collectors.synth import RowModel, synthetic_wire
from sparkgate.controller.comparison import (
    PREDICTED,
    Epochs,
    Groups,
    adjusted,
    comparisons,
    fleet,
    measure,
    paired,
    per_pair,
    reference_window,
    window_start,
)
from sparkgate.controller.gates import judge
from sparkgate.policies.gate import Gate
from sparkgate.policies.intervals import sign_interval
from sparkgate.policies.rollout import Comparison
from sparkgate.policies.switchback import Switchback
from sparkgate.policies.vocabulary import Arm
from tests.conftest import T0, ingest_synthetic, ingest_wire, request_record, synthetic_steps, with_columns


@pytest.mark.parametrize("level", [0.9, 0.95])
def test_the_sign_interval_covers_the_median_at_least_at_its_level_for_every_n(level):
    for n in range(1, 60):
        low, high = sign_interval(np.arange(n, dtype=float), level)
        if low is None:
            assert 1 - 2 * 0.5**n < level  # even [min, max] would cover too rarely
            continue
        j = int(low) + 1  # [d_(j), d_(n-j+1)] holds the median unless >= n-j+1 of n fall on one side
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
        assert coverage >= level and high == n - j


def test_on_aa_data_intervals_hold_one_and_gates_fail_no_more_than_their_level():
    rng = np.random.default_rng(0)
    gate = Gate(metric="p99_tpot_ratio", threshold=1.0, direction="at_most", min_samples=6)
    runs, covered, failed = 2000, 0, 0
    for _ in range(runs):
        # Heavy-tailed noise, the same in both arms: a noisy machine, no effect.
        d = rng.standard_t(3, size=int(rng.integers(6, 40))) * 0.1
        m = measure(d, 0.95)
        covered += m.low <= 1.0 <= m.high
        failed += judge(gate, m).outcome == "fail"
    assert covered / runs >= 0.95
    assert failed / runs <= 0.025 + 0.01  # one side of a 95% interval, and sampling error of 2,000 runs


def steps_in(store, schedule, epoch, replica, first_step, step_ms, revision=3, at=0.3, count=20):
    arm = schedule.arm(replica, epoch)
    ingest_synthetic(store, count, schedule.start(epoch) + at, phase="shadow", replica=replica, first_step=first_step,
                     epoch=epoch, arm=str(arm), policy_revision=revision,
                     step_ms=step_ms * (2.0 if arm == "treatment" else 1.0))  # fmt: skip
    return arm


def test_epoch_pairs_read_from_the_store_compare_treatment_with_control(store):
    schedule, spec = Switchback(5, 1.0, T0), Comparison(epoch_s=1.0, burn_in_s=0.2)
    step = 0
    for replica in ("r0", "r1"):
        for epoch in range(16):
            steps_in(store, schedule, epoch, replica, step, 10.0)
            # The burn-in and another revision's steps would say 100x: they must not count.
            steps_in(store, schedule, epoch, replica, step + 100, 1000.0, at=0.05, count=2)
            steps_in(store, schedule, epoch, replica, step + 200, 1000.0, revision=2, count=2)
            step += 1000
    lines = []
    for epoch in range(16):
        arm = str(schedule.arm("r0", epoch))
        slow = 1.5 if arm == "treatment" else 1.0
        for i in range(3):
            start = schedule.start(epoch) + 0.3 + 0.1 * i
            timeline = {"first_token_ts": start + 0.04 * slow, "finish_ts": start + 0.05 * slow,
                        "commit_offsets_ms": [40.0 * slow, 50.0 * slow]}  # fmt: skip
            lines.append(request_record(request_id=f"e{epoch}-{i}", arrival_ts=start, epoch=epoch, arm=arm,
                                        policy_revision=3, **timeline))  # fmt: skip
    store.commit_requests(prepare_requests("\n".join(map(json.dumps, lines)).encode()), "test")
    found = comparisons(store, Epochs(revision=3, origin=T0, since=T0), spec)
    assert found["p99_step_ratio"].value == pytest.approx(2.0)
    assert found["p99_step_ratio"].samples == 16  # 8 pairs on each of two replicas
    assert found["tokens_per_s_ratio"].value == pytest.approx(0.5, rel=0.05)  # about as many tokens in twice the time
    assert found["p99_ttft_ratio"].value == pytest.approx(1.5) and found["p99_ttft_ratio"].samples == 8  # one replica
    assert found["p99_tpot_ratio"].value == pytest.approx(1.5)
    assert found["goodput_ratio"].value == pytest.approx(1.0)  # all within the SLOs in both arms
    method = found["p99_step_ratio"].method
    assert found["p99_step_ratio"].low == pytest.approx(2.0)
    assert "pooled (16 pairs" in method and "per replica (2" in method
    assert comparisons(store, Epochs(revision=4, origin=T0, since=T0), spec)["p99_step_ratio"].samples == 0


def test_an_epoch_of_no_measured_time_has_no_tokens_per_second_rather_than_infinitely_many(store):
    schedule, spec = Switchback(5, 1.0, T0), Comparison(epoch_s=1.0, burn_in_s=0.2)
    for epoch in range(16):
        steps_in(store, schedule, epoch, "r0", 1000 * epoch, 10.0 if epoch >= 4 else 0.0)  # a clock that read 0
    found = comparisons(store, Epochs(revision=3, origin=T0, since=T0), spec)["tokens_per_s_ratio"]
    assert found.samples == 6 and math.isfinite(found.value)  # the 2 pairs of zero time are left out


def test_steps_with_no_measured_time_price_nothing_in_either_arm(store):
    # An engine that leaves a step's time out (SGLang's untimed components, or the first decode after a
    # prefill) gets 0 ms: counted, those steps were free, and tokens per second rose with their share.
    schedule, spec = Switchback(5, 1.0, T0), Comparison(epoch_s=1.0, burn_in_s=0.2)
    for epoch in range(16):
        steps_in(store, schedule, epoch, "r0", 1000 * epoch, 10.0)
        if schedule.arm("r0", epoch) == "treatment":
            steps_in(store, schedule, epoch, "r0", 1000 * epoch + 100, 0.0, count=20)  # as many again, untimed
    found = comparisons(store, Epochs(revision=3, origin=T0, since=T0), spec)
    assert found["p99_step_ratio"].value == pytest.approx(2.0)
    assert found["tokens_per_s_ratio"].value == pytest.approx(0.5, rel=0.05)


def test_a_treatment_whose_requests_never_meet_the_slos_fails_goodput_instead_of_leaving_it_no_pairs(store):
    schedule, spec = Switchback(5, 1.0, T0), Comparison(epoch_s=1.0, burn_in_s=0.2, ttft_slo_ms=100.0)
    lines = []
    for epoch in range(40):
        arm = str(schedule.arm("r0", epoch))
        ttft = 500.0 if arm == "treatment" else 40.0  # every treatment request misses the TTFT SLO
        for i in range(3):
            start = schedule.start(epoch) + 0.3 + 0.1 * i
            lines.append(request_record(request_id=f"e{epoch}-{i}", arrival_ts=start, epoch=epoch, arm=arm,
                                        policy_revision=3, first_token_ts=start + ttft / 1000,
                                        finish_ts=start + ttft / 1000 + 0.01,
                                        commit_offsets_ms=[ttft, ttft + 10]))  # fmt: skip
    store.commit_requests(prepare_requests("\n".join(map(json.dumps, lines)).encode()), "test")
    goodput = comparisons(store, Epochs(revision=3, origin=T0, since=T0), spec)["goodput_ratio"]
    assert goodput.samples == 20  # every pair counts: 0 good requests is goodput's worst value, not no value
    assert goodput.value == pytest.approx(0.5 / 3.5)  # (0 + ½) / (3 + ½)
    gate = Gate(metric="goodput_ratio", threshold=0.95, direction="at_least", min_samples=7)
    assert judge(gate, goodput).outcome == "fail"


@given(st.floats(-1e6, 1e6), st.floats(0.1, 100), st.floats(0, 1e6), st.one_of(st.none(), st.floats(0.2, 1e5)))
def test_a_comparison_window_starts_at_a_whole_pair_inside_it_or_at_the_stages_first(first, period, age, window):
    now = first + age
    since = window_start(first, period, now, window)
    pairs = (since - first) / period
    assert since >= first and abs(pairs - round(pairs)) < 1e-6 * max(1.0, pairs)  # a pair's start
    if window is None or now - window <= first:
        assert since == first
    else:  # the oldest pair wholly inside the window: no later than one pair past its start
        assert now - window - 1e-6 * period <= since < now - window + period * (1 + 1e-9)


def long_stage(store, pairs: int, slow_from: int, ahead: float = 1.0) -> None:
    """Two replicas' pairs of a stage: the treatment's steps ``ahead`` times the control's until pair
    ``slow_from``, twice that from there on."""
    schedule, step, wires = Switchback(7, 1.0, T0), 0, []
    for replica in ("r0", "r1"):
        for epoch in range(2 * pairs):
            arm = schedule.arm(replica, epoch)
            factor = (ahead * (2.0 if epoch >= 2 * slow_from else 1.0)) if arm == "treatment" else 1.0
            wires.append(synthetic_steps(20, schedule.start(epoch) + 0.3, "adaptive", replica, step, epoch=epoch,
                                         arm=str(arm), policy_revision=3, step_ms=10.0 * factor))  # fmt: skip
            step += 1000
    ingest_wire(store, pa.concat_tables(wires))  # one batch: a transaction per epoch is most of the test's time


def test_a_regression_late_in_a_long_stage_fails_the_window_that_the_whole_stage_dilutes(store):
    spec, pairs = Comparison(epoch_s=1.0, burn_in_s=0.2, window_s=16.0), 40
    long_stage(store, pairs, slow_from=32)  # the treatment's steps twice as slow in the last 8 pairs of 40
    gate = Gate(metric="p99_step_ratio", threshold=1.1, direction="at_most", min_samples=8)
    now = T0 + 2 * pairs
    since = window_start(T0, 2 * spec.epoch_s, now, spec.window_s)
    assert since == T0 + 2 * (pairs - 8)  # the newest 8 pairs
    windowed = comparisons(store, Epochs(revision=3, origin=T0, since=since), spec)["p99_step_ratio"]
    assert windowed.samples == 16 and judge(gate, windowed).outcome == "fail"
    whole = comparisons(store, Epochs(revision=3, origin=T0, since=T0), spec)["p99_step_ratio"]
    assert whole.samples == 80 and judge(gate, whole).outcome != "fail"  # 64 healthy pairs hide 16 slow ones


def test_a_treatment_that_slows_while_still_ahead_of_control_fails_its_drift_not_its_ratio(store):
    # Half the control's step time, until the last 8 of 40 pairs double it: still no slower than control.
    spec, pairs = Comparison(epoch_s=1.0, burn_in_s=0.2, window_s=16.0), 40
    long_stage(store, pairs, slow_from=32, ahead=0.5)
    recent = Epochs(revision=3, origin=T0, since=window_start(T0, 2.0, T0 + 2 * pairs, spec.window_s))
    reference = reference_window(recent, spec)
    assert (reference.since, reference.until) == (T0 + 2 * (pairs - 16), recent.since)  # the 8 pairs before
    found = comparisons(store, recent, spec, reference)
    ratio = Gate(metric="p99_step_ratio", threshold=1.05, direction="at_most", min_samples=8)
    drift = Gate(metric="p99_step_ratio_drift", threshold=1.05, direction="at_most", min_samples=8)
    assert found["p99_step_ratio"].value == pytest.approx(1.0)
    assert judge(ratio, found["p99_step_ratio"]).outcome != "fail"
    moved = found["p99_step_ratio_drift"]
    assert moved.value == pytest.approx(2.0) and moved.samples == 16 and judge(drift, moved).outcome == "fail"
    assert "16 pairs of the newest window against 16" in moved.method
    assert found["tokens_per_s_ratio_drift"].value == pytest.approx(0.5, rel=0.05)
    steady = comparisons(store, reference, spec, reference_window(reference, spec))  # before the slowdown
    assert steady["p99_step_ratio_drift"].value == pytest.approx(1.0)
    assert judge(drift, steady["p99_step_ratio_drift"]).outcome == "pass"


def test_a_stage_no_older_than_one_window_has_no_window_before_it_to_drift_from():
    spec = Comparison(epoch_s=1.0, burn_in_s=0.2, window_s=16.0)
    assert reference_window(Epochs(revision=3, origin=T0, since=T0), spec) is None
    arms = (("a", Arm.TREATMENT), ("b", Arm.CONTROL))
    assert reference_window(Groups(T0, arms, since=T0 + 0.2), spec) is None
    groups = reference_window(Groups(T0, arms, since=T0 + 30.2), spec)
    assert (groups.since, groups.until) == (pytest.approx(T0 + 14.2), T0 + 30.2)  # 16 slices of 1 s before it
    assert reference_window(Epochs(revision=3, origin=T0, since=T0 + 10), spec).since == T0  # what there is


def test_a_regression_on_one_replica_of_three_fails_the_gate_a_pooled_center_would_never_fail():
    rng = np.random.default_rng(1)
    healthy = {f"r{i}": rng.normal(0.0, 0.02, 12) for i in range(2)}
    slow = {"r2": rng.normal(math.log(1.2), 0.02, 12)}
    gate = Gate(metric="p99_tpot_ratio", threshold=1.10, direction="at_most", min_samples=10)
    combined = fleet({**healthy, **slow}, bad_when_high=True, level=0.95)
    assert judge(gate, combined).outcome == "fail" and "worst replica r2" in combined.method
    # The failing bound is r2's own, beyond the pooled estimate shown beside it: the method says whose it is.
    assert combined.low == measure(slow["r2"], 1 - 0.05 / 6).low > combined.value
    assert "the bad-side bound replica r2's" in combined.method
    everything = np.concatenate([*healthy.values(), *slow.values()])
    assert judge(gate, measure(everything, 0.95)).outcome != "fail"  # what one center over all pairs says
    assert judge(gate, fleet(healthy, bad_when_high=True, level=0.95)).outcome == "pass"


def test_a_fleet_wide_regression_no_single_replica_can_show_fails_on_the_pooled_pairs():
    rng = np.random.default_rng(2)
    # Tokens/s 9.5% lower on every replica, 7 noisy pairs each: each replica's own interval (at 1 - 0.05/6)
    # still reaches the threshold, the 21 pooled pairs (at 0.975) do not.
    by_replica = {f"r{i}": rng.normal(math.log(0.905), 0.05, 7) for i in range(3)}
    gate = Gate(metric="tokens_per_s_ratio", threshold=0.97, direction="at_least", min_samples=5)
    assert all(judge(gate, measure(d, 1 - 0.05 / 6)).outcome != "fail" for d in by_replica.values())
    combined = fleet(by_replica, bad_when_high=False, level=0.95)
    assert judge(gate, combined).outcome == "fail"
    assert combined.value == pytest.approx(0.905, rel=0.03) and combined.samples == 21
    # A replica's 7 pairs are too few for its own interval; the good side is the pooled interval's.
    pooled = measure(np.concatenate(list(by_replica.values())), 0.975)
    assert combined.low == pooled.low < combined.high
    assert "pooled (21 pairs" in combined.method and "the bad-side bound pooled's" in combined.method


def test_a_fleet_whose_pooled_interval_clears_the_margin_passes_before_any_replica_alone_could():
    rng = np.random.default_rng(4)
    # No effect, sd 0.1, 40 pairs per replica: each replica's interval at 1 - 0.05/6 reaches below 0.97,
    # the 120 pooled pairs' at 0.975 do not.
    by_replica = {f"r{i}": rng.normal(0.0, 0.1, 40) for i in range(3)}
    gate = Gate(metric="tokens_per_s_ratio", threshold=0.97, direction="at_least", min_samples=5)
    assert all(judge(gate, measure(d, 1 - 0.05 / 6)).outcome == "inconclusive" for d in by_replica.values())
    combined = fleet(by_replica, bad_when_high=False, level=0.95)
    assert judge(gate, combined).outcome == "pass"
    assert combined.low == measure(np.concatenate(list(by_replica.values())), 0.975).low
    assert "the good-side bound the pooled interval's" in combined.method


def test_a_fleet_whose_effect_sits_at_the_threshold_passes_no_more_often_than_one_side_of_the_pooled_level():
    rng = np.random.default_rng(6)
    gate = Gate(metric="tokens_per_s_ratio", threshold=0.97, direction="at_least", min_samples=6)
    runs, passed = 2000, 0
    for _ in range(runs):
        # Every replica exactly at the threshold, heavy-tailed symmetric noise: any pass is a wrong one.
        by_replica = {f"r{i}": math.log(0.97) + rng.standard_t(3, size=int(rng.integers(6, 30))) * 0.1
                      for i in range(3)}  # fmt: skip
        passed += judge(gate, fleet(by_replica, bad_when_high=False, level=0.95)).outcome == "pass"
    assert passed / runs <= 0.0125 + 0.008  # one side of the pooled 97.5% interval, and 2,000 runs' error


def test_one_replica_wholly_on_the_bad_side_fails_the_gate_even_while_the_pooled_interval_clears():
    rng = np.random.default_rng(5)
    healthy = {f"r{i}": rng.normal(math.log(1.1), 0.01, 30) for i in range(4)}
    slow = {"r4": rng.normal(math.log(0.9), 0.01, 30)}
    gate = Gate(metric="tokens_per_s_ratio", threshold=0.97, direction="at_least", min_samples=5)
    assert judge(gate, measure(np.concatenate([*healthy.values(), *slow.values()]), 0.975)).outcome == "pass"
    combined = fleet({**healthy, **slow}, bad_when_high=False, level=0.95)
    assert judge(gate, combined).outcome == "fail"
    assert combined.low == combined.high == measure(slow["r4"], 1 - 0.05 / 10).high  # held back to the bad bound


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(-1, 1), min_size=0, max_size=12), min_size=2, max_size=4),
       st.booleans())  # fmt: skip
def test_the_fleets_good_bound_never_lies_beyond_its_bad_bound(units, bad_when_high):
    m = fleet({f"r{i}": np.array(d) for i, d in enumerate(units)}, bad_when_high, 0.95)
    if m.low is not None and m.high is not None:
        assert m.low <= m.high


def test_on_aa_fleets_the_pooled_and_per_replica_intervals_together_fail_no_more_than_one_side_of_the_level():
    rng = np.random.default_rng(3)
    gate = Gate(metric="p99_step_ratio", threshold=1.0, direction="at_most", min_samples=6)
    runs, failed = 2000, 0
    for _ in range(runs):
        # Heavy-tailed noise, symmetric (the arm order inside a pair is a coin flip), no effect.
        by_replica = {f"r{i}": rng.standard_t(3, size=int(rng.integers(6, 30))) * 0.1 for i in range(3)}
        failed += judge(gate, fleet(by_replica, bad_when_high=True, level=0.95)).outcome == "fail"
    assert failed / runs <= 0.025 + 0.01  # one side of a 95% interval, and sampling error of 2,000 runs


def test_replica_groups_compare_treatment_servers_with_control_servers_slice_by_slice_at_matched_load(store):
    spec = Comparison(epoch_s=1.0, burn_in_s=0.5)
    groups = Groups(T0, (("a:1/dp", Arm.TREATMENT), ("b:2/dp", Arm.CONTROL)))
    step = 0

    def steps(replica, at, step_ms, batch=32):
        nonlocal step
        ingest_synthetic(store, 20, at, replica=replica, first_step=step, batch=batch, step_ms=step_ms)
        step += 100

    for k in range(10):
        at = T0 + 0.5 + k + 0.1
        steps("a:1/dp0", at, 12.5)  # two treatment ranks, one control: groups need not be the same size
        steps("a:1/dp1", at, 12.5)
        steps("b:2/dp0", at, 10.0)
        steps("b:2/dp0", at + 0.3, 1.0, batch=2)  # a load the treatment did not serve in the slice: unmatched
        steps("c:3/dp0", at, 1000.0)  # in neither group
    steps("a:1/dp0", T0 + 0.1, 1000.0)  # the burn-in
    found = comparisons(store, groups, spec)
    step_ratio = found["p99_step_ratio"]
    assert step_ratio.samples == 10 and step_ratio.low == step_ratio.high == pytest.approx(12.5 / 10.0)
    assert "treatment group against control group" in step_ratio.method
    assert found["tokens_per_s_ratio"].value == pytest.approx(0.8, rel=0.1)


def test_a_treatment_group_that_verified_nothing_compact_is_an_error_not_a_comparison(store):
    # An SGLang server launched with SGLANG_RAGGED_VERIFY_MODE=static takes the forced budget and ignores it
    # (dspark_verify_planner.py @ 00f7df6: no budget planner in static mode; internal_state.py @ 2784dee
    # still answers updated=True): its "treatment" verifies as the control does, a fleet against itself.
    spec = Comparison(epoch_s=1.0, burn_in_s=0.5)
    groups = Groups(T0, (("a:1/dp", Arm.TREATMENT), ("b:2/dp", Arm.CONTROL)))
    static_only = RowModel(mode_weights=(1.0, 0.0, 0.0, 0.0))
    for k in range(10):
        at = T0 + 0.5 + k + 0.1
        for i, replica in enumerate(("a:1/dp0", "b:2/dp0")):
            wire = synthetic_wire(20, 8, 7, replica, first_step=100 * (2 * k + i), seed=k, ts=at, model=static_only)
            ingest_wire(store, with_columns(wire, phase="compact", step_ms=10.0))
    found = comparisons(store, groups, spec)
    assert {m.error for m in found.values()} == {
        "the treatment group's servers verified none of their 1600 rows compact: the verify setting took no "
        "effect (an SGLang server verifies compact only when launched with SGLANG_RAGGED_VERIFY_MODE=compact)"
    }


def test_the_adjustment_subtracts_each_pairs_covariate_times_the_other_pairs_regression():
    d, z = {"r0": np.array([1.0, 2.0]), "r1": np.array([3.0])}, {"r0": np.ones(2), "r1": np.ones(1)}
    out, theta = adjusted(d, z)
    # Pair 1's θ from pairs 2 and 3 (Σdz / Σz² = 5 / 2), and so on.
    assert out["r0"] == pytest.approx([1 - 2.5, 2 - 2.0]) and out["r1"] == pytest.approx([3 - 1.5])
    assert theta == pytest.approx(2.0)
    flat, theta = adjusted(d, {"r0": np.zeros(2), "r1": np.zeros(1)})  # a covariate that never varies
    assert theta == 0.0 and all((flat[u] == d[u]).all() for u in d)
    assert adjusted({}, {}) == ({}, 0.0)
    with pytest.raises(ValueError, match="2 pairs of ratios against 1 of the covariate"):
        adjusted({"r0": np.ones(2)}, {"r0": np.ones(1)})
    with pytest.raises(ValueError, match="units"):
        adjusted({"r0": np.ones(1)}, {"r1": np.ones(1)})


@pytest.mark.parametrize("explained", [0.0, 0.8])
def test_the_adjusted_interval_covers_the_effect_at_its_level_and_narrows_by_what_the_covariate_explains(explained):
    # d = effect + θ z + noise, z symmetric about zero (the arm order is a coin flip); the demo's pairs have
    # z's sd near 0.23 and d's near 0.27, about 0.8 of d's variance explained.
    rng = np.random.default_rng(7)
    effect, runs, covered, widths = math.log(0.97), 400, 0, []
    for _ in range(runs):
        n = int(rng.integers(20, 60))
        z = rng.normal(0, 0.23, n) * rng.choice([-1, 1], n)
        d = effect + (z if explained else 0.0) + rng.normal(0, 0.27 * math.sqrt(1 - explained), n)
        plain = measure(d, 0.95)
        fixed = measure(adjusted({"r0": d}, {"r0": z})[0]["r0"], 0.95)
        covered += fixed.low <= math.exp(effect) <= fixed.high
        widths.append(math.log(fixed.high / fixed.low) / math.log(plain.high / plain.low))
    assert covered / runs >= 0.95 - 0.03  # the level, less the sampling error of 400 runs
    if explained:  # the noise left is √(1 - 0.8) of d's, less what θ's estimate costs
        assert np.median(widths) < 0.55
    else:  # a covariate that explains nothing costs about nothing
        assert np.median(widths) < 1.05


def _drafted_epochs(store, models) -> tuple[Epochs, Comparison, list[pa.Table]]:
    """60 one-second epochs of replica r0, every step 10 ms in both arms, two requests a step; each arm's rows
    drawn as ``models[arm]`` draws them."""
    schedule, spec, wires = Switchback(3, 1.0, T0), Comparison(epoch_s=1.0, burn_in_s=0.2), []
    for epoch in range(60):
        arm = str(schedule.arm("r0", epoch))
        wire = synthetic_wire(8, 2, 7, "r0", first_step=100 * epoch, seed=epoch, ts=schedule.start(epoch) + 0.3,
                              model=models[arm])  # fmt: skip
        wires.append(with_columns(wire, epoch=epoch, arm=arm, policy_revision=3, step_ms=10.0))
    ingest_wire(store, pa.concat_tables(wires))
    return Epochs(revision=3, origin=T0, since=T0), spec, wires


# Static rows (each verifies its whole draft) whose drafts are either easy or hard, as a real drafter's are from
# one context to the next.
EASY_OR_HARD = RowModel(mode_weights=(1.0, 0.0, 0.0, 0.0), confidence_rows=np.array([[0.95] * 7, [0.4] * 7]))


def test_tokens_per_second_is_adjusted_for_the_predicted_length_of_the_drafts_it_read(store):
    # A/A: tokens per second differ between epochs by the drafts' acceptance alone, which their survivals predict.
    design, spec, wires = _drafted_epochs(store, {"treatment": EASY_OR_HARD, "control": EASY_OR_HARD})
    cells = per_pair(store, design, spec)
    # The covariate is each epoch's mean over its request rows (not its steps: how many requests a step holds
    # is load, which an arm can move).
    rows = [w.column("requests").combine_chunks().values.field("survival").to_pylist() for w in wires]
    expected = sorted(np.mean([1 + sum(s) for s in epoch]) for epoch in rows)
    assert sorted(v for v, _ in cells[PREDICTED].values()) == pytest.approx(expected)
    assert cells[PREDICTED].keys() == cells["tokens_per_s_ratio"].keys()
    plain = measure(paired(cells["tokens_per_s_ratio"])["r0"], 0.95)
    found = comparisons(store, design, spec)["tokens_per_s_ratio"]
    assert found.samples == 30 and found.low <= 1.0 <= found.high
    assert math.log(found.high / found.low) < 0.8 * math.log(plain.high / plain.low)
    assert "adjusted for the drafts' predicted length (θ" in found.method


def test_a_window_whose_arms_draft_differently_is_judged_unadjusted(store):
    # The treatment's drafts run longer: adjusting for them would take its real gain away.
    easy = RowModel(mode_weights=(1.0, 0.0, 0.0, 0.0), confidence_rows=np.array([[0.95] * 7, [0.9] * 7]))
    design, spec, _ = _drafted_epochs(store, {"treatment": easy, "control": EASY_OR_HARD})
    found = comparisons(store, design, spec)["tokens_per_s_ratio"]
    plain = measure(paired(per_pair(store, design, spec)["tokens_per_s_ratio"])["r0"], spec.level)
    assert "not adjusted: the drafts' predicted length differs between the arms" in found.method
    assert (found.value, found.low, found.high) == (plain.value, plain.low, plain.high)
    assert found.low > 1.0
