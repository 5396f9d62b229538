"""A window's kept whole buckets slide to what a fresh read gives, and are read fresh whenever one changed."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.store import Store
from sparkgate.controller import window_cache, window_stats
from sparkgate.controller.evaluate import OptionalReads, evaluate
from sparkgate.controller.queries import Slice, Window
from tests.conftest import T0, ingest_synthetic
from tests.controller.window_fixtures import assert_same

REPLICAS = ("r0", "r1")


def _fill(store: Store, buckets: range, first_step: int = 0) -> None:
    """A batch of 12 steps in each 10 s bucket of ``buckets`` (counted from T0), replicas taking turns."""
    for i in buckets:
        ingest_synthetic(store, 12, T0 + 10 * i + 3, "compact", REPLICAS[i % 2], first_step=first_step + 100 * i)


def _read(cache, store, window, slice_=Slice(), fine_bins=True):
    got = window_cache.read(cache, store, window, slice_, windowed=True, replicas=REPLICAS, fine_bins=fine_bins)
    want = window_stats.read(store, window, slice_, windowed=True, replicas=REPLICAS, fine_bins=fine_bins)
    assert_same(got, want)
    return got


def _primed(store, window) -> window_cache.WindowCache:
    """A cache that slides whatever the move, having read ``window`` twice: the first read keeps its bounds
    alone, the second (a move of none) its statistics."""
    cache = window_cache.WindowCache(slide_share=0)
    _read(cache, store, window)
    assert (cache.fresh, cache.slid) == (1, 0) and next(iter(cache.kept.values())).stats is None
    _read(cache, store, window)
    assert (cache.fresh, cache.slid) == (2, 0) and next(iter(cache.kept.values())).stats is not None
    return cache


def test_a_slid_window_is_a_fresh_read_and_any_write_to_a_kept_bucket_reads_fresh(store):
    _fill(store, range(12))
    cache = _primed(store, Window(T0 + 5, T0 + 65))
    # New traffic, then the window one step on: the buckets that left and entered are read, the rest kept.
    _fill(store, range(12, 16), first_step=10_000)
    _read(cache, store, Window(T0 + 27, T0 + 151))
    assert (cache.fresh, cache.slid) == (2, 1)
    # A late batch into a kept bucket changes its version: read fresh.
    ingest_synthetic(store, 5, T0 + 40.5, "compact", "r1", first_step=50_000)
    _read(cache, store, Window(T0 + 29, T0 + 153))
    assert (cache.fresh, cache.slid) == (3, 1)
    # Retention rebuilds the bucket it cuts through and drops those before: read fresh.
    store.delete_before(T0 + 44)
    _read(cache, store, Window(T0 + 31, T0 + 155))
    assert (cache.fresh, cache.slid) == (4, 1)
    _read(cache, store, Window(T0 + 33, T0 + 157))
    assert (cache.fresh, cache.slid) == (4, 2)


def test_windows_that_do_not_overlap_or_slices_without_sums_are_read_fresh(store):
    _fill(store, range(10))
    cache = window_cache.WindowCache(slide_share=0)
    _read(cache, store, Window(T0, T0 + 30))
    _read(cache, store, Window(T0 + 50, T0 + 90))
    assert (cache.fresh, cache.slid) == (2, 0)
    _read(cache, store, Window(T0 + 20, T0 + 60), Slice(task="code"))  # per request: from the rows
    _read(cache, store, Window(T0 + 80, T0 + 95))  # only the settling tail: nothing to keep
    assert (cache.fresh, cache.slid) == (2, 0) and len(cache.kept) == 1


def test_an_open_window_slides_while_the_newest_buckets_are_written(store):
    # A live controller's window: open at the top, new batches landing in the newest buckets between ticks.
    _fill(store, range(10))
    cache = _primed(store, Window(since=T0 + 15))
    for tick, since in enumerate((T0 + 25, T0 + 37, T0 + 49), start=1):
        _fill(store, range(9 + tick, 10 + tick), first_step=1_000 * tick)
        # A late batch into the settling tail (the newest buckets), which no read keeps.
        ingest_synthetic(store, 3, T0 + 10 * (8 + tick) + 7, "compact", "r0", first_step=50_000 + 100 * tick)
        _read(cache, store, Window(since=since))
    assert (cache.fresh, cache.slid) == (2, 3)
    newest = store.query("SELECT max(bucket) AS b FROM bucket_writes").to_pylist()[0]["b"]
    (kept,) = cache.kept.values()
    assert kept.high == newest - window_cache.SETTLING_BUCKETS + 1 and max(kept.versions) < kept.high


def test_a_slide_that_would_move_much_of_the_window_is_a_fresh_read_keeping_bounds_alone(store):
    _fill(store, range(40))
    cache = window_cache.WindowCache()  # the live rule: moves at most 1 / SLIDE_SHARE of the window
    _read(cache, store, Window(T0 + 5, T0 + 305))  # nothing before it: window_stats.read, bounds kept
    _read(cache, store, Window(T0 + 25, T0 + 325))  # 2 buckets leave and 2 enter, of 29: statistics kept
    _read(cache, store, Window(T0 + 45, T0 + 345))
    assert (cache.fresh, cache.slid) == (2, 1)
    _read(cache, store, Window(T0 + 125, T0 + 355))  # 8 leave and 3 enter, of 22: dearer than a fresh read
    (kept,) = cache.kept.values()
    assert (cache.fresh, cache.slid) == (3, 1) and kept.stats is None
    assert (kept.low, kept.high) == (int(T0 / 10) + 13, int(T0 / 10) + 35)
    _read(cache, store, Window(T0 + 125, T0 + 365))  # 1 enters: kept again, to slide from next time
    (kept,) = cache.kept.values()
    assert (cache.fresh, cache.slid) == (4, 1) and kept.stats is not None


def test_the_cache_holds_the_newest_reads_alone_however_many_keys_it_meets(store):
    # A long-running controller meets new keys (a replica joins or leaves, the phase moves on): each read
    # keeps every replica's arrays, so only the newest KEPT_READS stay.
    _fill(store, range(12))
    cache = window_cache.WindowCache(slide_share=0)
    sets = [("r0",), ("r1",), ("r0", "r1"), ("r1", "r0")]
    for replicas in sets:
        got = window_cache.read(cache, store, Window(T0 + 5, T0 + 65), Slice(), windowed=True, replicas=replicas)
        assert_same(got, window_stats.read(store, Window(T0 + 5, T0 + 65), Slice(), windowed=True, replicas=replicas))
    assert len(cache.kept) == window_cache.KEPT_READS == 2
    assert [k[-1] for k in cache.kept] == [("r0", "r1"), ("r1", "r0")]
    # Reading a kept key again makes it the newest: the other one is dropped first.
    read_again = functools.partial(window_cache.read, cache, store, Window(T0 + 5, T0 + 65), Slice(), windowed=True)
    read_again(replicas=("r0", "r1"))
    read_again(replicas=("r0",))
    assert [k[-1] for k in cache.kept] == [("r0", "r1"), ("r0",)]


def test_an_evaluation_with_the_cache_gives_the_figures_of_one_without(store):
    _fill(store, range(10))
    cache = window_cache.WindowCache(slide_share=0)
    reads = OptionalReads(shadow_reference=False, per_replica=True, windowed_reference=False, windowed_replicas=True,
                          fine_bins=False)  # fmt: skip
    for since in (T0, T0 + 12, T0 + 25, T0 + 37):
        window = Window(since, since + 60)
        kept = evaluate(store, window, resamples=20, window_cache=cache, **reads)
        fresh = evaluate(store, window, resamples=20, **reads)
        got, want = kept.measurements("compact"), fresh.measurements("compact")
        assert got.keys() == want.keys()
        for name, m in got.items():  # equal up to the float sums' rounding
            w = want[name]
            assert (m.samples, m.error) == (w.samples, w.error), name
            for a, b in ((m.value, w.value), (m.low, w.low), (m.high, w.high)):
                assert a == b if a is None or b is None else a == pytest.approx(b, rel=1e-9, abs=1e-12), name
    assert cache.slid == 2


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with Store(Path(tmp_path_factory.mktemp("window-cache")) / "events.duckdb") as store:
        _fill(store, range(20))
        yield store


@settings(max_examples=25, deadline=None)
@given(
    moves=st.lists(st.tuples(st.floats(-40, 60), st.one_of(st.none(), st.floats(5, 150))), min_size=1, max_size=6),
    share=st.sampled_from([0, window_cache.SLIDE_SHARE]),
    fine_bins=st.booleans(),
)
def test_any_sequence_of_windows_reads_as_fresh_reads_do(shared, moves, share, fine_bins):
    store = shared
    cache, since = window_cache.WindowCache(slide_share=share), T0 + 30
    for shift, length in moves:  # a length of None: open at the top, as a live controller's window
        since += shift
        _read(cache, store, Window(since, None if length is None else since + length), fine_bins=fine_bins)
    assert cache.fresh + cache.slid <= len(moves)


def test_fine_and_equal_width_reads_of_one_window_are_kept_apart(shared):
    cache = window_cache.WindowCache(slide_share=0)
    for k, fine_bins in enumerate([True, False, True, False, False, True]):  # alternating: each key slides
        since = T0 + 30 + 10 * k
        got = _read(cache, shared, Window(since, since + 120), fine_bins=fine_bins)
        assert got.survival.fine is fine_bins
    assert cache.slid >= 2 and {key[4] for key in cache.kept} == {True, False}
