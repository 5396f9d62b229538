"""Prometheus metrics of ingestion: depth counters, tiers, step times, published calibration and phase."""

from __future__ import annotations

import pytest

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.schema import RequestRow
from sparkgate.collectors.wire import from_ndjson, from_records
from tests.collectors.strategies import compact_row, ndjson, step


def test_metrics_count_depths_tiers_and_times(store):
    metrics = Metrics()
    ingestor = Ingestor(store, metrics)
    rows = [compact_row(gamma=4, window=2, accepted=2), compact_row(gamma=4, window=3, accepted=1, request_id="r2")]
    ingestor.ingest(
        from_ndjson(ndjson(step(1, requests=rows), step(2, graph_hit=False, miss_reason="over_max_tier"))), "t"
    )
    value = metrics.registry.get_sample_value
    # depth 2: accepted in row 1, rejected in row 2; depth 3: censored in row 1, not at risk in row 2.
    assert value("sparkgate_depth_verified_total", {"mode": "compact", "depth": "2"}) == 2
    assert value("sparkgate_depth_accepted_total", {"mode": "compact", "depth": "2"}) == 1
    assert value("sparkgate_depth_censored_total", {"mode": "compact", "depth": "3"}) == 1
    assert value("sparkgate_depth_verified_total", {"mode": "compact", "depth": "3"}) == 0
    assert value("sparkgate_tier_hits_total", {"tier": "64"}) == 1
    assert value("sparkgate_tier_misses_total", {"reason": "over_max_tier"}) == 1
    assert value("sparkgate_step_seconds_bucket", {"le": "0.008"}) == 2
    assert value("sparkgate_step_seconds_bucket", {"le": "0.004"}) == 0
    agg = Aggregate.from_tables(*tables_of(ingestor, step(3, requests=[cap_row()])), depths=4)
    metrics.publish(agg)
    assert value("sparkgate_survival_ece", {"depth": "1"}) == agg.survival.ece()[1]
    assert value("sparkgate_upper_bound_utilization") == 0.5  # accepted 2 of the 4 the full block had
    metrics.set_phase("canary")
    assert value("sparkgate_rollout_phase", {"phase": "canary"}) == 1
    assert value("sparkgate_rollout_phase", {"phase": "shadow"}) == 0


def test_an_estimated_depth_counts_as_censored():
    """A sampled compact row past its fully accepted window: depth w+1 is unverified, its outcome unknown."""
    import dataclasses

    from sparkgate.collectors.store import Store

    metrics = Metrics()
    sampled = dataclasses.replace(compact_row(request_id="s"), temperature=0.7, next_accept_prob=0.6)
    with Store(":memory:") as store:
        prepared = Ingestor(store, metrics).ingest(from_ndjson(ndjson(step(1, requests=[sampled]))), "t").prepared
    assert "estimated" in prepared.labels.column("status").to_pylist()
    value = metrics.registry.get_sample_value
    assert value("sparkgate_depth_censored_total", {"mode": "compact", "depth": "3"}) == 1
    assert value("sparkgate_depth_verified_total", {"mode": "compact", "depth": "3"}) == 0


def cap_row():
    return RequestRow("c", "cap_accept", "chat", 0.0, None, 2, 2, 4, 2, [0.9] * 4, [0.9, 0.8, 0.7, 0.6], [1, 2, 3])


def tables_of(ingestor, record):
    prepared = ingestor.ingest(from_records([record]), "t").prepared
    return prepared.requests, prepared.labels


def test_request_latency_histograms_leave_cancelled_requests_out():
    """As the comparisons and the dashboard do: a PromQL latency gate on them read another population."""
    import json

    from sparkgate.collectors.request_ingest import prepare_requests
    from tests.conftest import T0, request_record

    lines = [request_record(request_id="ok", arm="treatment", epoch=0),
             request_record(request_id="gone", finish_reason="cancelled", first_token_ts=T0 + 9.0, finish_ts=T0 + 9.5,
                            commit_offsets_ms=[9000.0, 9500.0], arm="treatment", epoch=0)]  # fmt: skip
    prepared = prepare_requests("\n".join(map(json.dumps, lines)).encode())
    assert not prepared.quarantined
    metrics = Metrics()
    metrics.observe_requests(prepared, "t")
    value = metrics.registry.get_sample_value
    assert value("sparkgate_ingested_request_records_total") == 2  # both stored and counted
    assert value("sparkgate_request_ttft_seconds_count", {"arm": "treatment"}) == 1
    assert value("sparkgate_request_ttft_seconds_sum", {"arm": "treatment"}) == pytest.approx(0.4)
