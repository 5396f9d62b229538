"""Shadow's references are read once while their labels stay, and again whenever they change."""

from __future__ import annotations

import numpy as np

from sparkgate.controller.evaluate import OptionalReads, evaluate
from sparkgate.controller.queries import Slice, Window
from sparkgate.controller.references import References, version
from sparkgate.policies.vocabulary import Phase
from tests.conftest import T0, ingest_synthetic

READS = OptionalReads(
    shadow_reference=True, per_replica=False, windowed_reference=True, windowed_replicas=False, fine_bins=True
)


def _same(a, b) -> None:
    for field in ("fine_count", "grouped_count", "grouped_sum_y", "grouped_sum_p"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))


def _tick(store, references, since):
    return evaluate(store, Window(since=since), resamples=20, references=references, **READS)


def test_a_kept_reference_is_what_a_fresh_read_gives_and_is_read_again_when_shadow_changes(store):
    ingest_synthetic(store, 40, T0, "shadow", "r0")
    ingest_synthetic(store, 40, T0 + 100, "compact", "r0", first_step=1000)
    references = References()
    first = _tick(store, references, T0 + 95)
    assert references.reads == 2  # the full-block and the windowed reference
    again = _tick(store, references, T0 + 95)
    assert references.reads == 2  # nothing in shadow changed: both kept
    _same(again.windowed_reference, first.windowed_reference)
    assert again.shadow_reference == first.shadow_reference
    # More traffic outside shadow leaves them as they were.
    ingest_synthetic(store, 20, T0 + 200, "compact", "r0", first_step=2000)
    _tick(store, references, T0 + 95)
    assert references.reads == 2
    # A late batch recorded in shadow (inside its span) changes them: read again, and equal to a fresh read.
    ingest_synthetic(store, 10, T0 + 0.05, "shadow", "r1", first_step=3000)
    kept = _tick(store, references, T0 + 95)
    assert references.reads == 4
    fresh = _tick(store, None, T0 + 95)
    _same(kept.windowed_reference, fresh.windowed_reference)
    assert kept.shadow_reference == fresh.shadow_reference
    assert kept.measurements("compact")["survival_ece_drift"] == fresh.measurements("compact")["survival_ece_drift"]


def test_retention_changes_the_version_and_a_slice_without_sums_has_none(store):
    ingest_synthetic(store, 40, T0, "shadow", "r0")
    before = version(store, Slice(), Phase.SHADOW, None)
    assert before is not None and before[0] > 0
    # Not kept per replica: a slice's version is the fleet's (a write elsewhere costs a fresh read, no error).
    assert version(store, Slice(replica_id="r9"), Phase.SHADOW, None) == before
    assert version(store, Slice(), Phase.CANARY, None) == (0, 0)
    store.delete_before(T0 + 0.2)
    assert version(store, Slice(), Phase.SHADOW, None) != before
    assert version(store, Slice(task="code"), Phase.SHADOW, None) is None  # per-request: read from rows


def test_without_a_version_nothing_is_kept():
    references = References()
    assert references.get("k", None, lambda: 1) == 1 and references.get("k", None, lambda: 2) == 2
    assert references.reads == 2 and not references.entries
    assert references.get("k", (1,), lambda: 3) == 3 and references.get("k", (1,), lambda: 4) == 3
    assert references.get("k", (2,), lambda: 5) == 5
