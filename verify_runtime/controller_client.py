"""The few controller routes a replica uses (docs/design.md §6, §7), signed with its writer token; the client that
counts what it posts into the replica's own series, and the wait for a controller that starts after its fleet."""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any

import click
import httpx

from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.request_records import RequestRecord
from sparkgate.collectors.schema import StepRecord
from sparkgate.policies.cost_model import CostTable
from sparkgate.policies.payload import WRITER_TOKEN_ENV, PolicyPayload

from .spool import ndjson

log = logging.getLogger(__name__)
REQUEST_RECORDS_ROUTE = "/v1/request-records"


class ControllerClient:
    """The few controller routes a replica uses."""

    def __init__(self, url: str, timeout_s: float = 30.0, writer_token: str | None = None):
        """``writer_token`` (default: env ``SPARKGATE_WRITER_TOKEN``) signs what it posts."""
        self.url = url.rstrip("/")
        token = os.environ.get(WRITER_TOKEN_ENV) if writer_token is None else writer_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, timeout=timeout_s, headers=headers)

    def close(self) -> None:
        self.http.close()

    def _json(self, response: httpx.Response) -> Any:
        response.raise_for_status()
        return response.json()

    def policy(self) -> PolicyPayload:
        """The served policy, validated: a payload this replica cannot follow raises, naming the field."""
        return PolicyPayload.model_validate(self._json(self.http.get("/v1/policy")))

    def next_step_id(self, replica_id: str) -> int:
        return self._json(self.http.get(f"/v1/replicas/{_segment(replica_id)}"))["next_step_id"]

    def post_records(self, records: Sequence[StepRecord], body: bytes | None = None) -> dict:
        """Post records as NDJSON (``body``: theirs, already serialized). A 422 (some records quarantined, the
        rest stored) is not retried."""
        return self.post_body(ndjson(records) if body is None else body)

    def post_request_records(self, records: Sequence[RequestRecord], body: bytes | None = None) -> dict:
        return self.post_body(ndjson(records) if body is None else body, REQUEST_RECORDS_ROUTE)

    def post_body(self, body: bytes, route: str = "/v1/records") -> dict:
        """Post an NDJSON body of step records (a spool segment, or ``post_records``'s), or of request records
        to ``/v1/request-records``."""
        response = self.http.post(route, content=body, headers={"content-type": "application/x-ndjson"})
        if response.status_code == 422:
            log.warning("controller quarantined records: %s", response.text[:500])
            return response.json()
        return self._json(response)

    def cost_table(self, version: str) -> Any:
        """A stored cost table's JSON (``GET /v1/cost-tables/{version}``)."""
        return self._json(self.http.get(f"/v1/cost-tables/{version}"))

    def register_table(self, replica_id: str, table: CostTable) -> dict:
        """Register the static table this replica starts from, so the controller can fit its group's."""
        body = {"replica_id": replica_id, "table": table.to_json_dict()}
        return self._json(self.http.post("/v1/cost-tables", json=body))

    def committed(self, request_id: str, replica_id: str) -> list[int] | None:
        response = self.http.get(f"/v1/requests/{_segment(request_id)}/committed", params={"replica_id": replica_id})
        return None if response.status_code == 404 else self._json(response)["tokens"]

    def post_checks(self, replica_id: str, checks: list[dict]) -> dict:
        return self._json(self.http.post("/v1/consistency", json={"replica_id": replica_id, "checks": checks}))


def _segment(key: str) -> str:
    """An id as one URL path segment: ``?``, ``#`` and ``/`` in it would otherwise end the path there."""
    return urllib.parse.quote(key, safe="")


class MeteredClient(ControllerClient):
    """Counts what it posted into this replica's Prometheus series."""

    def __init__(self, url: str, metrics: Metrics):
        super().__init__(url)
        self.metrics = metrics

    def post_records(self, records: Sequence[StepRecord], body: bytes | None = None) -> dict:
        result = super().post_records(records, body)
        self.metrics.observe_records(records, "replica")
        return result


def wait_for_policy(client: ControllerClient, wait_s: float) -> PolicyPayload:
    """The controller's policy, retrying for ``wait_s`` seconds (a fleet may start before its controller)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return client.policy()
        except httpx.HTTPError as exc:
            if time.monotonic() >= deadline:
                raise click.ClickException(f"controller {client.url} unreachable: {exc}") from None
            time.sleep(0.5)
