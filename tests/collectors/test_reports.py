"""Replicas' reports in the store: consistency checks stored whole and once, aggregates whose intervals never
share time, and spans too large to merge refused before any is parsed."""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.labels import explode
from sparkgate.collectors.reports import IntervalOverlap, TooManyReports
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten
from tests.conftest import consistency_check as check

_FLAT = flatten(synthetic_wire(2, 2, 3))
_AGG = Aggregate.from_tables(_FLAT.requests, explode(_FLAT), 3)


def _shares_time(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Half-open intervals that overlap; a zero-length one is its point, inside another's interior."""
    if a[0] == a[1] or b[0] == b[1]:
        point, other = (a, b) if a[0] == a[1] else (b, a)
        return other[0] < point[0] < other[1]
    return max(a[0], b[0]) < min(a[1], b[1])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["r0", "r1"]), st.integers(0, 8), st.integers(0, 4)), max_size=12))
def test_a_replicas_stored_intervals_never_share_time(tmp_path_factory, reports):
    """Accepted = new and disjoint (half-open) from the replica's stored intervals; a retry is a no-op;
    an overlap raises and writes nothing. So no label is ever counted twice."""
    with Store(tmp_path_factory.mktemp("agg") / "a.duckdb") as store:
        kept: dict[str, list[tuple[float, float]]] = {"r0": [], "r1": []}
        for replica, start, length in reports:
            interval = (float(start), float(start + length))
            mine = kept[replica]
            if any(s != interval and _shares_time(s, interval) for s in mine):
                with pytest.raises(IntervalOverlap, match=replica):
                    store.record_aggregate(replica, *interval, _AGG)
            else:
                assert store.record_aggregate(replica, *interval, _AGG) is (interval not in mine)
                if interval not in mine:
                    mine.append(interval)
        stored = store.query("SELECT replica_id, interval_start, interval_end FROM aggregates").to_pylist()
        assert sorted((r["replica_id"], r["interval_start"], r["interval_end"]) for r in stored) == sorted(
            (r, *i) for r, ivs in kept.items() for i in ivs
        )


def test_a_consistency_report_is_stored_whole_and_once(store):
    report = [check(i) for i in range(10_000)]
    assert store.record_consistency(report) == 10_000
    assert store.record_consistency(report) == 0  # the retry of a report whose answer was lost
    assert store.record_consistency([check(0), check(0), check(10_001)]) == 1  # duplicates within a report too
    broken = [check(20_000 + i) for i in range(5)] + [check(30_000, tokens=None)]
    with pytest.raises(duckdb.Error):
        store.record_consistency(broken)
    assert store.query("SELECT count(*) AS n FROM consistency_checks").column("n")[0].as_py() == 10_001


def test_a_mismatch_is_never_lost_to_an_earlier_report_of_the_same_key_that_found_none(store):
    mismatches = "SELECT request_id, mismatch_at FROM consistency_checks WHERE mismatch_at IS NOT NULL ORDER BY 1"
    first, second = check(1), check(2)
    assert store.record_consistency([first]) == 1
    assert store.record_consistency([{**first, "mismatch_at": 3, "expected": 7, "got": 8}]) == 0  # not new
    assert store.query(mismatches).to_pylist() == [{"request_id": first["request_id"], "mismatch_at": 3}]
    assert store.record_consistency([first]) == 0  # a later clean retry does not clear it
    both = [second, {**second, "mismatch_at": 1, "expected": 1, "got": 2}]  # one body, both answers
    assert store.record_consistency(both) == 1
    assert store.query(mismatches).to_pylist() == [{"request_id": first["request_id"], "mismatch_at": 3},
                                                   {"request_id": second["request_id"], "mismatch_at": 1}]  # fmt: skip


def test_a_span_with_more_reports_than_the_limit_is_refused_before_any_is_parsed(store):
    for start in range(5):
        assert store.record_aggregate("r0", float(start), float(start + 1), _AGG, received_at=float(start))
    assert [r for r, _ in store.aggregates(since=1.0, until=4.0, limit=3)] == ["r0"] * 3
    with pytest.raises(TooManyReports, match="4 aggregate reports in the span exceed the limit of 3"):
        store.aggregates(since=0.0, until=4.0, limit=3)
    assert len(store.aggregates()) == 5
