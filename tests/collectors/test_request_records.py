"""Request records (schema v2): every rule names its field and value; TTFT and TPOT as stored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.request_records import RequestRecord, to_table, validate
from tests.conftest import T0, request_record


def fields(obj) -> set[str]:
    return {p.field for p in validate(obj)}


def test_a_valid_record_has_no_problems_and_its_latencies():
    obj = request_record()
    assert validate(obj) == []
    record = RequestRecord(**obj)
    assert record.ttft_ms == 400.0 and record.tpot_ms == pytest.approx(100.0)  # one later token in 100 ms
    row = to_table([obj]).to_pylist()[0]
    assert (row["ttft_ms"], row["tpot_ms"]) == (400.0, pytest.approx(100.0))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"finish_reason": "stopped"}, "finish_reason"),
        ({"mode": "turbo"}, "mode"),
        ({"arm": "treatment"}, "arm"),  # an arm without its epoch
        ({"epoch": 3, "arm": "both"}, "arm"),
        ({"schema_version": 1}, "schema_version"),
        ({"prompt_tokens": -1}, "prompt_tokens"),
        ({"output_tokens": 2.5}, "output_tokens"),
        ({"arrival_ts": float("nan")}, "arrival_ts"),
        ({"finish_ts": T0 - 1}, "finish_ts"),
        ({"arrival_ts": T0 * 1000, "finish_ts": T0 * 1000}, "arrival_ts"),  # milliseconds
        ({"commit_tokens": [2]}, "commit_tokens"),  # one count for two offsets
        ({"commit_tokens": [2, 2]}, "commit_tokens"),  # sums to 4, not output_tokens 3
        ({"commit_offsets_ms": [400.0, 300.0]}, "commit_offsets_ms"),
        ({"commit_offsets_ms": [10.0, 500.0]}, "commit_offsets_ms"),  # not first_token_ts - arrival_ts
        ({"commit_offsets_ms": [400.0, 900.0]}, "commit_offsets_ms"),  # after finish_ts
        ({"first_token_ts": None}, "first_token_ts"),  # only a cancelled request may lack one
        ({"first_token_ts": T0 + 9}, "first_token_ts"),
        ({"request_id": ""}, "request_id"),
        ({"surprise": 1}, "surprise"),
        ({"phase": None}, "phase"),
    ],
)
def test_each_rule_names_its_field(changes, field):
    assert field in fields(request_record(**changes))


def test_a_request_cancelled_before_its_first_commit_is_valid_without_one():
    cancelled = request_record(finish_reason="cancelled", first_token_ts=None, output_tokens=0,
                               commit_offsets_ms=[], commit_tokens=[])  # fmt: skip
    assert validate(cancelled) == []
    assert RequestRecord(**cancelled).ttft_ms is None and RequestRecord(**cancelled).tpot_ms is None
    assert fields(["not", "an", "object"]) == {"record"}


@given(st.lists(st.tuples(st.floats(0, 50), st.integers(1, 8)), min_size=1, max_size=20))
def test_records_built_from_any_commit_timeline_are_valid(gaps):
    offsets, t = [], 100.0
    for gap, _ in gaps:
        t += gap
        offsets.append(t)
    tokens = [n for _, n in gaps]
    obj = request_record(first_token_ts=T0 + offsets[0] / 1000, finish_ts=T0 + offsets[-1] / 1000 + 0.001,
                         commit_offsets_ms=offsets, commit_tokens=tokens, output_tokens=sum(tokens))  # fmt: skip
    assert validate(obj) == []
    tpot = RequestRecord(**obj).tpot_ms
    if sum(tokens) == tokens[0]:
        assert tpot is None  # one commit: no token after the first commit's
    else:  # the time from the first commit to the last, over the tokens after the first commit's
        assert tpot == pytest.approx(sum(gap for gap, _ in gaps[1:]) / sum(tokens[1:]))
