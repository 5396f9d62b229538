"""Gate values from Prometheus (docs/design.md §7): an instant PromQL query per gate that sets ``promql``.

The value is the query's scalar, or the largest sample of an instant vector
(gates compare a worst case); ``samples`` is the number of series it came from.
An empty result has no value, so the gate is inconclusive; an unreachable server
or a query error is reported as the measurement's ``error`` and the gate stays
inconclusive too (never a pass).
"""

from __future__ import annotations

import math

import httpx

from .measurement import Measurement


class PromQLError(RuntimeError):
    """Prometheus could not answer a query; the message names the query."""


def query(base_url: str, promql: str, timeout_s: float = 5.0) -> Measurement:
    """Evaluate ``promql`` at ``base_url`` (``/api/v1/query``); raises ``PromQLError``."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/api/v1/query", params={"query": promql}, timeout=timeout_s)
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise PromQLError(f"promql {promql!r}: {exc}") from exc
    if body.get("status") != "success":
        raise PromQLError(f"promql {promql!r}: {body.get('errorType', response.status_code)}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] == "scalar":
        values = [float(data["result"][1])]
    elif data["resultType"] == "vector":
        values = [float(sample["value"][1]) for sample in data["result"]]
    else:
        raise PromQLError(f"promql {promql!r}: result type {data['resultType']!r}, expected scalar or vector")
    values = [v for v in values if math.isfinite(v)]
    return Measurement(max(values) if values else None, len(values))
