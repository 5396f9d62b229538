"""Gate values from Prometheus (docs/design.md §7): an instant PromQL query per gate that sets ``promql``.

The value is the query's scalar, or the worst sample of an instant vector for the
gate's direction (the largest for ``at_most``, the smallest for ``at_least``);
``samples`` is the number of series it came from. Samples are read as
Prometheus's own comparisons read them (an alerting rule ``expr > t`` fires on
+Inf, never on NaN): an infinite sample (``x/0``) is a value beyond any
threshold, and a NaN sample (``0/0``: a rate over nothing) has none and is left
out. An empty result has no value, so the gate is inconclusive; an unreachable
server or a query error is reported as the measurement's ``error`` and the gate
stays inconclusive too (never a pass).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import click
import httpx

from sparkgate.policies.gate import Gate

from .measurement import Measurement


class PromQLError(RuntimeError):
    """Prometheus could not answer a query; the message names the query."""


def require_url(gates: Iterable[Gate], url: str | None) -> None:
    """Raises ``click.BadParameter`` for ``--prometheus`` when a gate reads Prometheus and no URL is given:
    its gate would read "no data" for ever, and a critical one never fire (``serve``, ``backtest``)."""
    asking = [g.name for g in gates if g.promql]
    if asking and url is None:
        raise click.BadParameter(f"the policy's gates {', '.join(asking)} read Prometheus: give its URL",
                                 param_hint="--prometheus")  # fmt: skip


def query(
    base_url: str, promql: str, direction: str = "at_most", timeout_s: float = 5.0, at: float | None = None
) -> Measurement:
    """Evaluate ``promql`` at ``base_url`` (``/api/v1/query``) for a gate of ``direction``, as of unix time
    ``at`` (None: now; a replay asks for the time it replays); raises ``PromQLError``."""
    params: dict[str, str | float] = {"query": promql} if at is None else {"query": promql, "time": at}
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/api/v1/query", params=params, timeout=timeout_s)
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise PromQLError(f"promql {promql!r}: {exc}") from exc
    if not isinstance(body, dict):
        raise PromQLError(f"promql {promql!r}: HTTP {response.status_code}: the reply is not Prometheus's API envelope")
    if body.get("status") != "success":
        raise PromQLError(f"promql {promql!r}: {body.get('errorType', response.status_code)}: {body.get('error')}")
    try:
        values = _values(body["data"])
    except (KeyError, TypeError, IndexError, ValueError) as exc:  # a proxy's or another server's JSON
        raise PromQLError(f"promql {promql!r}: not a query result ({type(exc).__name__}: {exc})") from None
    if values is None:
        raise PromQLError(f"promql {promql!r}: result type {body['data']['resultType']!r}, expected scalar or vector")
    values = [v for v in values if not math.isnan(v)]
    worst = max if direction == "at_most" else min
    return Measurement(worst(values) if values else None, len(values))


def _values(data: dict) -> list[float] | None:
    """The samples of a scalar or instant-vector result (None: another result type); raises ``KeyError``,
    ``TypeError``, ``IndexError`` or ``ValueError`` on JSON that is not a query result."""
    if data["resultType"] == "scalar":
        return [float(data["result"][1])]
    if data["resultType"] == "vector":
        return [float(sample["value"][1]) for sample in data["result"]]
    return None
