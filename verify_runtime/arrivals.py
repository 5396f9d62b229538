"""Open-loop request arrivals for ``sparkgate replica --rate``: a Poisson process whose rate swings.

Requests arrive as a Poisson process whose rate swings around a mean with a
period (replicas are offset along the cycle), so batch sizes, and with them the
load buckets the latency gates compare, change over time. Arrivals beyond the
running batch wait; past ``BACKLOG`` they are shed (counted), so an overloaded
machine slows a run, never wedges it.
"""

from __future__ import annotations

import collections
import math
import random
import time
from collections.abc import Callable, Iterator

from .engine import Request

# Waiting requests kept beyond the running batch before new arrivals are shed.
BACKLOG = 64


def swing(mean: float, amplitude: float, period_s: float, offset: float) -> Callable[[float], float]:
    """Requests per second at ``t`` seconds: ``mean`` swinging by ``amplitude`` (a fraction of it)."""
    if mean <= 0 or not 0 <= amplitude < 1 or period_s <= 0:
        raise ValueError(f"need rate > 0, 0 <= amplitude < 1, period > 0; got {mean}, {amplitude}, {period_s}")
    return lambda t: mean * (1 + amplitude * math.sin(2 * math.pi * (t / period_s + offset)))


class Arrivals:
    """The requests that have arrived by now, for ``Replica.serve``.

    ``next()`` hands out the oldest waiting request, or raises StopIteration when
    none is waiting: ``serve`` then steps the batch it has and asks again at the
    next step, which is exactly continuous batching under open-loop arrivals.
    """

    def __init__(
        self,
        source: Iterator[Request],
        rate: Callable[[float], float],
        clock: Callable[[], float],
        seed: int = 0,
        backlog: int = BACKLOG,
    ):
        self.source, self.rate, self.clock, self.backlog = source, rate, clock, backlog
        self.rng = random.Random(seed)
        self.start = clock()
        self.next_at = self.start + self._gap(self.start)
        self.waiting: collections.deque[Request] = collections.deque()
        self.temperature: float | None = None  # set: every request handed out from now on samples at it
        self.arrived = self.shed = 0

    def _gap(self, at: float) -> float:
        return self.rng.expovariate(max(self.rate(at - self.start), 1e-6))

    def _arrive(self) -> None:
        now = self.clock()
        wall = time.time() - now  # the unix time of this clock's zero: arrivals are stamped when they arrived
        while self.next_at <= now:
            self.arrived += 1
            if len(self.waiting) < self.backlog:
                request = next(self.source)
                request.arrival_ts = wall + self.next_at  # waiting in the backlog counts toward its TTFT
                self.waiting.append(request)
            else:
                self.shed += 1
            self.next_at += self._gap(self.next_at)

    def __iter__(self) -> Arrivals:
        return self

    def __next__(self) -> Request:
        self._arrive()
        if not self.waiting:
            raise StopIteration
        request = self.waiting.popleft()
        if self.temperature is not None:
            request.temperature = self.temperature
        return request

    def pending(self) -> bool:
        self._arrive()
        return bool(self.waiting)

    def until_next(self) -> float:
        return max(self.next_at - self.clock(), 0.0)
