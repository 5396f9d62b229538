"""Shadow's references kept between ticks while the labels they sum stay the same.

``survival_ece_drift`` and the windowed drift gates compare the window with every label recorded in shadow
under the judged contract. Once the rollout has left shadow those labels rarely change, yet reading them
again (the fine and grouped sums over shadow's whole span, their edges' rows, a bootstrap) took about a
third of a compact tick at 10 M labels (docs/benchmarks.md). A ``References`` holds each reference with
the version of the sums it was read from, and reads it again only when that version moved.

Invariant: a reference served from here equals the one a fresh read would give. The version is the count
of the request-group sums rows of every survival kind over the span's buckets under the same phase,
contract and replica, with the sum of their labels and of their outcomes: every label a reference counts
is in one of those rows (the span's part-covered edge buckets included, whose labels the read takes from
the rows), so any label stored, recovered (censored labels become counted ones) or dropped by retention
changes it, and so does a change of the span, which is part of the key. A store without the sums, or a
slice they are not kept by, is read fresh every time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

import duckdb

from sparkgate.collectors.store import Store

from .queries import SameContract, Slice, Window
from .window_stats import SURVIVAL, WINDOWED_SURVIVAL, span_buckets, summed, sums_where

T = TypeVar("T")


def version(store: Store, span: Window, slice_: Slice, phase: str, contract: SameContract | None) -> tuple | None:
    """The version of the survival sums a reference over ``span`` reads (module docstring); None where a
    reference cannot be kept (no sums, or a slice they are not kept by)."""
    if not summed(slice_):
        return None
    where, params = sums_where(*span_buckets(span), slice_.replica_id, phase, contract)
    try:
        row = store.query(
            "SELECT count(*) AS rows, coalesce(sum(n), 0)::BIGINT AS n, coalesce(sum(sum_y), 0)::BIGINT AS y "
            f"FROM label_group_sums WHERE {where} AND kind IN ({SURVIVAL}, {WINDOWED_SURVIVAL})",
            params,
        ).to_pylist()[0]
    except duckdb.CatalogException:
        return None
    return row["rows"], row["n"], row["y"]


@dataclass
class References:
    """The references read so far, each with the version it was read at; one per controller."""

    entries: dict[Hashable, tuple[tuple, object]] = field(default_factory=dict)
    reads: int = 0  # fresh reads made (a hit makes none)

    def get(self, key: Hashable, current: tuple | None, read: Callable[[], T]) -> T:
        """The reference under ``key`` if it was read at version ``current``, else ``read()`` kept at it
        (``current`` None: read and not kept)."""
        if current is not None:
            held = self.entries.get(key)
            if held is not None and held[0] == current:
                return held[1]  # type: ignore[return-value]
        self.reads += 1
        value = read()
        if current is not None:
            self.entries[key] = (current, value)
        return value
