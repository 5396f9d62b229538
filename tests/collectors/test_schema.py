"""The v1 record schema: a step record survives its wire (dict) form unchanged."""

from __future__ import annotations

from sparkgate.collectors.schema import StepRecord
from tests.collectors.strategies import compact_row, static_row, step


def test_round_trip_through_the_wire_form():
    record = step(requests=[static_row(), compact_row()])
    assert StepRecord.from_dict(record.to_dict()) == record
