"""``sparkgate report`` says, per source, which gates its records can feed and why not."""

from __future__ import annotations

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.sglang import SGLangPoller
from sparkgate.controller.queries import Slice, Window
from sparkgate.controller.sources import SGLANG_CANNOT, sources
from sparkgate.policies.gate import METRICS
from tests.collectors.sglang_stand_in import Server, running
from tests.conftest import R1, R2, T0, ingest_synthetic


def test_each_source_states_the_gates_it_feeds_and_those_it_cannot(store):
    assert sources(store, Window(), Slice()) == []
    ingest_synthetic(store, 10, T0, replica="own")
    server = Server(ranks=2, rank_key=True)
    server.push(0, R1)
    server.push(1, R2)
    with running(server) as url:
        SGLangPoller(url, Ingestor(store), name="sg").poll_once()
    runtime, sglang = sources(store, Window(), Slice())
    assert (runtime["source"], runtime["steps"], runtime["replicas"], runtime["cannot_feed"]) == ("runtime", 10, 1, {})
    assert set(runtime["feeds"]) == set(METRICS)
    assert (sglang["source"], sglang["steps"], sglang["replicas"]) == ("sglang", 2, 2)
    assert set(sglang["cannot_feed"]) == set(SGLANG_CANNOT) and "tier -2" in sglang["cannot_feed"]["tier_miss_rate"]
    assert set(sglang["feeds"]) | set(sglang["cannot_feed"]) == set(METRICS)
    assert "calibrated" in sglang["feeds"]["survival_ece"]
    assert [s["source"] for s in sources(store, Window(until=T0 + 1), Slice())] == ["runtime"]
