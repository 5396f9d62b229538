"""How far back the gates read (docs/design.md §6): the last few intervals, widened when labels are short.

The gates read the stage's newest ``lookback_s`` (five intervals). A calibration gate needs
``min_samples`` labels at every depth from the full-block modes, and where only a small
``observe_fraction`` is verified in full (adaptive, whose both arms serve compact windows) a small
fleet cannot collect them in five intervals: the gates stay inconclusive and the progress deadline
ends a healthy stage. So the window reaches back, one interval at a time and never before the stage
began, until the label gates' needs are met or it spans ``max_lookback_s``.

Invariants: the widened window starts no later than the plain one and no earlier than the stage's
start or ``now − max_lookback_s``; it is the plain one whenever the plain one already holds enough
labels, so a fleet with traffic to spare is judged exactly as before. Counts come from the ingest-time
sums of whole buckets inside the candidate window (never more than the window holds), so the widened
window holds at least what was counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import numpy as np

from sparkgate.collectors.label_sums import SUM_BUCKET_S
from sparkgate.collectors.store import Store
from sparkgate.policies.gate import Gate
from sparkgate.policies.vocabulary import LABEL_METRICS, REPLICA_LABEL_METRICS

from .queries import SameContract


@dataclass(frozen=True)
class LabelNeed:
    """Survival labels per depth that the stage's label gates need: the fleet's (the largest
    ``min_samples`` of the fleet-wide gates) and each replica's (of the per-replica gate)."""

    fleet: int = 0
    replica: int = 0

    @classmethod
    def of(cls, gates: Iterable[Gate]) -> LabelNeed:
        # A dry-run gate never decides, so it must not move the window the deciding gates are judged on.
        read = [g for g in gates if g.promql is None and not g.dry_run]
        return cls(
            max((g.min_samples for g in read if g.metric in LABEL_METRICS), default=0),
            max((g.min_samples for g in read if g.metric in REPLICA_LABEL_METRICS), default=0),
        )

    def __bool__(self) -> bool:
        return self.fleet > 0 or self.replica > 0


@dataclass(frozen=True)
class LabelCounts:
    """Survival labels of the full-block modes, one entry per (sum bucket, replica, depth) cell."""

    bucket: np.ndarray
    replica: np.ndarray  # an index into ``replicas``
    depth: np.ndarray
    n: np.ndarray
    replicas: tuple[str, ...]

    def met(self, since: float, need: LabelNeed, judged: tuple[str, ...]) -> bool:
        """Whether the whole buckets from ``since`` on meet ``need``: the fleet's fewest labels of any depth,
        and those of each replica in ``judged`` (replicas reporting in the plain window)."""
        keep = self.bucket >= math.ceil(since / SUM_BUCKET_S)
        if need.fleet and _fewest(self.depth[keep], self.n[keep]) < need.fleet:
            return False
        for name in judged if need.replica else ():
            mine = keep & (self.replica == self.replicas.index(name))
            if _fewest(self.depth[mine], self.n[mine]) < need.replica:
                return False
        return True

    def reporting(self, since: float) -> tuple[str, ...]:
        """Replicas with labels in the whole buckets from ``since`` on."""
        present = np.unique(self.replica[self.bucket >= math.ceil(since / SUM_BUCKET_S)])
        return tuple(self.replicas[i] for i in present)


def _fewest(depth: np.ndarray, n: np.ndarray) -> int:
    """The fewest labels of any depth present (0 with none): what a label gate's samples are."""
    totals = np.bincount(depth, weights=n)
    present = totals[totals > 0]
    return int(present.min()) if present.size else 0


def label_counts(store: Store, since: float, contract: SameContract | None) -> LabelCounts | None:
    """The survival label counts of the sums from ``since`` on (None for a store without the sums tables)."""
    where, params = "kind = 0 AND bucket >= ?", [math.ceil(since / SUM_BUCKET_S)]  # type: str, list[object]
    if contract is not None:
        where += " AND contract IS NOT DISTINCT FROM ?"
        params.append(contract.contract)
    try:
        rows = store.query(
            f"SELECT bucket, replica_id, depth, sum(n)::BIGINT AS n FROM label_group_sums WHERE {where} "
            "GROUP BY ALL HAVING sum(n) <> 0",
            params,
        )
    except duckdb.CatalogException:
        return None
    names = rows.column("replica_id").to_pylist()
    replicas = tuple(sorted(set(names)))
    code = {name: i for i, name in enumerate(replicas)}
    return LabelCounts(
        rows.column("bucket").to_numpy(),
        np.array([code[name] for name in names], dtype=np.int64),
        rows.column("depth").to_numpy().astype(np.int64),
        rows.column("n").to_numpy(),
        replicas,
    )


def widened_since(counts: LabelCounts, since: float, earliest: float, step_s: float, need: LabelNeed) -> float:
    """The newest of ``since``, ``since − step_s``, … (not before ``earliest``, which is tried last) whose
    labels meet ``need``; ``earliest`` when none does. The replicas judged are those reporting in the plain
    window: one that stopped reporting holds nothing back by its old labels' scarcity."""
    judged = counts.reporting(since)
    candidate = since
    while candidate > earliest and not counts.met(candidate, need, judged):
        candidate = max(earliest, candidate - step_s)
    return candidate


def gate_since(
    store: Store,
    *,
    entered_at: float,
    since: float,
    now: float,
    step_s: float,
    max_lookback_s: float | None,
    need: LabelNeed,
    contract: SameContract | None,
) -> float:
    """Where the gates' window starts: ``since`` (the plain lookback's start), or earlier when the stage's
    label gates need more labels than it holds (at most ``max_lookback_s`` before ``now``; None: never)."""
    if max_lookback_s is None or not need:
        return since
    earliest = max(entered_at, now - max_lookback_s)
    if earliest >= since:
        return since
    counts = label_counts(store, earliest, contract)
    return since if counts is None else widened_since(counts, since, earliest, step_s, need)
