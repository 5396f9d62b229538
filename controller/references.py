"""Shadow's references kept between ticks while the labels they sum stay the same.

``survival_ece_drift`` and the windowed drift gates compare the window with every label recorded in shadow
under the judged contract. Once the rollout has left shadow those labels rarely change, yet reading them
again (the fine and grouped sums over shadow's whole span, their edges' rows, a bootstrap) took about a
third of a compact tick at 10 M labels (docs/benchmarks.md). A ``References`` holds each reference with
the version of the sums it was read from, and reads it again only when that version moved.

Invariant: a reference served from here equals the one a fresh read would give. The version is the count
of writes of the sums of the reference's phase and contract (``phase_spans.writes``, kept by ingest in the
same transaction as the sums, ``collectors.label_sums``): any label stored under them, recovered
(censored labels become counted ones) or dropped by retention changes it, and so does a change of the
span, which is part of the key. It is read from one row per contract, so checking it costs the same
whatever the span's length; it ignores the slice's replica, so a write under another replica only costs
a fresh read. A store without the sums or the count, or a slice the sums are not kept by, is read fresh
every time.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

import duckdb

from sparkgate.collectors.store import Store

from .queries import SameContract, Slice
from .window_sums import summed

T = TypeVar("T")


def version(store: Store, slice_: Slice, phase: str, contract: SameContract | None) -> tuple | None:
    """The version of the sums a reference of ``phase`` reads (module docstring); None where a
    reference cannot be kept (no sums, or a slice they are not kept by)."""
    if not summed(slice_):
        return None
    clause, params = contract.sql("p") if contract is not None else ("", [])
    try:
        row = store.query(
            f"SELECT count(*) AS contracts, coalesce(sum(writes), 0)::BIGINT AS writes FROM phase_spans p "
            f"WHERE phase = ?{clause}",
            [phase, *params],
        ).to_pylist()[0]
    except (duckdb.CatalogException, duckdb.BinderException):
        return None
    return row["contracts"], row["writes"]


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
