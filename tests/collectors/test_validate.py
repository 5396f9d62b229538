"""Validation names every problem with its field and value (docs/design.md §4)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings

from sparkgate.collectors.schema import TIER_UNREPORTED, RequestRow, StepRecord
from sparkgate.collectors.validate import validate
from tests.collectors.strategies import compact_row, static_row, step, step_records


def with_row(**changes) -> StepRecord:
    return step(requests=[dataclasses.replace(static_row(), **changes)])


def fields(record: StepRecord) -> dict[str, object]:
    return {p.field: p.value for p in validate(record)}


@settings(max_examples=60, deadline=None)
@given(step_records())
def test_generated_valid_records_have_no_problems(record):
    assert validate(record) == []


@pytest.mark.parametrize(
    "record, field, value",
    [
        (with_row(mode="speculative"), "requests[0].mode", "speculative"),
        (with_row(confidence=[0.8, math.nan, 0.5, 0.4]), "requests[0].confidence[1]", math.nan),
        (with_row(confidence=[0.8, 0.5, math.inf, 0.4]), "requests[0].confidence[2]", math.inf),
        (with_row(survival=[0.8, 0.5, 0.4, -0.1]), "requests[0].survival[3]", -0.1),
        (with_row(confidence=[0.8, 1.2, 0.5, 0.4]), "requests[0].confidence[1]", 1.2),
        (with_row(survival=[0.8, 0.5, 0.6, 0.4]), "requests[0].survival[2]", 0.6),
        (with_row(confidence=[0.8, 0.5]), "requests[0].confidence", "<2 values>"),
        (with_row(survival=[0.8, 0.5, 0.4, 0.3, 0.2]), "requests[0].survival", "<5 values>"),
        (step(requests=[compact_row(window=5)]), "requests[0].window", 5),
        (step(requests=[compact_row(window=-1, accepted=-1)]), "requests[0].window", -1),
        (step(requests=[compact_row(window=2, accepted=3)]), "requests[0].accepted", 3),
        (with_row(window=3), "requests[0].window", 3),  # static must verify the full block
        (with_row(full_accept=3), "requests[0].full_accept", 3),
        (with_row(full_accept=None), "requests[0].full_accept", None),
        (step(requests=[dataclasses.replace(compact_row(), full_accept=2)]), "requests[0].full_accept", 2),
        (with_row(cap_trim=2), "requests[0].cap_trim", 2),
        (with_row(committed_tokens=[1]), "requests[0].committed_tokens", "<1 ids>"),
        (with_row(temperature=-0.5), "requests[0].temperature", -0.5),
        (with_row(request_id=""), "requests[0].request_id", ""),
        (step(schema_version=4), "schema_version", 4),
        (step(gamma=0), "gamma", 0),
        (step(step_id=-4), "step_id", -4),
        (step(ts=math.nan), "ts", math.nan),
        (step(ts=1.75e12), "ts", 1.75e12),  # milliseconds: the sums' buckets could not index it
        (step(step_ms=-1.0), "step_ms", -1.0),
        (step(step_cpu_ms=math.nan), "step_cpu_ms", math.nan),
        (step(step_cpu_ms=-2.0), "step_cpu_ms", -2.0),
        (step(replica_id=""), "replica_id", ""),
        (step(graph_hit=False), "miss_reason", None),
        (step(graph_hit=False, miss_reason="cosmic_ray"), "miss_reason", "cosmic_ray"),
        (step(miss_reason="over_max_tier"), "miss_reason", "over_max_tier"),
        (step(tier=-1), "tier", -1),  # a graph hit runs in a tier
        (step(tier=-3), "tier", -3),
        (step(graph_hit=False, miss_reason="over_max_tier", tier=-2), "tier", -2),
        (step(requests=[static_row()], batch_size=0), "batch_size", 0),
        (step(batch_size=-1), "batch_size", -1),  # in no load bucket (log2)
        (step(phase=None), "phase", None),
        (step(phase="shadw"), "phase", "shadw"),  # no read that filters on a phase would ever count it
        (step(phase="Canary"), "phase", "Canary"),
        (with_row(position=2**63 - 1), "requests[0].position", 2**63 - 1),  # recovery adds to positions
    ],
)
def test_each_rule_names_field_and_value(record, field, value):
    found = fields(record)
    assert field in found, validate(record)
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(found[field])
    else:
        assert found[field] == value


def test_a_runtime_tier_miss_is_valid():
    # The runtime records an eager step as tier -1 with the exact row count.
    assert validate(step(graph_hit=False, miss_reason="over_max_tier", tier=-1, tier_rows=600, verify_rows=600)) == []


def test_an_engine_that_does_not_report_graph_replays_marks_its_tier_unreported():
    assert validate(step(tier=TIER_UNREPORTED)) == []  # a "hit" whose replay nobody reported


def test_shadow_needs_the_suggestion_and_the_full_block():
    row = dataclasses.replace(static_row(), mode="shadow", window=2, accepted=1, full_accept=1)
    assert {"requests[0].window", "requests[0].window_suggested"} <= set(fields(step(requests=[row])))


def test_cap_accept_consistency():
    ok = RequestRow("r", "cap_accept", "chat", 0.0, None, 2, 2, 4, 2, [0.9] * 4, [0.9, 0.8, 0.7, 0.6], [1, 2, 3])
    assert validate(step(requests=[ok])) == []
    wrong_accept = dataclasses.replace(ok, full_accept=1, cap_trim=0)
    assert "requests[0].full_accept" in fields(step(requests=[wrong_accept]))
    missing = dataclasses.replace(ok, full_accept=None, cap_trim=0)
    assert "requests[0].full_accept" in fields(step(requests=[missing]))


def test_compact_full_window_is_observed_not_censored():
    full = compact_row(gamma=4, window=4, accepted=4)
    assert full.full_accept == 4 and validate(step(requests=[full])) == []
    assert "requests[0].full_accept" in fields(step(requests=[dataclasses.replace(full, full_accept=None)]))


def test_every_problem_is_returned_not_only_the_first():
    bad = dataclasses.replace(
        static_row(), mode="odd", temperature=math.nan, confidence=[2.0] * 4, survival=[0.1, 0.2, 0.3, 0.4]
    )
    found = fields(step(requests=[bad], schema_version=9, ts=-1.0))
    assert {
        "schema_version",
        "ts",
        "requests[0].mode",
        "requests[0].temperature",
        "requests[0].confidence[0]",
        "requests[0].confidence[3]",
        "requests[0].survival[1]",
        "requests[0].survival[3]",
    } <= set(found)


def test_duplicate_request_in_a_step():
    assert "requests.request_id" in fields(step(requests=[static_row(), static_row()]))


def test_messages_are_readable():
    problem = next(p for p in validate(with_row(mode="x")) if p.field == "requests[0].mode")
    assert str(problem).startswith("requests[0].mode='x': unknown mode")


@pytest.mark.parametrize("bad", ["x" * 513, "a\x00b", "tab\there", "a\u202eb", "zero\u200bwidth"])
def test_ids_are_bounded_and_show_what_they_hold(bad):
    found = fields(step(replica_id=bad))
    assert "replica_id" in found and len(found["replica_id"]) <= 100  # echoed escaped and cut, never whole
    row = dataclasses.replace(static_row(), request_id=bad)
    assert "requests[0].request_id" in fields(step(requests=[row]))


def test_ids_at_the_limit_and_in_any_script_are_fine():
    assert validate(step(replica_id="r" * 512)) == []
    assert validate(step(replica_id="réplica-東京-1")) == []
