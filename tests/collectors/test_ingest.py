"""The in-process sink: batched commits, flush, and backpressure instead of growth or loss."""

from __future__ import annotations

import threading

import pytest

from sparkgate.collectors.ingest import Ingestor, StoreSink
from tests.collectors.strategies import compact_row, step


def test_sink_commits_batches_and_flush_waits(ingestor, store):
    commits = []
    with StoreSink(ingestor, batch_records=4, max_delay_s=0.05, on_commit=commits.append) as sink:
        for i in range(10):
            sink(step(i, requests=[compact_row(request_id=f"r{i}")]))
        sink.flush()
        assert store.counts()["steps"] == 10
    assert sum(c.steps for c in commits) == 10 and max(c.steps for c in commits) <= 4


def test_sink_applies_backpressure_instead_of_growing_or_dropping(store):
    release = threading.Event()

    class StalledDisk(Ingestor):
        def ingest(self, parsed, source):
            release.wait(timeout=30)
            return super().ingest(parsed, source)

    with StoreSink(StalledDisk(store), batch_records=2, max_delay_s=0.01, max_pending=4) as sink:
        producer = threading.Thread(
            target=lambda: [sink(step(i, requests=[compact_row(request_id=f"r{i}")])) for i in range(12)]
        )
        producer.start()
        producer.join(timeout=0.5)
        assert producer.is_alive()  # blocked: the writer holds one batch, the queue is full
        release.set()
        producer.join(timeout=30)
        assert not producer.is_alive()
        sink.flush()
    assert store.counts()["steps"] == 12
    with pytest.raises(ValueError, match="max_pending=1 must be >= batch_records=2"):
        StoreSink(Ingestor(store), batch_records=2, max_pending=1)
