"""Depth labels follow docs/design.md §2 exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.labels import explode
from sparkgate.collectors.wire import flatten, from_records
from tests.collectors.strategies import compact_row, step, step_records


def oracle(mode: str, gamma: int, window: int, accepted: int, full_accept: int | None, k: int) -> str:
    """docs/design.md §2 word for word, one depth at a time."""
    if mode in ("static", "shadow", "cap_accept"):
        v, r = gamma, full_accept
    else:
        v, r = window, accepted
    if k <= r:
        return "accepted"
    if k == r + 1 <= v:
        return "rejected"
    if r < v and k > r + 1:
        return "not_at_risk"
    assert r == v and k > v
    return "censored"


def labels_of(records):
    return explode(flatten(from_records(records).wire)).to_pylist()


@settings(max_examples=80, deadline=None)
@given(st.lists(step_records(), min_size=1, max_size=3, unique_by=lambda r: r.step_id))
def test_statuses_match_the_design(records):
    rows = labels_of(records)
    expected = []
    for record in records:
        for req in record.requests:
            for k in range(1, record.gamma + 1):
                status = oracle(req.mode, record.gamma, req.window, req.accepted, req.full_accept, k)
                expected.append((record.step_id, req.request_id, k, status, req.confidence[k - 1], req.survival[k - 1]))
    assert [
        (r["step_id"], r["request_id"], r["depth"], r["status"], r["confidence"], r["survival"]) for r in rows
    ] == expected


@settings(max_examples=80, deadline=None)
@given(step_records())
def test_label_is_y_k_where_observed_and_null_where_censored(record):
    rows = iter(labels_of([record]))
    for req in record.requests:
        for k in range(1, record.gamma + 1):
            row = next(rows)
            observed = req.mode != "compact" or k <= req.window or req.accepted < req.window
            assert (row["status"] != "censored") == observed
            if observed:
                a_star = req.full_accept if req.full_accept is not None else req.accepted
                assert row["label"] == (a_star >= k)
            else:
                assert row["label"] is None


def test_compact_example():
    # gamma 5, window 3 fully accepted: depths 4-5 were never verified.
    censored = labels_of([step(gamma=5, requests=[compact_row(gamma=5, window=3, accepted=3)])])
    assert [r["status"] for r in censored] == ["accepted"] * 3 + ["censored"] * 2
    # window 3, one accepted: depth 2 rejected, depth 3+ known zero.
    broke = labels_of([step(gamma=5, requests=[compact_row(gamma=5, window=3, accepted=1)])])
    assert [r["status"] for r in broke] == ["accepted", "rejected", "not_at_risk", "not_at_risk", "not_at_risk"]
    assert [r["label"] for r in broke] == [True, False, False, False, False]
