"""PromQL gate values from a loopback stand-in for Prometheus's HTTP API."""

from __future__ import annotations

import pytest

from sparkgate.controller.promql import PromQLError, query
from tests.collectors.loopback import stand_in


def test_promql_takes_the_worst_sample_of_a_vector():
    def prometheus(path, body):
        if "up" in path:
            return 200, {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [
                        {"metric": {"i": "a"}, "value": [0, "0.5"]},
                        {"metric": {"i": "b"}, "value": [0, "1.5"]},
                    ],
                },
            }
        if "scalar" in path:
            return 200, {"status": "success", "data": {"resultType": "scalar", "result": [0, "3"]}}
        return 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}

    with stand_in(prometheus) as (url, seen):
        m = query(url, "up")
        assert (m.value, m.samples) == (1.5, 2)
        assert query(url, "scalar(1)").value == 3.0
        with pytest.raises(PromQLError, match="bad_data: parse error"):
            query(url, "rate(")
        assert seen[0][0].startswith("/api/v1/query?query=up")


def vector(*values):
    return 200, {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"i": str(i)}, "value": [0, v]} for i, v in enumerate(values)],
        },
    }


def test_an_empty_or_non_finite_result_has_no_value():
    answers = {"empty": vector(), "odd": vector("NaN", "+Inf", "0.25"), "none": vector("NaN")}

    def prometheus(path, body):
        return answers[path.split("query=")[1]]

    with stand_in(prometheus) as (url, _):
        empty, odd, none = (query(url, q) for q in ("empty", "odd", "none"))
    assert (empty.value, empty.samples) == (None, 0)
    assert (odd.value, odd.samples) == (0.25, 1)  # NaN and Inf samples are dropped, never the worst case
    assert (none.value, none.samples) == (None, 0)


def test_unusable_answers_raise_naming_the_query():
    def prometheus(path, body):
        return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}

    matrix = r"promql 'up\[5m\]': result type 'matrix'"
    with stand_in(prometheus) as (url, _), pytest.raises(PromQLError, match=matrix):
        query(url, "up[5m]")
    with pytest.raises(PromQLError, match="promql 'up'"):
        query("http://127.0.0.1:9", "up", timeout_s=2.0)  # nothing listens there
