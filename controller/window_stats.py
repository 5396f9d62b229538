"""What an evaluation window's labels and request rows sum to, read from the ingest-time sums
(``collectors.label_sums``, read by ``window_sums``) where they cover the window, and from the rows
themselves elsewhere.

The sums are kept per bucket of ``SUM_BUCKET_S`` seconds, so a window ``[since, until)`` reads its whole
buckets from the sums and only the parts of its first and last bucket from the rows: the figures are
those of a scan of every row in the window (counts exactly, float sums up to rounding), at a cost set by
the window's length and the number of distinct cells, not by the rows stored or their rate. A slice by
task, temperature or load bucket reads the rows (the sums are not kept per slice), and so does a store
without the sums tables (a snapshot published before they existed).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import duckdb
import numpy as np

from sparkgate.collectors.labels import ACCEPTED, CENSORED, ESTIMATED, REJECTED
from sparkgate.collectors.schema import STATUSES
from sparkgate.collectors.store import Store

from . import queries
from .calibration import WINDOWED, KindStats
from .queries import SameContract, Slice, Window
from .window_sums import (
    SURVIVAL,
    WINDOWED_SURVIVAL,
    WindowStats,
    closed_buckets,
    edge_windows,
    kind_stats,
    per_replica,
    summed,
    summed_cells,
    sums,
    sums_where,
)

CHUNK_ROWS = 1 << 20


def read(
    store: Store,
    window: Window,
    slice_: Slice,
    phase: str | None = None,
    contract: SameContract | None = None,
    use_sums: bool = True,
    windowed: bool = False,
    replicas: Sequence[str] | None = None,
    fine_bins: bool = True,
) -> WindowStats:
    """The window's statistics; ``phase`` (with ``contract``) keeps the steps recorded in that phase.
    ``use_sums`` False reads the rows alone (what the sums are checked and benchmarked against). The
    windowed labels are read only with ``windowed``: they cost a third more sums and a join of the edges'
    labels to their request rows, for the windowed gates alone. With ``replicas``, ``by_replica`` holds
    each one's survival (and windowed) labels, equal to ``read`` with the slice narrowed to it up to empty
    trailing depths, from the same statements: the label sums grouped by replica as well, the fleet's
    figures their total. With ``fine_bins`` False the label statistics hold the equal-width bins alone
    (``KindStats.coarse``): every gate's figure, not the report's equal-mass ECE and AUROC."""
    rows = functools.partial(_from_rows, store, window, slice_, phase, contract, None, windowed=windowed,
                             replicas=replicas, fine_bins=fine_bins)  # fmt: skip
    buckets = closed_buckets(window) if use_sums and summed(slice_) else None
    if buckets is None:
        return rows()
    low, high = buckets
    try:
        cells = sums(store, [(low, high, 1)], slice_.replica_id, phase, contract, windowed, replicas, None, fine_bins)
    except duckdb.CatalogException:
        return rows()
    edges = Edges.of(store, window, slice_, phase, contract, windowed, replicas, fine_bins)
    depths = max(cells.depths, edges.depths)
    return edges.added(cells.stats(depths, windowed, replicas), depths)


@dataclass
class Edges:
    """The rows of the parts of a window's first and last bucket that its whole buckets leave out."""

    windows: list[Window]
    columns: list[queries.LabelColumns]
    read: Callable[[Window, int, queries.LabelColumns], WindowStats]

    @classmethod
    def of(cls, store, window, slice_, phase, contract, windowed: bool, replicas, fine_bins: bool = True) -> Edges:
        windows = edge_windows(window, *closed_buckets(window))  # type: ignore[misc]
        columns = [queries.label_columns(store, w, slice_, phase, contract, windowed, replicas or ()) for w in windows]

        def read(w: Window, depths: int, c: queries.LabelColumns) -> WindowStats:
            return _from_rows(store, w, slice_, phase, contract, depths, c, windowed, replicas, fine_bins)

        return cls(windows, columns, read)

    @property
    def depths(self) -> int:
        """The deepest label or request histogram the edges hold (at least 1)."""
        return max([*(c.depths for c in self.columns), 1])

    def added(self, closed: WindowStats, depths: int) -> WindowStats:
        """``closed`` (the whole buckets' statistics at ``depths``) plus the edges'."""
        for w, c in zip(self.windows, self.columns):
            closed = closed + self.read(w, depths, c)
        return closed


def survival(
    store: Store,
    window: Window,
    slice_: Slice,
    phase: str | None = None,
    contract: SameContract | None = None,
    kind: int = SURVIVAL,
    use_sums: bool = True,
) -> KindStats:
    """``read(...).survival`` (``kind`` ``WINDOWED_SURVIVAL``: ``.windowed``), up to empty trailing depths,
    from that kind's sums alone: two statements instead of four, for a reader that needs no other figure
    (the shadow references)."""
    windowed = kind == WINDOWED_SURVIVAL
    cells = _survival_cells(store, window, slice_, phase, contract, kind) if use_sums else None
    if cells is None:
        return _of_kind(read(store, window, slice_, phase, contract, use_sums, windowed), kind)
    fine, grouped, edges = cells
    columns = [queries.label_columns(store, w, slice_, phase, contract, windowed) for w in edges]
    return _survival_of(fine, grouped, columns, kind)


def _of_kind(stats: WindowStats, kind: int) -> KindStats:
    if kind != WINDOWED_SURVIVAL:
        return stats.survival
    assert stats.windowed is not None, "read with windowed"
    return stats.windowed


def _survival_cells(store, window, slice_, phase, contract, kind: int):
    """(fine cells, grouped cells, edge windows) of the window's survival sums of ``kind``; None where
    ``read`` would read rows."""
    buckets = closed_buckets(window) if summed(slice_) else None
    if buckets is None:
        return None
    where, params = sums_where(*buckets, slice_.replica_id, phase, contract)
    where += f" AND kind = {int(kind)}"
    try:
        fine, grouped = (summed_cells(store, name, where, params, "1") for name in ("fine", "grouped"))
    except duckdb.CatalogException:
        return None
    return fine, grouped, edge_windows(window, *buckets)


def _survival_of(fine, grouped, columns: list[queries.LabelColumns], kind: int) -> KindStats:
    """Survival statistics of ``kind`` from its summed cells plus the edges' rows."""
    windowed = kind == WINDOWED_SURVIVAL
    depths = max([int(fine["depth"].max(initial=0)), int(grouped["depth"].max(initial=0)),
                  *(c.depths for c in columns), 1])  # fmt: skip
    stats = kind_stats(fine, grouped, depths + 1)
    for c in columns:
        found = _kinds(c, depths, windowed)[kind]
        assert found is not None, "the kind was computed"
        stats = stats + found
    return stats


def _from_rows(
    store, window, slice_, phase, contract, depths, cols=None, windowed: bool = False, replicas=None, fine_bins=True
) -> WindowStats:
    """The statistics of the window's rows themselves (``depths`` None: as many as they have)."""
    if cols is None:
        cols = queries.label_columns(store, window, slice_, phase, contract, windowed, replicas or ())
    depths = depths or max(cols.depths, 1)
    survival, conditional, in_window, statuses = _kinds(cols, depths, windowed, fine_bins)
    hists = queries.request_histograms(store, window, slice_, depths + 1, phase, contract)
    estimated = queries.estimated_bins(store, window, slice_, depths, phase, contract)
    by_replica = None
    if replicas is not None:
        mine = {
            r: _kinds(cols.select(cols.replica == i), depths, windowed, fine_bins)[:3] for i, r in enumerate(replicas)
        }
        by_replica = per_replica(mine, windowed)
    return WindowStats(survival, conditional, in_window, statuses, estimated, hists, by_replica)


def _kinds(
    cols: queries.LabelColumns, depths: int, windowed: bool, fine_bins: bool = True
) -> tuple[KindStats, KindStats, KindStats | None, np.ndarray]:
    """(survival over observed and recovered labels, conditional over observed labels at risk, survival over
    windowed labels (None without ``windowed``), labels per status and depth), indexed by the sums' kind
    codes, over the fine bins or (``fine_bins`` False) the equal-width ones; a chunk of rows at a time: the
    temporaries of a chunk are reused from the heap, where those of the whole window would be fresh pages
    every time."""
    kinds: list[KindStats] = []
    statuses = np.zeros((len(STATUSES), depths + 1), np.int64)
    for start in range(0, max(len(cols), 1), CHUNK_ROWS):
        chunk = cols.rows(start, start + CHUNK_ROWS)
        observed = (chunk.status != CENSORED) & (chunk.status != ESTIMATED)
        # A recovered label does not record whether its depth was at risk: the conditional view is observed only.
        at_risk = (chunk.status == ACCEPTED) | (chunk.status == REJECTED)
        y = chunk.y.astype(bool)
        rows = (chunk.mode, chunk.depth)
        found = [
            KindStats.from_rows(*rows, chunk.survival, y, chunk.group, depths, observed),
            KindStats.from_rows(*rows, chunk.confidence, y, chunk.group, depths, at_risk),
        ]
        if windowed:
            in_window = observed & chunk.in_window
            found.append(KindStats.from_rows(*rows, chunk.survival, y, chunk.group, depths, in_window, WINDOWED))
        kinds = found if not kinds else [a + b for a, b in zip(kinds, found)]
        np.add.at(statuses, (chunk.status.astype(np.int64), chunk.depth.astype(np.int64)), 1)
    # The loop runs at least once.
    if not fine_bins:
        kinds = [k.coarse() for k in kinds]
    return kinds[0], kinds[1], kinds[2] if windowed else None, statuses
