"""Prometheus metrics named ``sparkgate_*``, fed from committed batches.

Each ``Metrics`` owns a registry (the process default only when asked), so
several stores or tests never share counters. Counting is vectorised: one
``bincount`` per batch, then one counter update per non-empty label set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.batch import Prepared, prepare
from sparkgate.collectors.labels import ACCEPTED, CENSORED, ESTIMATED, REJECTED, mode_codes
from sparkgate.collectors.request_ingest import PreparedRequests
from sparkgate.collectors.schema import MODES, STATUSES, TIER_UNREPORTED, StepRecord
from sparkgate.collectors.wire import from_records
from sparkgate.policies.vocabulary import Phase

# Steps take milliseconds; Prometheus' defaults start at 5 ms and would lump them together.
# Request latencies: 1 ms (a token's time on an accelerator) to 16 s (a first token behind a long queue).
LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(15))
STEP_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024)
_STEP_PARTS = ("draft", "schedule", "verify", "accept")


class Metrics:
    """The collector's Prometheus metrics; ``observe`` adds one committed batch."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        labels = ("mode", "depth")
        self.verified = Counter(
            "sparkgate_depth_verified_total",
            "At-risk depths that were verified (accepted or rejected).",
            labels,
            registry=r,
        )
        self.accepted = Counter("sparkgate_depth_accepted_total", "Depths accepted.", labels, registry=r)
        self.censored = Counter(
            "sparkgate_depth_censored_total",
            "Depths never verified with outcome unknown (compact; estimated ones, which carry a probability, too).",
            labels,
            registry=r,
        )
        self.tier_hits = Counter(
            "sparkgate_tier_hits_total", "Verify steps served by a captured graph tier.", ("tier",), registry=r
        )
        self.tier_misses = Counter(
            "sparkgate_tier_misses_total", "Verify steps that ran eager.", ("reason",), registry=r
        )
        self.padding_rows = Counter(
            "sparkgate_padding_rows_total", "tier_rows - verify_rows over graph hits.", registry=r
        )
        self.step_seconds = Histogram(
            "sparkgate_step_seconds", "Wall time of a verify step.", buckets=STEP_BUCKETS, registry=r
        )
        self.part_seconds = Histogram(
            "sparkgate_step_part_seconds",
            "Time of one part of a verify step.",
            ("part",),
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.steps = Counter("sparkgate_ingested_steps_total", "Step records committed.", registry=r)
        self.depth_labels = Counter("sparkgate_ingested_depth_labels_total", "Depth labels committed.", registry=r)
        self.quarantined = Counter(
            "sparkgate_quarantined_total", "Records sent to quarantine.", ("source",), registry=r
        )
        self.ece = Gauge(
            "sparkgate_survival_ece", "Survival ECE per depth (uncensored traffic).", ("depth",), registry=r
        )
        self.utilization = Gauge(
            "sparkgate_upper_bound_utilization",
            "Accepted drafts over what the full block would have accepted (NaN: not measured).",
            registry=r,
        )
        # Shadow's gate reads this one: the suggested windows' share of what the full block accepted.
        self.shadow_utilization = Gauge(
            "sparkgate_shadow_utilization",
            "Accepted drafts within the suggested windows over what the full block accepted (NaN: not measured).",
            registry=r,
        )
        self.set_utilization(None, None)  # a new gauge reads 0, the worst utilization, which nothing measured
        self._ece_depths: set[str] = set()
        self.phase = Gauge(
            "sparkgate_rollout_phase", "1 for the current rollout phase, else 0.", ("phase",), registry=r
        )
        self.request_records = Counter(
            "sparkgate_ingested_request_records_total", "Request records committed.", registry=r
        )
        self.ttft = Histogram(
            "sparkgate_request_ttft_seconds", "Time to first token of committed request records.", ("arm",),
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "sparkgate_request_tpot_seconds", "Time per output token after the first, per request record.", ("arm",),
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.writer_refusals = Counter(
            "sparkgate_writer_refusals_total",
            "Writer requests refused: no or a wrong credential, or a replica the writer may not post for.",
            ("writer", "reason"),
            registry=r,
        )

    def observe(self, prepared: Prepared, source: str) -> None:
        """Count one committed batch (its valid steps and its quarantined records)."""
        if prepared.quarantined:
            self.quarantined.labels(source).inc(len(prepared.quarantined))
        steps, labels = prepared.flat.steps, prepared.labels
        self.steps.inc(steps.num_rows)
        self.depth_labels.inc(labels.num_rows)
        if labels.num_rows:
            self._count_depths(labels)
        if steps.num_rows:
            self._count_steps(steps)

    def observe_requests(self, prepared: PreparedRequests, source: str) -> None:
        """Count committed request records and their quarantined lines; observe TTFT and TPOT by arm, of the
        requests that were not cancelled (as the comparisons and the dashboard read latency: a client who walked
        away says nothing of how fast the engine served)."""
        if prepared.quarantined:
            self.quarantined.labels(source).inc(len(prepared.quarantined))
        rows = prepared.rows
        self.request_records.inc(rows.num_rows)
        columns = (rows.column(c).to_pylist() for c in ("arm", "ttft_ms", "tpot_ms", "finish_reason"))
        for arm, ttft, tpot, reason in zip(*columns):
            if reason == "cancelled":
                continue
            label = arm or "none"
            if ttft is not None:
                self.ttft.labels(label).observe(ttft / 1000)
            if tpot is not None:
                self.tpot.labels(label).observe(tpot / 1000)

    def observe_records(self, records: Sequence[StepRecord], source: str) -> None:
        """Count step records this process produced (a replica's own ``/metrics``), as if ingested."""
        self.observe(prepare(from_records(records)), source)

    def _count_depths(self, labels) -> None:
        mode = mode_codes(labels.column("mode").cast("string"))
        depth = labels.column("depth").to_numpy().astype(np.int64)
        status = labels.column("status").combine_chunks().indices.to_numpy()
        width = int(depth.max()) + 1
        counts = np.bincount(
            (mode * width + depth) * len(STATUSES) + status, minlength=len(MODES) * width * len(STATUSES)
        ).reshape(len(MODES), width, -1)
        for m, d in zip(*np.nonzero(counts.sum(axis=2))):
            key = (MODES[m], str(d))
            row = counts[m, d]
            self.verified.labels(*key).inc(int(row[ACCEPTED] + row[REJECTED]))
            self.accepted.labels(*key).inc(int(row[ACCEPTED]))
            self.censored.labels(*key).inc(int(row[CENSORED] + row[ESTIMATED]))

    def _count_steps(self, steps) -> None:
        hit = steps.column("graph_hit").to_numpy(zero_copy_only=False)
        tier = steps.column("tier").to_numpy()
        tiers, tier_counts = np.unique(tier[hit & (tier != TIER_UNREPORTED)], return_counts=True)
        for tier, n in zip(tiers, tier_counts):
            self.tier_hits.labels(str(tier)).inc(int(n))
        reasons = steps.column("miss_reason").to_numpy(zero_copy_only=False)[~hit]
        for reason, n in zip(*np.unique(reasons.astype(str), return_counts=True)):
            self.tier_misses.labels(str(reason)).inc(int(n))
        padding = steps.column("tier_rows").to_numpy()[hit] - steps.column("verify_rows").to_numpy()[hit]
        self.padding_rows.inc(int(padding.sum()))
        for seconds in steps.column("step_ms").to_numpy() / 1000.0:
            self.step_seconds.observe(seconds)
        for part in _STEP_PARTS:
            child = self.part_seconds.labels(part)
            for seconds in steps.column(f"{part}_ms").to_numpy() / 1000.0:
                child.observe(seconds)

    def publish(self, aggregate: Aggregate | None) -> None:
        """Set the calibration and utilization gauges from an interval's (merged) aggregate; None (the
        interval could not be read) leaves none of an older window's values standing."""
        self.set_calibration({} if aggregate is None else aggregate.survival.ece())
        if aggregate is None:
            self.set_utilization(None, None)
        else:
            self.set_utilization(aggregate.upper_bound_utilization(), aggregate.shadow_utilization())

    def set_calibration(self, ece_by_depth: Mapping[int, float]) -> None:
        """Exactly these depths' ECE: a depth the window lacks loses its series, not keeps an older value."""
        depths = {str(d): v for d, v in ece_by_depth.items()}
        for stale in self._ece_depths - set(depths):
            self.ece.remove(stale)
        for depth, value in depths.items():
            self.ece.labels(depth).set(value)
        self._ece_depths = set(depths)

    def set_utilization(self, upper_bound: float | None, shadow: float | None) -> None:
        """The two utilizations the gates read (cap-accept's upper bound; shadow's), each NaN when the window
        measured none (a comparison with NaN alerts on nothing)."""
        self.utilization.set(math.nan if upper_bound is None else upper_bound)
        self.shadow_utilization.set(math.nan if shadow is None else shadow)

    def set_phase(self, current: str) -> None:
        """Mark ``current`` as the rollout phase (one-hot over every ``Phase``)."""
        if current not in set(Phase):
            raise ValueError(f"phase={current!r}: unknown; known: {[str(p) for p in Phase]}")
        for phase in Phase:
            self.phase.labels(phase).set(1.0 if phase == current else 0.0)

    def exposition(self) -> bytes:
        """The text exposition format, for a ``/metrics`` endpoint."""
        return generate_latest(self.registry)


def peak_rss_mb() -> float:
    """The peak resident memory of this process or of any child it waited for, in MiB (Linux reports KiB):
    what every benchmark's JSON reports beside its timings."""
    import resource

    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return round(peak / 1024, 1)
