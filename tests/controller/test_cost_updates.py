"""The adaptive update rule over a real DuckDB file: each check of ``propose`` decides in turn."""

from __future__ import annotations

import dataclasses

import pytest

from sparkgate.collectors import cost_tables
from sparkgate.collectors.cost_tables import Source, VersionConflict
from sparkgate.controller import served_steps
from sparkgate.controller.cost_updates import Context, propose
from sparkgate.policies.adaptive import Adaptive
from sparkgate.policies.cost_fit import change
from tests.conftest import T0
from tests.controller.timed_steps import STATIC, ingest_timed, scaled

SPEC = Adaptive(min_interval_s=10.0, min_steps=100, step_time="cpu")


@pytest.fixture
def static(store):
    entry = cost_tables.static_entry(STATIC, now=T0)
    assert cost_tables.add(store, entry) and not cost_tables.add(store, entry)  # the same body again: a no-op
    return entry


def context(entry, now=T0 + 100, since=T0, current_since=T0) -> Context:
    return Context(entry, current_since, since, None, now)


def test_a_table_that_misprices_by_half_is_refitted_within_the_change_bound(store, static):
    ingest_timed(store, STATIC, scaled(STATIC, 1.6), T0 + 1)
    update = propose(store, SPEC, context(static))
    assert update.published, update.reasons
    entry = update.entry
    assert (entry.version, entry.parent, entry.source, entry.replica_group) == (
        "static-a+a1",
        "static-a",
        Source.ONLINE,
        "static-a",
    )
    assert entry.error_parent > 0.3 and entry.error_candidate < entry.error_parent - SPEC.margin
    assert entry.fitted_steps + entry.heldout_steps == 200 and entry.heldout_steps == 66
    assert T0 + 1 == entry.fitted_since < entry.fitted_until < T0 + 3  # the held-out steps come after it
    table = entry.table()
    assert change(STATIC, table, (STATIC.bs_probes, STATIC.m_probes)) <= 1 + SPEC.max_change + 1e-9
    assert table.meta.version == "static-a+a1" and table.meta.hardware == STATIC.meta.hardware
    assert update.reasons["rule"] == "beats the current table"


def test_each_check_holds_with_its_reason(store, static):
    ingest_timed(store, STATIC, scaled(STATIC, 1.6), T0 + 1, steps_per_batch=10)
    too_soon = propose(store, SPEC, context(static, now=T0 + 5, current_since=T0))
    assert not too_soon.published and too_soon.reasons["rule"] == "minimum interval"
    few = propose(store, SPEC, context(static))
    assert few.reasons == {"rule": "too few steps", "current": "static-a", "steps": 50, "min_steps": 100}


def test_a_good_table_stays_inside_the_dead_band(store, static):
    ingest_timed(store, STATIC, STATIC, T0 + 1)  # timed by the table itself: 5% noise
    update = propose(store, SPEC, context(static))
    assert update.reasons["rule"] == "within the dead band" and update.reasons["error_current"] < SPEC.dead_band


def test_a_candidate_that_does_not_beat_the_current_table_is_refused(store, static):
    # No dead band, so the rule fits; the steps are the table's own, so the candidate cannot beat it by 2 points.
    ingest_timed(store, STATIC, STATIC, T0 + 1, noise=0.3)
    update = propose(store, SPEC.model_copy(update={"dead_band": 0.0}), context(static))
    assert not update.published
    assert update.reasons["rule"] == "candidate does not beat the current table by the margin"
    assert update.reasons["error_candidate"] > update.reasons["error_current"] - SPEC.margin


def test_only_the_groups_steps_are_fitted(store, static):
    other = scaled(STATIC, 1.0, "static-b")
    cost_tables.add(store, cost_tables.static_entry(other, now=T0))
    ingest_timed(store, other, scaled(STATIC, 1.6), T0 + 1, replica="r1")
    assert served_steps.groups_with_steps(store, T0, None) == ["static-b"]
    assert propose(store, SPEC, context(static)).reasons["rule"] == "too few steps"


def test_a_version_stored_with_another_body_is_refused(store, static):
    with pytest.raises(VersionConflict, match="static-a"):
        cost_tables.add(store, cost_tables.static_entry(scaled(STATIC, 2.0), now=T0))
    with pytest.raises(ValueError, match="meta.version"):
        cost_tables.static_entry(dataclasses.replace(STATIC, meta=dataclasses.replace(STATIC.meta, version=None)))
    assert [e.version for e in cost_tables.entries(store)] == ["static-a"]


def test_only_the_newest_steps_are_read_so_a_load_change_is_fitted_at_once(store, static):
    ingest_timed(store, STATIC, STATIC, T0 + 1)  # the old load, which the static table prices well
    ingest_timed(store, STATIC, scaled(STATIC, 1.6), T0 + 10, first_step=1000)  # the new load
    whole = propose(store, SPEC.model_copy(update={"max_steps": 400}), context(static, now=T0 + 20))
    newest = propose(store, SPEC.model_copy(update={"max_steps": 200}), context(static, now=T0 + 20))
    assert newest.published and newest.entry.fitted_steps + newest.entry.heldout_steps == 200
    assert whole.reasons["fitted_steps"] + whole.reasons["heldout_steps"] == 400
    # Over both loads the fit is pulled towards the old one, and scores worse on the same held-out steps.
    assert whole.reasons["error_candidate"] > newest.reasons["error_candidate"] + 0.05
