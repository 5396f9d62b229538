"""Which collectors (record pollers) are failing now, for the controller to count as errors, not as "no data"
(docs/design.md §6).

A poller that cannot read its server leaves the store without that server's records: the gates would
read the others' records, or none, and call it inconclusive or stale. ``CollectorHealth`` keeps, per
source, the newest failure not followed by a success; the controller adds one ``error`` verdict per such
source to its interval, so a collector that stays down counts toward ``error_limit`` as a failing PromQL
query does. Thread-safe: pollers report from their thread, the controller reads from its own.
"""

from __future__ import annotations

import threading


class CollectorHealth:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[str, str] = {}

    def succeeded(self, source: str) -> None:
        with self._lock:
            self._failing.pop(source, None)

    def failed(self, source: str, error: str) -> None:
        with self._lock:
            self._failing[source] = error

    def errors(self) -> list[str]:
        """``source: error`` for every source whose newest poll failed, sorted by source."""
        with self._lock:
            return [f"{source}: {error}" for source, error in sorted(self._failing.items())]
