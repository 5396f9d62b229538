"""The ingest-time sums (``collectors.label_sums``) of an evaluation window's whole buckets, and the
statistics they add up to.

The sums are kept per bucket of ``SUM_BUCKET_S`` seconds, replica, phase and contract. ``sums`` reads any
list of signed bucket ranges in one statement per table (a slide's moves, ``window_cache``), and
``Cells.stats`` turns the summed cells into the ``WindowStats`` that ``window_stats.read`` adds the
window's part-covered buckets to, read from the rows.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import duckdb
import numpy as np

from sparkgate.collectors.label_sums import SUM_BUCKET_S
from sparkgate.collectors.labels import ESTIMATED
from sparkgate.collectors.schema import MODES, STATUSES
from sparkgate.collectors.store import Store
from sparkgate.policies.binning import FINE_BINS, FINE_PER_BIN, N_BINS, REQUEST_GROUPS
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

from . import queries
from .calibration import KindStats
from .queries import SameContract, Slice, Window

# The statuses the compact view counts per depth.
COMPACT_COUNTS = ("recovered", "estimated", "censored")
HISTOGRAMS = ("accept_hist", "full_hist", "suggest_hist")
_FAR = 1 << 62
# The kinds of label statistics: the sums' kind codes (``collectors.label_sums``).
SURVIVAL, CONDITIONAL, WINDOWED_SURVIVAL = 0, 1, 2


@dataclass
class WindowStats:
    """A window's calibration histograms (survival, conditional, and survival over windowed labels: the
    observed ones within their row's scheduler window, ``label_sums.window_sql``), labels per status and depth
    (``[len(STATUSES), depths + 1]``, every mode), the estimated labels' bins (``[depths + 1, N_BINS, 3]``:
    count, ΣS_k, ΣP(y = 1)) and the request histograms (``[len(MODES), depths + 1, depths + 1]``)."""

    survival: KindStats
    conditional: KindStats
    windowed: KindStats | None  # None: not read (``read``'s ``windowed``)
    statuses: np.ndarray
    estimated: np.ndarray
    hists: dict[str, np.ndarray]
    # Per kind code (SURVIVAL, and WINDOWED_SURVIVAL when windowed) and replica of ``read``'s ``replicas``:
    # that replica's share of the kind, at the window's width (None: not asked).
    by_replica: dict[int, dict[str, KindStats]] | None = None

    def __add__(self, other: WindowStats) -> WindowStats:
        mine, theirs = self.by_replica, other.by_replica
        return WindowStats(
            self.survival + other.survival,
            self.conditional + other.conditional,
            None if self.windowed is None or other.windowed is None else self.windowed + other.windowed,
            self.statuses + other.statuses,
            self.estimated + other.estimated,
            {k: self.hists[k] + other.hists[k] for k in HISTOGRAMS},
            None
            if mine is None or theirs is None
            else {k: {r: s + theirs[k][r] for r, s in of.items()} for k, of in mine.items()},
        )

    @property
    def labels(self) -> int:
        return int(self.statuses.sum())

    def compact_counts(self) -> dict[str, dict[int, int]]:
        """Per status of ``COMPACT_COUNTS``: labels per depth (depths with none left out)."""
        return {
            s: {d: int(n) for d, n in enumerate(self.statuses[STATUSES.index(s)]) if d and n} for s in COMPACT_COUNTS
        }


def per_replica(kinds: Mapping[str, Sequence[KindStats | None]], windowed: bool) -> dict[int, dict[str, KindStats]]:
    """Per replica's (survival, conditional, windowed) to ``WindowStats.by_replica``."""
    out: dict[int, dict[str, KindStats]] = {SURVIVAL: {}, **({WINDOWED_SURVIVAL: {}} if windowed else {})}
    for replica, found in kinds.items():
        for code, of in out.items():
            stats = found[code]
            assert stats is not None, "the kind was computed"
            of[replica] = stats
    return out


def rows_where(cells: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    """The cells where ``mask`` holds (the mask computed once, not per column)."""
    return {k: v[mask] for k, v in cells.items()}


def summed(slice_: Slice) -> bool:
    """Whether the sums are kept by what ``slice_`` selects (not by task, temperature or load bucket)."""
    return not slice_.per_request and slice_.load_bucket is None


def closed_buckets(window: Window) -> tuple[int | None, int | None] | None:
    """The whole sum buckets ``[low, high)`` the window covers (None for an open side), or None when it
    covers none."""
    low = None if window.since is None else _clamp(math.ceil(window.since / SUM_BUCKET_S))
    high = None if window.until is None else _clamp(math.floor(window.until / SUM_BUCKET_S))
    return None if low is not None and high is not None and low >= high else (low, high)


def edge_windows(window: Window, low: int | None, high: int | None) -> list[Window]:
    """The parts of the window's first and last bucket that the whole buckets leave out."""
    edges = []
    if low is not None and window.since is not None and window.since < low * SUM_BUCKET_S:
        edges.append(Window(window.since, low * SUM_BUCKET_S))
    if high is not None and window.until is not None and high * SUM_BUCKET_S < window.until:
        edges.append(Window(high * SUM_BUCKET_S, window.until))
    return edges


def _clamp(bucket: int) -> int:
    """A bucket bound within BIGINT (a window bound far outside any step time)."""
    return max(-_FAR, min(_FAR, bucket))


@dataclass
class Cells:
    """The sums tables' rows for a bucket range, summed per cell (numpy columns by name)."""

    fine: dict[str, np.ndarray]
    grouped: dict[str, np.ndarray]
    status: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    bins: int = FINE_BINS  # the bins ``fine``'s column ``fine`` counts: FINE_BINS, or N_BINS (``sums``' fine_bins)

    @property
    def depths(self) -> int:
        found = [int(t["depth"].max(initial=0)) for t in (self.fine, self.grouped, self.status)]
        return max([*found, int(self.requests["x"].max(initial=0)), int(self.requests["y"].max(initial=0))])

    def split(self) -> tuple[Cells, Cells]:
        """(the cells below ``sums``' ``split_at``, those from it up), read with ``split_at``."""
        halves = []
        for tail in (False, True):
            tables = {}
            for name in _QUERIES:
                cells = getattr(self, name)
                tables[name] = rows_where({k: v for k, v in cells.items() if k != "tail"}, cells["tail"] == tail)
            halves.append(Cells(**tables, bins=self.bins))
        return halves[0], halves[1]

    def stats(self, depths: int, windowed: bool, replicas: Sequence[str] | None = None) -> WindowStats:
        """The statistics at ``depths``; with ``replicas`` the label cells carry column ``replica`` (``sums``),
        and the fleet's kinds are the total of every replica's, those not listed included."""
        width = depths + 1
        codes = (SURVIVAL, CONDITIONAL, WINDOWED_SURVIVAL) if windowed else (SURVIVAL, CONDITIONAL)
        by_replica = None
        if replicas is None:
            kinds = _label_kinds(self.fine, self.grouped, width, codes, self.bins)
        else:
            n = len(replicas)
            halves = zip(_split(self.fine, n), _split(self.grouped, n))
            parts = [_label_kinds(f, g, width, codes, self.bins) for f, g in halves]
            kinds = [functools.reduce(operator.add, of) for of in zip(*parts)]
            by_replica = per_replica({r: (*parts[i], None)[:3] for i, r in enumerate(replicas)}, windowed)
        s = self.status
        statuses = np.zeros((len(STATUSES), width), np.int64)
        np.add.at(statuses, (s["status"], s["depth"]), s["n"])
        estimated = np.zeros((width, N_BINS, 3))
        e = s["status"] == ESTIMATED
        for i, column in enumerate(("n", "sum_s", "sum_prob")):
            np.add.at(estimated[..., i], (s["depth"][e], s["bin"][e]), s[column][e])
        r = self.requests
        hists = {}
        for h, name in enumerate(HISTOGRAMS):
            hist = np.zeros((len(MODES), width, width), np.int64)
            keep = r["hist"] == h
            hist[r["mode"][keep], r["x"][keep], r["y"][keep]] = r["n"][keep]
            hists[name] = hist
        return WindowStats(kinds[0], kinds[1], kinds[2] if windowed else None, statuses, estimated, hists, by_replica)


def _label_kinds(fine, grouped, width: int, codes: tuple[int, ...], bins: int) -> list[KindStats]:
    """The statistics of each kind of ``codes`` from summed fine and grouped cells."""
    return [
        kind_stats(rows_where(fine, fine["kind"] == k), rows_where(grouped, grouped["kind"] == k), width, bins)
        for k in codes
    ]


def _split(cells: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    """``cells`` split by their column ``replica``: the rows of 0, 1, … n − 1 in turn, then those of every
    replica not listed (−1); one sort, not a mask per value."""
    key = np.where(cells["replica"] < 0, n, cells["replica"])
    order = np.argsort(key, kind="stable")
    bounds = np.searchsorted(key[order], np.arange(n + 2))
    return [{k: v[order[lo:hi]] for k, v in cells.items()} for lo, hi in itertools.pairwise(bounds)]


def kind_stats(f: dict[str, np.ndarray], g: dict[str, np.ndarray], width: int, bins: int = FINE_BINS) -> KindStats:
    """One kind's statistics from its fine and grouped sums (cells summed, numpy columns by name; ``bins``
    the bins that ``f``'s column ``fine`` counts)."""
    fine_index = (f["mode"], f["depth"], f["fine"], f["y"].astype(np.int64))
    group_index = (g["grp"], g["depth"], g["bin"])
    arrays = []
    for shape, index, columns in (
        ((len(MODES), width, bins, 2), fine_index, (f["n"], f["sum_p"], f["sum_p2"])),
        ((REQUEST_GROUPS, width, N_BINS), group_index, (g["n"], g["sum_p"], g["sum_y"])),
    ):
        for values in columns:
            a = np.zeros(shape, values.dtype)
            a[index] = values
            arrays.append(a)
    return KindStats(*arrays)


# Per cells name: its table, key columns, and value columns besides ``n`` with their result types.
_QUERIES = {
    "fine": ("label_fine_sums", "kind, mode, depth, fine, y", {"sum_p": "DOUBLE", "sum_p2": "DOUBLE"}),
    "grouped": ("label_group_sums", "kind, grp, depth, bin", {"sum_p": "DOUBLE", "sum_y": "BIGINT"}),
    "status": ("label_status_sums", "mode, depth, status, bin", {"sum_s": "DOUBLE", "sum_prob": "DOUBLE"}),
    "requests": ("request_sums", "mode, hist, x, y", {}),
}
# The fine sums' key with each fine bin put in its equal-width bin (``sums``' fine_bins False).
_EQUAL_WIDTH_KEYS = f"kind, mode, depth, (fine // {FINE_PER_BIN})::SMALLINT AS fine, y"


def sums(
    store: Store,
    parts: Sequence[tuple[int | None, int | None, int]],
    replica_id: str | None,
    phase: str | None,
    contract: SameContract | None,
    windowed: bool,
    replicas: Sequence[str] | None = None,
    split_at: int | None = None,
    fine_bins: bool = True,
) -> Cells:
    """The cells of every table over the buckets of ``parts``, each ``(low, high, sign)``: buckets
    ``[low, high)`` (None for an open side) weighted by ``sign`` (+1 or −1); with ``replicas``, the label
    sums' per replica as well (column ``replica``: its index in ``replicas``, −1 for any other). Cells that
    sum to no label are dropped only when every sign is +1: with −1 a cell's count may net to zero while
    its sums do not. With ``split_at`` every cell is summed apart below that bucket and from it up
    (boolean column ``tail``, ``Cells.split``): two ranges from one statement per table. With ``fine_bins``
    False the fine sums are summed per equal-width bin instead: what every gate reads, in a statement
    grouping a few thousand cells where the fine bins group about as many as the window has labels at a
    busy fleet's rate (docs/benchmarks.md)."""
    if not parts:
        raise ValueError("sums needs at least one bucket range")
    where, params = sums_where(None, None, replica_id, phase, contract)
    ranges = []
    for low, high, _ in parts:
        clauses = [c for c, v in (("bucket >= ?", low), ("bucket < ?", high)) if v is not None]
        ranges.append("(" + " AND ".join(clauses or ["TRUE"]) + ")")
        params += [v for v in (low, high) if v is not None]
    where += " AND (" + " OR ".join(ranges) + ")"
    # Bounds the scan can prune row groups by (it does not prune by a disjunction), each side its own.
    lows, highs = [lo for lo, _, _ in parts if lo is not None], [hi for _, hi, _ in parts if hi is not None]
    if len(parts) > 1 and len(lows) == len(parts):
        where += f" AND bucket >= {int(min(lows))}"
    if len(parts) > 1 and len(highs) == len(parts):
        where += f" AND bucket < {int(max(highs))}"
    signed = [(low, high) for low, high, sign in parts if sign < 0]
    weight = "1"
    if signed:
        minus = " OR ".join(f"(bucket >= {int(lo)} AND bucket < {int(hi)})" for lo, hi in signed)  # type: ignore[arg-type]
        weight = f"(CASE WHEN {minus} THEN -1 ELSE 1 END)"
    kinds = "" if windowed else f" AND kind < {WINDOWED_SURVIVAL}"  # the label sums' kinds; the others have none
    tail = "" if split_at is None else f"(bucket >= {int(split_at)}) AS tail, "
    cells = {}
    for name in _QUERIES:
        keys = _EQUAL_WIDTH_KEYS if name == "fine" and not fine_bins else None
        if name not in ("fine", "grouped"):
            cells[name] = summed_cells(store, name, where, params, weight, tail)
        elif replicas is None:
            cells[name] = summed_cells(store, name, where + kinds, params, weight, tail, keys)
        else:
            by = tail + "(coalesce(list_position(?::VARCHAR[], replica_id), 0) - 1)::INTEGER AS replica, "
            cells[name] = summed_cells(store, name, where + kinds, [list(replicas), *params], weight, by, keys)
    return Cells(**cells, bins=FINE_BINS if fine_bins else N_BINS)


def summed_cells(
    store: Store, name: str, where: str, params: list, weight: str, by: str = "", keys: str | None = None
) -> dict[str, np.ndarray]:
    """One sums table's rows under ``where``, each times ``weight``, summed per cell (and per ``by``, key
    columns put first; ``keys`` in place of the table's own), as numpy columns by name."""
    table, own, values = _QUERIES[name]
    keys = keys or own
    sums = "".join(f", sum({v} * {weight})::{t} AS {v}" for v, t in values.items())
    having = " HAVING sum(n) <> 0" if weight == "1" else ""
    rows = store.query(
        f"SELECT {by}{keys}, sum(n * {weight})::BIGINT AS n{sums} FROM {table} WHERE {where} GROUP BY ALL{having}",
        params,
    )
    return {c: rows.column(c).to_numpy(zero_copy_only=False) for c in rows.column_names}


def sums_where(low, high, replica_id, phase, contract) -> tuple[str, list]:
    clauses, params = ["TRUE"], []
    for clause, value in (("bucket >= ?", low), ("bucket < ?", high), ("replica_id = ?", replica_id),
                          ("phase = ?", phase)):  # fmt: skip
        if value is not None:
            clauses.append(clause)
            params.append(value)
    if contract is not None:
        clauses.append("contract IS NOT DISTINCT FROM ?")
        params.append(contract.contract)
    return " AND ".join(clauses), params


def phase_span(store: Store, phases: tuple[str, ...], contract: SameContract | None = None) -> Window:
    """The step time that the steps recorded in ``phases`` (under ``contract``) span, as a window over which a
    reference phase is read instead of the whole history (``Window()``: the store does not say, or none)."""
    marks = ", ".join("?" * len(phases))
    clause, params = contract.sql("p") if contract is not None else ("", [])
    try:
        row = store.query(
            f"SELECT min(first_ts) AS lo, max(last_ts) AS hi FROM phase_spans p WHERE phase IN ({marks}){clause}",
            [*phases, *params],
        ).to_pylist()[0]
    except duckdb.CatalogException:
        return Window()
    return Window() if row["lo"] is None else Window(row["lo"], row["hi"] + 1e-3)


def span_buckets(span: Window) -> tuple[int | None, int | None]:
    """The sum buckets ``[low, high)`` that hold every step of ``span``, its part-covered ends included
    (None for an open side)."""
    low = None if span.since is None else _clamp(math.floor(span.since / SUM_BUCKET_S))
    high = None if span.until is None else _clamp(math.floor(span.until / SUM_BUCKET_S) + 1)
    return low, high


def full_accept_totals(
    store: Store, slice_: Slice, phases: tuple[str, ...], contract: SameContract | None = None
) -> dict[str, tuple[int, int]]:
    """Per phase of ``phases`` with any: (sum of a*, rows) over every full-block request row recorded in it
    (the acceptance reference), read over the phases' span; ``contract`` restricts to one contract's steps."""
    if slice_.per_request or slice_.load_bucket is not None:
        return queries.full_accept_totals(store, Window(), slice_, phases, contract)
    where, params = sums_where(*span_buckets(phase_span(store, phases, contract)), slice_.replica_id, None, contract)
    modes = ", ".join(str(MODES.index(m)) for m in FULL_BLOCK_MODES)
    marks = ", ".join("?" * len(phases))
    try:
        rows = store.query(
            f"SELECT phase, sum(n * y)::BIGINT AS total, sum(n)::BIGINT AS n FROM request_sums "
            f"WHERE {where} AND hist = 1 AND mode IN ({modes}) AND phase IN ({marks}) GROUP BY phase HAVING sum(n) > 0",
            [*params, *phases],
        ).to_pylist()
    except duckdb.CatalogException:
        return queries.full_accept_totals(store, Window(), slice_, phases, contract)
    return {r["phase"]: (int(r["total"]), int(r["n"])) for r in rows}
