"""``evaluate``: what an evaluation window's ``Evaluation`` is read from (docs/design.md §2, §4), and the
reads a stage's gates ask for beyond the window's own labels (``optional_reads``).

The window's labels come from the ingest-time sums (``window_stats``, through ``window_cache`` when a
controller keeps one), shadow's references are kept while shadow's sums stand (``references``), and the
step and request figures come from ``queries``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypedDict, TypeVar

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.store import Store
from sparkgate.policies.gate import Gate
from sparkgate.policies.vocabulary import Phase

from . import queries, window_stats, window_sums
from .calibration import Calibration, KindStats, bootstrap_ece
from .metrics import BOOTSTRAP_RESAMPLES, INTERVAL_LEVEL, Evaluation
from .queries import Slice, Window
from .references import References, version
from .window_cache import WindowCache
from .window_cache import read as window_cache_read
from .window_sums import SURVIVAL, WINDOWED_SURVIVAL

T = TypeVar("T")


class OptionalReads(TypedDict):
    """The reads ``evaluate`` makes only when asked: each costs more reads of the labels (shadow's, each
    replica's, the windowed kind), made only for a stage whose gates measure what it feeds."""

    shadow_reference: bool  # survival_ece_drift
    per_replica: bool  # survival_ece_debiased_replica
    windowed_reference: bool  # windowed_ece_drift (and its per-replica variant's reference)
    windowed_replicas: bool  # windowed_ece_drift_replica
    fine_bins: bool  # the report's equal-mass ECE and AUROC (no gate reads them)


def optional_reads(gates: Iterable[Gate]) -> OptionalReads:
    """``evaluate``'s keyword arguments for the optional reads that ``gates`` measure."""
    metrics = {g.metric for g in gates}
    return OptionalReads(
        shadow_reference="survival_ece_drift" in metrics,
        per_replica="survival_ece_debiased_replica" in metrics,
        windowed_reference="windowed_ece_drift" in metrics,
        windowed_replicas="windowed_ece_drift_replica" in metrics,
        fine_bins=False,
    )


def evaluate(
    store: Store,
    window: Window = Window(),
    slice_: Slice = Slice(),
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    contract: queries.SameContract | None = None,
    shadow_reference: bool = False,
    per_replica: bool = False,
    windowed_reference: bool = False,
    windowed_replicas: bool = False,
    use_sums: bool = True,
    baseline: bool = True,
    references: References | None = None,
    window_cache: WindowCache | None = None,
    fine_bins: bool = True,
) -> Evaluation:
    """Measure ``window`` and ``slice_`` of the store. The baseline is every step recorded in the
    baseline phase (same replica and load slice), whatever the window; with ``contract``, the baseline and
    the acceptance reference are that contract's only (a reference measured under another is no control).
    ``baseline`` False leaves the baseline's step buckets out (None): only the report and the baseline
    phase's own gate read them, and their cost grows with how long baseline ran. ``use_sums`` False reads
    every figure, the optional reads' too, from the rows (what the sums are checked and benchmarked
    against). ``references`` keeps shadow's references between calls (``controller.references``), and
    ``window_cache`` the window's whole buckets (``controller.window_cache``). ``fine_bins`` False reads the
    window's labels at the equal-width bins alone: every gate's measurement is the same, at a fraction of
    the sums' cells, and the report (its equal-mass ECE and AUROC) refuses such an evaluation."""
    windowed = windowed_reference or windowed_replicas
    # Each replica's labels come from the same statements as the fleet's (the sums grouped by replica too).
    judged = _judged_replicas(store, window, slice_) if per_replica or windowed_replicas else None
    if window_cache is not None and use_sums:
        stats = window_cache_read(window_cache, store, window, slice_, windowed=windowed, replicas=judged,
                                  fine_bins=fine_bins)  # fmt: skip
    else:
        stats = window_stats.read(store, window, slice_, use_sums=use_sums, windowed=windowed, replicas=judged,
                                  fine_bins=fine_bins)  # fmt: skip
    replicas = stats.by_replica or {}
    survival, conditional, compact_counts = stats.survival, stats.conditional, stats.compact_counts()
    aggregate = Aggregate(survival.calibration_stats(), conditional.calibration_stats(), **stats.hists)
    intervals = {
        name: bootstrap_ece(kind, resamples, INTERVAL_LEVEL, seed)
        for name, kind in (("survival", survival), ("conditional", conditional))
    }
    steps = baseline_steps = None
    misses: dict[str, int] = {}
    as_of = None
    by_phase = window_sums.full_accept_totals(store, slice_, (Phase.SHADOW, Phase.BASELINE), contract)
    reference = by_phase.get(Phase.SHADOW) or by_phase.get(Phase.BASELINE) or (0, 0)
    if not slice_.per_request:
        steps = queries.step_buckets(store, window, slice_)
        # Baseline's steps, read over the span it recorded in rather than the whole history.
        if baseline:
            span = window_sums.phase_span(store, (Phase.BASELINE,), contract)
            baseline_steps = queries.step_buckets(store, span, slice_, phase="baseline", contract=contract)
        misses = queries.miss_reasons(store, window, slice_)
        as_of = max(steps.column("newest").to_pylist(), default=None)
    return Evaluation(
        window,
        slice_,
        aggregate,
        survival,
        conditional,
        stats.windowed,
        compact_counts,
        intervals,
        steps,
        baseline_steps,
        misses,
        queries.consistency_counts(store, window, slice_),
        as_of,
        reference,
        stats.labels,
        stats.estimated if compact_counts["estimated"] else None,
        _shadow_reference(store, slice_, contract, resamples, seed, use_sums, references) if shadow_reference else None,
        {r: Calibration.of(kind, resamples, INTERVAL_LEVEL, seed) for r, kind in replicas[SURVIVAL].items()}
        if per_replica
        else None,
        _windowed_reference(store, slice_, contract, use_sums, references) if windowed else None,
        replicas.get(WINDOWED_SURVIVAL) if windowed_replicas else None,
        (resamples, seed),
    )


def _shadow_reference(
    store: Store,
    slice_: Slice,
    contract: queries.SameContract | None,
    resamples: int,
    seed: int,
    use_sums: bool,
    references: References | None,
) -> Calibration:
    """The calibration of every label recorded in shadow (under ``contract``): what drift is measured from."""
    span = window_sums.phase_span(store, (Phase.SHADOW,), contract)  # not the whole history, as baseline's

    def read() -> Calibration:
        survival = window_stats.survival(store, span, slice_, Phase.SHADOW, contract, use_sums=use_sums)
        return Calibration.of(survival, resamples, INTERVAL_LEVEL, seed)

    return _kept(references, ("survival", resamples, seed), store, span, slice_, contract, use_sums, read)


def _kept(references, key, store, span, slice_, contract, use_sums: bool, read: Callable[[], T]) -> T:
    """``read()``, or what ``references`` kept of it under ``key`` for this span, slice and contract while
    shadow's sums there are unchanged."""
    if references is None or not use_sums:
        return read()
    current = version(store, slice_, Phase.SHADOW, contract)
    return references.get((*key, span, slice_, contract), current, read)


def _judged_replicas(store: Store, window: Window, slice_: Slice) -> list[str]:
    """The replicas that have steps in the window, within the slice."""
    return [r for r in queries.slice_values(store, "replica", window) if slice_.replica_id in (None, r)]


def _windowed_reference(
    store: Store, slice_: Slice, contract: queries.SameContract | None, use_sums: bool, references: References | None
) -> KindStats:
    """The windowed labels recorded in shadow under ``contract`` (its rows within their suggested windows)."""
    span = window_sums.phase_span(store, (Phase.SHADOW,), contract)

    def read() -> KindStats:
        return window_stats.survival(store, span, slice_, Phase.SHADOW, contract, WINDOWED_SURVIVAL, use_sums)

    return _kept(references, ("windowed",), store, span, slice_, contract, use_sums, read)
