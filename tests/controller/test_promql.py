"""PromQL gate values from a real Prometheus server's HTTP API (Debian's ``prometheus``, which .ci/run
installs): the replies are Prometheus's own, every result type and error included."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import httpx
import pytest

from sparkgate.controller.promql import PromQLError, query
from sparkgate.demo.fleet import answers, free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs Debian's prometheus binary (apt-get install prometheus), which .ci/run installs"
)


def _labelled(value: str, i: str) -> str:
    """A one-sample vector of ``value`` (a PromQL expression) labelled ``i``: samples of one vector."""
    return f'label_replace(vector({value}), "i", "{i}", "", "")'


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A Prometheus server with nothing to scrape: its query API evaluates expressions over no series."""
    root = tmp_path_factory.mktemp("prometheus")
    (root / "prometheus.yml").write_text("global: {evaluation_interval: 1s}\n")
    port = free_port()
    argv = [PROMETHEUS, f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not answers(f"{url}/-/ready"):
            assert server.poll() is None and time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_promql_takes_the_worst_sample_of_a_vector_for_the_gates_direction(prometheus):
    m = query(prometheus, f"{_labelled('0.5', 'a')} or {_labelled('1.5', 'b')}")
    assert (m.value, m.samples) == (1.5, 2)
    least = query(prometheus, f"{_labelled('0.5', 'a')} or {_labelled('1.5', 'b')}", direction="at_least")
    assert (least.value, least.samples) == (0.5, 2)
    assert query(prometheus, "scalar(vector(3))").value == 3.0  # a scalar result
    with pytest.raises(PromQLError, match="bad_data: .*parse error"):
        query(prometheus, "rate(")


def test_an_empty_or_nan_result_has_no_value_and_an_infinite_sample_is_the_worst_case(prometheus):
    empty = query(prometheus, "vector(1) > 2")
    mixed = " or ".join(_labelled(v, i) for v, i in (("0/0", "a"), ("1/0", "b"), ("0.25", "c")))
    none = query(prometheus, "vector(0/0)")
    assert (empty.value, empty.samples) == (None, 0)
    odd = query(prometheus, mixed)
    assert (odd.value, odd.samples) == (float("inf"), 2)  # NaN is no value; +Inf exceeds any threshold
    assert query(prometheus, mixed, direction="at_least").value == 0.25
    assert (none.value, none.samples) == (None, 0)


def test_a_query_as_of_a_past_time_is_evaluated_at_that_time(prometheus):
    """A replay (``backtest``) asks for the value its decision saw; ``time()`` is the evaluation time."""
    past = time.time() - 3600
    assert query(prometheus, "time()", at=past).value == pytest.approx(past, abs=1e-3)
    assert query(prometheus, "time()").value == pytest.approx(time.time(), abs=60)


def test_unusable_answers_raise_naming_the_query(prometheus):
    # Prometheus answers a range selector with a matrix: a gate needs one value per series.
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": "vector(1)[5m:1m]"}).json()
    assert body["data"]["resultType"] == "matrix"
    with pytest.raises(PromQLError, match=r"promql 'vector\(1\)\[5m:1m\]': result type 'matrix'"):
        query(prometheus, "vector(1)[5m:1m]")
    with pytest.raises(PromQLError, match="promql 'up'"):
        query("http://127.0.0.1:9", "up", timeout_s=2.0)  # nothing listens there


@pytest.mark.parametrize(
    "body, why",
    [
        ([], "not Prometheus's API envelope"),
        ({"status": "success"}, "not a query result (KeyError"),
        ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}, "not a query result"),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1, "x"]}}, "not a query result"),
    ],
)
def test_a_reply_that_is_not_a_query_result_raises_naming_the_query(body, why):
    """What a proxy or another server in front of Prometheus may answer with a 200 (Prometheus itself never
    does, so a stand-in serves it): it escaped as an AttributeError or KeyError and froze the rollout."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from sparkgate.collectors.ingest_api import serve_in_thread

    app = FastAPI()

    @app.get("/api/v1/query")
    def answer() -> JSONResponse:
        return JSONResponse(body)

    with serve_in_thread(app) as url, pytest.raises(PromQLError, match=rf"promql 'up': .*{re.escape(why)}"):
        query(url, "up")
