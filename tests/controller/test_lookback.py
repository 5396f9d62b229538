"""The gates' window reaches back while calibration gates lack labels, and only then."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.label_sums import SUM_BUCKET_S
from sparkgate.controller.lookback import LabelCounts, LabelNeed, label_counts, widened_since
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import parse_rollout_policy
from tests.conftest import T0, ingest_synthetic

STEP = 60.0


def counts(cells: list[tuple[int, int, int, int]], replicas: tuple[str, ...] = ("r0", "r1")) -> LabelCounts:
    columns = zip(*cells) if cells else [()] * 4
    bucket, replica, depth, n = (np.array(c, dtype=np.int64) for c in columns)
    return LabelCounts(bucket, replica, depth, n, replicas)


cells = st.lists(st.tuples(st.integers(0, 180), st.integers(0, 1), st.integers(1, 3), st.integers(1, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(cells, st.integers(0, 400), st.integers(0, 200), st.sampled_from(["fleet", "replica", "both"]))
def test_the_window_is_the_newest_stepped_start_that_meets_the_need(cells, fleet, replica, which):
    labels = counts(cells)
    need = LabelNeed(fleet if which != "replica" else 0, replica if which != "fleet" else 0)
    since, earliest = 1500.0, 300.0  # buckets 150 and 30
    got = widened_since(labels, since, earliest, STEP, need)
    judged = labels.reporting(since)
    candidates = [since - k * STEP for k in range(math.ceil((since - earliest) / STEP))] + [earliest]
    assert earliest <= got <= since and got in candidates
    # No newer candidate meets the need, and the one taken does unless it is the earliest.
    newer = [c for c in candidates if c > got]
    assert not any(labels.met(c, need, judged) for c in newer)
    assert got == earliest or labels.met(got, need, judged)


def test_the_counts_are_those_of_whole_buckets_and_the_fewest_depth():
    labels = counts([(10, 0, 1, 50), (10, 0, 2, 20), (11, 1, 1, 5), (11, 1, 2, 40)])
    assert labels.met(10 * SUM_BUCKET_S, LabelNeed(fleet=55), ("r0", "r1"))
    assert not labels.met(10 * SUM_BUCKET_S, LabelNeed(fleet=61), ("r0", "r1"))  # depth 2 has 60
    assert not labels.met(10 * SUM_BUCKET_S + 1, LabelNeed(fleet=6), ())  # bucket 10 only in part: left out
    assert not labels.met(10 * SUM_BUCKET_S, LabelNeed(replica=6), ("r0", "r1"))  # r1 has 5 at depth 1
    assert labels.met(10 * SUM_BUCKET_S, LabelNeed(replica=6), ("r0",))  # r1 not reporting: not judged


POLICY = parse_rollout_policy(
    {
        "stale_after_s": 120,
        "gates": [{"metric": "survival_ece", "threshold": 0.9, "direction": "at_most", "min_samples": 400}],
    }
)


def shadow_stage(store, policy=POLICY) -> Controller:
    """A controller in shadow since T0: 20 steps of 32 rows in its first minute, 5 in its newest."""
    ctl = Controller(store, policy, clock=lambda: T0, resamples=10)
    ctl.act("promote", "ops")
    ingest_synthetic(store, 20, T0 + 1)
    ingest_synthetic(store, 5, T0 + 840, first_step=100)
    ctl.clock = lambda: T0 + 900
    return ctl


def survival_verdict(ctl: Controller) -> dict:
    return next(r for r in ctl.tick().reasons[1:] if r["gate"] == "survival_ece")


def test_a_gate_short_of_labels_reads_back_to_the_stage_start_and_says_so(store):
    ctl = shadow_stage(store)
    plain, wide = ctl.window(ctl.state, T0 + 900), ctl.gate_window(ctl.state, T0 + 900)
    assert plain.since == T0 + 600 and wide.since == T0  # 5 steps of 32 rows in the lookback, 25 since T0
    verdict = survival_verdict(ctl)
    assert verdict["outcome"] == "pass" and verdict["samples"] >= 400
    assert "window widened 600 s beyond the lookback for labels" in verdict["note"]
    # The sums counted exactly what the gate then read (the stage starts on a bucket's edge).
    labels = label_counts(store, T0, None)
    assert labels is not None and labels.met(T0, LabelNeed(verdict["samples"]), ())
    assert not labels.met(T0, LabelNeed(verdict["samples"] + 1), ())


def test_without_max_lookback_the_gate_stays_inconclusive(store):
    ctl = shadow_stage(store, POLICY.replace(max_lookback_s=None))
    verdict = survival_verdict(ctl)
    assert verdict["outcome"] == "inconclusive" and verdict["samples"] < 400
    assert "widened" not in verdict["note"]


def test_the_window_stops_at_max_lookback(store):
    ctl = shadow_stage(store, POLICY.replace(max_lookback_s=600))
    assert ctl.gate_window(ctl.state, T0 + 900).since == T0 + 300  # nothing between: widest allowed


def test_enough_labels_in_the_lookback_keep_the_plain_window(store):
    policy = POLICY.replace(gates=(POLICY.gates[0].model_copy(update={"min_samples": 100}),))
    ctl = shadow_stage(store, policy)
    assert ctl.gate_window(ctl.state, T0 + 900) == ctl.window(ctl.state, T0 + 900)
    assert "widened" not in survival_verdict(ctl)["note"]


@pytest.mark.parametrize("key, value", [("max_lookback_s", 30.0), ("max_lookback_s", float("inf"))])
def test_a_max_lookback_under_one_interval_is_refused(key, value):
    with pytest.raises(ValueError, match=key):
        POLICY.replace(**{key: value})
