"""A real Prometheus server scrapes a local fleet; a controller gate reads p99 step time through PromQL.

Debian's ``prometheus`` binary (``apt-get install prometheus``) scrapes the
controller's and two runtime replicas' ``/metrics`` on loopback. The test asks
Prometheus's HTTP API for the acceptance-rate and phase series, and checks that
the controller judged a ``promql`` gate (p99 step time over the replicas'
histograms) with a value Prometheus computed.
"""

from __future__ import annotations

import shutil
import time

import httpx
import pytest
import yaml

from sparkgate.demo.command import demo_policy
from sparkgate.demo.fleet import Fleet, answers, free_port
from sparkgate.policies.gate import Gate
from sparkgate.policies.vocabulary import LADDER

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="needs Debian's prometheus binary (apt-get install prometheus), which .ci/run installs"
)

P99_QUERY = 'histogram_quantile(0.99, sum by (le) (rate(sparkgate_step_seconds_bucket{job="replicas"}[20s])))'
ACCEPTANCE_QUERY = (
    "sum by (job) (rate(sparkgate_depth_accepted_total[20s]))"
    " / sum by (job) (rate(sparkgate_depth_verified_total[20s]))"
)
PHASE_QUERY = "sparkgate_rollout_phase == 1"
TIMEOUT_S = 240.0


def _query(prometheus: str, promql: str) -> list[dict]:
    body = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=10.0).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def _promql_verdict(controller: str) -> dict | None:
    """The newest verdict of the PromQL gate that carries a value, if any."""
    for decision in reversed(httpx.get(f"{controller}/v1/decisions", params={"limit": 1000}).json()):
        for reason in decision["reasons"]:
            if reason.get("gate") == "p99_step_seconds" and reason["value"] is not None:
                return reason
    return None


def _wait(what: str, fleet: Fleet, probe):
    deadline = time.monotonic() + TIMEOUT_S
    while (found := probe()) in (None, [], False):
        fleet.check()
        assert time.monotonic() < deadline, f"no {what} after {TIMEOUT_S:.0f} s"
        time.sleep(1.0)
    return found


def test_prometheus_scrapes_the_fleet_and_a_gate_reads_p99_through_promql(tmp_path):
    policy = demo_policy(None, quick=True)
    gate = Gate(
        metric="p99_step_seconds", threshold=1.0, direction="at_most", name="p99_step_seconds", promql=P99_QUERY
    )
    policy_file = tmp_path / "rollout.yaml"
    policy_file.write_text(
        yaml.safe_dump(policy.replace(gates=[*policy.to_dict()["gates"], gate.model_dump(mode="json")]).to_dict())
    )
    ports = {name: free_port() for name in ("controller", "prometheus", "replica-a", "replica-b")}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "controller", "static_configs": [{"targets": [f"127.0.0.1:{ports['controller']}"]}]},
            {
                "job_name": "replicas",
                "static_configs": [{"targets": [f"127.0.0.1:{ports['replica-a']}", f"127.0.0.1:{ports['replica-b']}"]}],
            },
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = f"http://127.0.0.1:{ports['prometheus']}"

    with Fleet(tmp_path / "logs") as fleet:
        fleet.spawn(
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{ports['prometheus']}",
                "--log.level=warn",
            ],
        )
        fleet.wait(lambda: answers(f"{prometheus}/-/ready"), 60.0, "prometheus to be ready", "prometheus")
        controller = fleet.controller(
            tmp_path / "fleet.duckdb", policy_file, ports["controller"], prometheus=prometheus
        )
        for i, replica_id in enumerate(("replica-a", "replica-b")):
            fleet.replica(
                replica_id, controller, rate=6.0, offset=i / 2, period_s=20.0, seed=i, metrics_port=ports[replica_id]
            )

        verdict = _wait("PromQL gate verdict with a value", fleet, lambda: _promql_verdict(controller))
        acceptance = _wait("acceptance rate of both jobs", fleet, lambda: _acceptance(prometheus))
        phases = _query(prometheus, PHASE_QUERY)
        p99 = _query(prometheus, P99_QUERY)

    assert verdict["outcome"] == "pass" and 0 < verdict["value"] <= 1.0 and verdict["samples"] == 1
    assert {r["metric"]["job"] for r in acceptance} == {"controller", "replicas"}
    assert all(0 < float(r["value"][1]) <= 1 for r in acceptance)
    served = {(r["metric"]["job"], r["metric"]["instance"]): r["metric"]["phase"] for r in phases}
    assert {job for job, _ in served} == {"controller", "replicas"} and len(served) == 3
    assert set(served.values()) <= set(LADDER) | {"fallback"}
    assert len(p99) == 1 and 0 < float(p99[0]["value"][1]) <= 1.0


def _acceptance(prometheus: str) -> list[dict] | None:
    """The acceptance-rate series, once both jobs have one with a value."""
    rows = [r for r in _query(prometheus, ACCEPTANCE_QUERY) if r["value"][1] != "NaN"]
    return rows if {r["metric"]["job"] for r in rows} == {"controller", "replicas"} else None
