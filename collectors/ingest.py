"""The one ingestion path every front end uses, and the runtime's in-process sink.

``Ingestor.ingest`` commits a parsed batch to the store and only then updates
metrics and spans, so what Prometheus shows was durably stored. ``StoreSink`` is
the callable the decode engine gets: it only enqueues, and a writer thread
commits batches, so a slow disk never stalls a verify step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from opentelemetry.trace import Tracer

from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.request_ingest import PreparedRequests
from sparkgate.collectors.schema import StepRecord
from sparkgate.collectors.store import IngestResult, Store
from sparkgate.collectors.tracing import emit_step_spans
from sparkgate.collectors.wire import Parsed, from_records

log = logging.getLogger(__name__)


class Ingestor:
    """Store plus optional metrics and tracing; thread-safe (the store serialises writes)."""

    def __init__(self, store: Store, metrics: Metrics | None = None, tracer: Tracer | None = None):
        self.store, self.metrics, self.tracer = store, metrics, tracer

    def ingest(self, parsed: Parsed, source: str, sums_before_lock: bool = False) -> IngestResult:
        """Commit ``parsed`` (see ``Store.ingest``); returns after the commit."""
        return self._observe(self.store.ingest(parsed, source, sums_before_lock))

    def ingest_stream(self, batches: Iterable[tuple[Parsed, str]]) -> Iterator[IngestResult]:
        """Commit (batch, source) pairs in order, staging the next while one commits (``Store.ingest_stream``)."""
        for result in self.store.ingest_stream(batches):
            yield self._observe(result)

    def ingest_requests(self, prepared: PreparedRequests, source: str) -> PreparedRequests:
        """Commit request records (``Store.commit_requests``); returns what was committed."""
        committed = self.store.commit_requests(prepared, source)
        if self.metrics is not None:
            self.metrics.observe_requests(committed, source)
        return committed

    def _observe(self, result: IngestResult) -> IngestResult:
        if self.metrics is not None:
            self.metrics.observe(result.prepared, result.source)
        if self.tracer is not None:
            emit_step_spans(self.tracer, result.prepared.flat)
        return result


class StoreSink:
    """``sink(record)`` for the runtime: batches ``StepRecord``s and commits them on a writer thread.

    A batch is committed when it holds ``batch_records`` records or its oldest
    record has waited ``max_delay_s``. ``flush`` blocks until everything passed in
    so far is committed; ``close`` flushes and stops the thread. A bad record is
    quarantined with the batch's commit, never failing it; a commit that fails
    (the store's own failure: a full disk, a closed store) loses its batch, and
    is logged and raised by the next ``flush``/``close``.

    At most ``max_pending`` records wait; past that ``sink(record)`` blocks until
    the writer catches up. A stalled disk thus slows the engine down instead of
    growing memory without bound, and no record handed over is dropped to make room.
    """

    def __init__(
        self,
        ingestor: Ingestor,
        batch_records: int = 256,
        max_delay_s: float = 0.5,
        source: str = "runtime",
        on_commit: Callable[[IngestResult], None] | None = None,
        max_pending: int = 65_536,
    ):
        if max_pending < batch_records:
            raise ValueError(f"max_pending={max_pending} must be >= batch_records={batch_records}")
        self._ingestor, self._batch, self._delay, self._source = ingestor, batch_records, max_delay_s, source
        self._on_commit = on_commit
        self._queue: queue.Queue[StepRecord | None] = queue.Queue(maxsize=max_pending)
        self._errors: list[BaseException] = []
        self._closed = False
        self._state = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sparkgate-sink", daemon=True)
        self._thread.start()

    def __call__(self, record: StepRecord) -> None:
        with self._state:  # no record may follow the close sentinel into the queue
            if self._closed:
                raise RuntimeError("StoreSink is closed")
            self._queue.put(record)

    def _gather(self, first: StepRecord) -> tuple[list[StepRecord], bool]:
        batch, deadline = [first], time.monotonic() + self._delay
        while len(batch) < self._batch:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                self._queue.task_done()
                return
            batch, stop = self._gather(first)
            try:
                result = self._ingestor.ingest(from_records(batch), self._source)
                if self._on_commit is not None:
                    self._on_commit(result)
            except Exception as exc:
                log.exception("sparkgate sink: commit of %d records failed", len(batch))
                self._errors.append(exc)
            for _ in range(len(batch) + stop):
                self._queue.task_done()

    def flush(self) -> None:
        """Block until every record passed in so far is committed; raise if a commit failed."""
        self._queue.join()
        if self._errors:
            errors, self._errors = self._errors, []
            raise RuntimeError(f"{len(errors)} sink commit(s) failed; first: {errors[0]!r}") from errors[0]

    def close(self) -> None:
        with self._state:
            closing, self._closed = not self._closed, True
            if closing:
                self._queue.put(None)
        if closing:
            self._thread.join()
        self.flush()

    def __enter__(self) -> StoreSink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
