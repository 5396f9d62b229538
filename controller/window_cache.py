"""A window's whole buckets kept between ticks, slid by what entered and left instead of read again.

A controller's window is its newest few evaluation intervals, so from one tick to the next most of its
whole sum buckets are the same. A ``WindowCache`` keeps, per read (slice, phase, contract, windowed,
fine or equal-width bins, replicas), the statistics of the buckets ``[low, high)`` it last covered, at
the width it was read at, with each bucket's version. The next read of ``[low', high')`` reads one
statement per table over the buckets that entered (weight +1) and left (−1), and adds its cells to what
it kept.

A statement's cost follows the distinct cells it returns, and those saturate over a few buckets, so a
slide pays only when the buckets it moves are a small share of the window (docs/benchmarks.md): at most
``1 / SLIDE_SHARE`` of it. A read whose move from the read before is larger (or that has none before it)
is ``window_stats.read`` itself, and keeps only its bounds, by which the next read's move is sized; a
narrow window a controller moves by a whole interval each tick therefore costs what it always did.

Only the newest ``KEPT_READS`` reads are kept: a new replica set, phase or contract is a new key, and each
kept read holds every replica's arrays.

The newest ``SETTLING_BUCKETS`` buckets with sums are still being written (a live controller's window is
open at the top: every batch lands there), so they are never kept: each read sums them afresh as the
window's tail, in the same statements as the moves, beside what it kept and the edges' rows.

Invariant: a read served from here equals ``window_stats.read`` (counts exactly, float sums up to
rounding; a cell the slide empties has its float sums set to 0, as a fresh read, which drops it, gives).
A bucket's version is its count of writes (``bucket_writes``, kept by ingest in the same transaction as
the sums, ``collectors.label_sums``): a batch, a recovery's move or retention changes it, and if any kept
bucket's version moved, or the width the window needs differs from the kept one, the read is a fresh one
(and is kept). A store without the sums or the count is read fresh.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace

import duckdb
import numpy as np

from sparkgate.collectors.store import Store

from . import window_stats, window_sums
from .calibration import KindStats
from .queries import SameContract, Slice, Window
from .window_stats import Edges
from .window_sums import Cells, WindowStats

# Buckets within this many of the newest one with sums are the tail, read every time: a replica's batches
# land within 30 s of their steps (a later one only costs a fresh read, by the versions).
SETTLING_BUCKETS = 3
# A slide moving more than 1 / this of the window's settled buckets costs about what a fresh read does: at
# one interval a tick, moves of 0.37 of the window cost 1.08x a fresh tick's CPU, of 0.21 0.90x, of 0.07
# 0.58x (docs/benchmarks.md).
SLIDE_SHARE = 4
# Reads kept at once (a tick reads one window; a kept read holds every replica's arrays: 6.6 MB at four replicas at the
# equal-width bins a tick reads, 22.6 MB at the fine bins).
KEPT_READS = 2


@dataclass
class _Kept:
    low: int
    high: int
    depths: int  # the width the statistics are at
    versions: dict[int, int]  # bucket: writes, buckets without sums left out
    stats: WindowStats | None  # the whole buckets' statistics, edges not included (None: bounds alone)


@dataclass
class WindowCache:
    """The windows read so far, one per read key; one per controller."""

    kept: dict[Hashable, _Kept] = field(default_factory=dict)
    fresh: int = 0  # reads of every whole bucket
    slid: int = 0  # reads of the buckets that entered and left
    slide_share: int = SLIDE_SHARE  # slide only when the moves are at most 1 / this of the window (0: always)


def read(
    cache: WindowCache,
    store: Store,
    window: Window,
    slice_: Slice,
    phase: str | None = None,
    contract: SameContract | None = None,
    windowed: bool = False,
    replicas: Sequence[str] | None = None,
    fine_bins: bool = True,
) -> WindowStats:
    """``window_stats.read(store, window, slice_, phase, contract, windowed=windowed, replicas=replicas,
    fine_bins=fine_bins)``, its settled whole buckets slid from what ``cache`` kept where that pays (module
    docstring)."""
    fresh = functools.partial(window_stats.read, store, window, slice_, phase, contract, windowed=windowed,
                              replicas=replicas, fine_bins=fine_bins)  # fmt: skip
    buckets = window_sums.closed_buckets(window) if window_sums.summed(slice_) else None
    if buckets is None or buckets[0] is None:
        return fresh()
    low, high = int(buckets[0]), buckets[1]
    key = (slice_, phase, contract, windowed, fine_bins, None if replicas is None else tuple(replicas))
    held = cache.kept.get(key)
    sums = functools.partial(window_sums.sums, store, replica_id=slice_.replica_id, phase=phase,
                             contract=contract, windowed=windowed, replicas=replicas, fine_bins=fine_bins)  # fmt: skip
    try:
        versions = _versions(store, min(low, held.low) if held else low)
        settled = max(versions, default=low) - SETTLING_BUCKETS + 1
        settled = settled if high is None else min(settled, high)
        if settled <= low:  # nothing settled to keep
            return fresh()
        moves = None if held is None else _moves(held, low, settled)
        if held is None or moves is None or cache.slide_share * sum(hi - lo for lo, hi, _ in moves) > settled - low:
            cache.fresh += 1
            _keep(cache, key, _Kept(low, settled, 0, {}, None))
            return fresh()
        # Slide where statistics were kept and none of their buckets moved; else read the settled part whole.
        slide = held.stats is not None and not _moved(held, versions)
        tail = [(settled, high, 1)] if high is None or settled < high else []
        body, tail_cells = _read_with_tail(sums, moves if slide else [(low, settled, 1)], tail, settled)
        edges = Edges.of(store, window, slice_, phase, contract, windowed, replicas, fine_bins)
        width = max(edges.depths, tail_cells.depths if tail_cells else 0)
        slid = _slide(held, body, width, windowed, replicas) if slide else None
        if slid is None:
            if slide or body is None:  # the slide changed the width: the settled part, whole
                body = sums([(low, settled, 1)])
            cache.fresh += 1
            depths = max(body.depths, width)
            stats = body.stats(depths, windowed, replicas)
        else:
            cache.slid += 1
            stats, depths = slid
    except (duckdb.CatalogException, duckdb.BinderException):
        return fresh()
    mine = {b: v for b, v in versions.items() if low <= b < settled}
    _keep(cache, key, _Kept(low, settled, depths, mine, stats))
    whole = stats if tail_cells is None else stats + tail_cells.stats(depths, windowed, replicas)
    return edges.added(whole, depths)


def _keep(cache: WindowCache, key: Hashable, kept: _Kept) -> None:
    """Keep ``kept`` under ``key`` as the newest, dropping the oldest past ``KEPT_READS``: a new replica set,
    phase or contract is a new key, and a long-running controller must not hold every one it met."""
    cache.kept.pop(key, None)
    cache.kept[key] = kept
    while len(cache.kept) > KEPT_READS:
        del cache.kept[next(iter(cache.kept))]


def _read_with_tail(
    sums: Callable[..., Cells], parts: list[tuple[int, int, int]], tail: list[tuple[int, int | None, int]], settled: int
) -> tuple[Cells | None, Cells | None]:
    """(the cells of ``parts``, those of ``tail``; None for no range), in one statement per table where the
    ranges lie below the tail. They do whenever a slide is taken (the kept buckets are settled ones, and
    ``settled`` only rises while their versions stand); otherwise each is read apart."""
    if tail and all(hi <= settled for _, hi, _ in parts):
        return sums([*parts, *tail], split_at=settled).split()
    return (sums(parts) if parts else None), (sums(tail) if tail else None)


def _moves(held: _Kept, low: int, high: int) -> list[tuple[int, int, int]] | None:
    """The bucket ranges that entered (sign +1) and left (−1) from ``held`` to ``[low, high)``; None where
    the windows do not overlap."""
    if low >= held.high or held.low >= high:
        return None
    return [(lo, hi, sign) for lo, hi, sign in (
        (low, min(high, held.low), 1), (max(low, held.high), high, 1),
        (held.low, min(held.high, low), -1), (max(held.low, high), held.high, -1),
    ) if lo < hi]  # fmt: skip


def _moved(held: _Kept, versions: dict[int, int]) -> bool:
    """Whether a bucket ``held`` covers was written since it was kept (one without sums then included)."""
    return any(versions.get(b, 0) != held.versions.get(b, 0) for b in range(held.low, held.high))


def _slide(
    held: _Kept, delta: Cells | None, width: int, windowed: bool, replicas: Sequence[str] | None
) -> tuple[WindowStats, int] | None:
    """(``held``'s statistics plus ``delta``'s, the cells of its moves (None for none); their width); None
    where the width the whole window needs (at least ``width``, the tail's and the edges') is not the kept
    one."""
    assert held.stats is not None, "a slide starts from kept statistics"
    if delta is None:
        stats = held.stats
    elif delta.depths > held.depths:
        return None
    else:
        stats = _settled(held.stats + delta.stats(held.depths, windowed, replicas))
    return (stats, held.depths) if max(_depth_of(stats), width) == held.depths else None


def _versions(store: Store, low: int) -> dict[int, int]:
    """Each bucket from ``low`` up with sums: its count of writes."""
    rows = store.query("SELECT bucket, writes FROM bucket_writes WHERE bucket >= ?", [low])
    return dict(zip(rows.column("bucket").to_pylist(), rows.column("writes").to_pylist()))


def _settled(stats: WindowStats) -> WindowStats:
    """``stats`` with the float sums of empty cells set to 0 (a slide leaves rounding residue there)."""
    by = stats.by_replica
    estimated = stats.estimated.copy()
    estimated[..., 1:][estimated[..., 0] == 0] = 0.0
    return replace(
        stats,
        survival=_kind_settled(stats.survival),
        conditional=_kind_settled(stats.conditional),
        windowed=None if stats.windowed is None else _kind_settled(stats.windowed),
        estimated=estimated,
        by_replica=None if by is None else {k: {r: _kind_settled(s) for r, s in of.items()} for k, of in by.items()},
    )


def _kind_settled(k: KindStats) -> KindStats:
    empty, grouped_empty = k.fine_count == 0, k.grouped_count == 0
    return replace(
        k,
        fine_sum_p=np.where(empty, 0.0, k.fine_sum_p),
        fine_sum_p2=np.where(empty, 0.0, k.fine_sum_p2),
        grouped_sum_p=np.where(grouped_empty, 0.0, k.grouped_sum_p),
    )


def _depth_of(stats: WindowStats) -> int:
    """The deepest depth any count of ``stats`` holds (what a fresh read of its cells would find; 0 for none)."""
    along = [stats.statuses.any(axis=0), stats.estimated[..., 0].any(axis=1)]
    for k in (stats.survival, stats.conditional, stats.windowed):
        if k is not None:
            along += [k.fine_count.any(axis=(0, 2, 3)), k.grouped_count.any(axis=(0, 2))]
    for h in stats.hists.values():
        along += [h.any(axis=(0, 2)), h.any(axis=(0, 1))]
    found = np.flatnonzero(np.logical_or.reduce(along))
    return int(found[-1]) if found.size else 0
