"""The sums' statements read any signed bucket ranges, split at a bucket or not, and a reference phase's span."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.controller import queries, window_sums
from sparkgate.controller.queries import Slice, Window
from tests.controller.window_fixtures import T0, assert_same, labelled_store


@pytest.fixture(scope="module")
def store():
    with labelled_store() as s:
        yield s


@settings(max_examples=20, deadline=None)
@given(
    parts=st.lists(st.tuples(st.integers(int(T0 / 10) - 2, int(T0 / 10) + 12), st.integers(1, 6),
                             st.sampled_from([1, -1])), min_size=1, max_size=3),
    split=st.integers(int(T0 / 10) - 2, int(T0 / 10) + 14),
    replicas=st.sampled_from([None, ("a",), ("b", "a")]),
    fine_bins=st.booleans(),
)  # fmt: skip
def test_sums_split_at_a_bucket_are_the_sums_of_each_side(store, parts, split, replicas, fine_bins):
    ranges = [(lo, lo + n, sign) for lo, n, sign in parts]
    below, above = window_sums.sums(store, ranges, None, None, None, True, replicas, split, fine_bins).split()
    for half, clip in ((below, lambda lo, hi: (lo, min(hi, split))), (above, lambda lo, hi: (max(lo, split), hi))):
        mine = [(*clip(lo, hi), sign) for lo, hi, sign in ranges if clip(lo, hi)[0] < clip(lo, hi)[1]]
        if not mine:
            assert all(len(t["n"]) == 0 for t in (half.fine, half.grouped, half.status, half.requests))
            continue
        want = window_sums.sums(store, mine, None, None, None, True, replicas, fine_bins=fine_bins)
        assert half.bins == want.bins
        depths = max(want.depths, half.depths)
        assert_same(half.stats(depths, True, replicas), want.stats(depths, True, replicas))


def test_sums_of_no_bucket_range_are_refused(store):
    with pytest.raises(ValueError, match="at least one bucket range"):
        window_sums.sums(store, [], None, None, None, False)


def test_a_reference_phase_is_read_over_its_own_span_with_the_figures_of_the_whole_history(store):
    span = window_sums.phase_span(store, ("baseline",))
    assert span.since == pytest.approx(T0) and span.until < T0 + 4 * 8.3 + 1
    for phase in ("baseline", "shadow"):
        whole = queries.step_buckets(store, Window(), Slice(), phase=phase).to_pylist()
        span = window_sums.phase_span(store, (phase,))
        assert queries.step_buckets(store, span, Slice(), phase=phase).to_pylist() == whole
    assert window_sums.phase_span(store, ("adaptive",)) == Window()  # none recorded: the whole (empty) history
