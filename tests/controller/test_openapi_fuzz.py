"""Schemathesis against the published OpenAPI spec of a live service on 127.0.0.1: no 5xx anywhere."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.controller.service import create_app
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import load_rollout_policy


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.duckdb"
    with Store(path) as store:
        metrics = Metrics()
        controller = Controller(store, load_rollout_policy(), metrics=metrics, resamples=10)
        with serve_in_thread(create_app(controller, Ingestor(store, metrics))) as url:
            yield schemathesis.openapi.from_url(f"{url}/openapi.json")


def test_no_server_errors(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:

        @given(operation.as_strategy())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz(case):
            case.call_and_validate(checks=[not_a_server_error])

        fuzz()
