"""Open-loop arrivals for ``sparkgate replica --rate``."""

from __future__ import annotations

from itertools import count

import pytest

from sparkgate.verify_runtime.arrivals import Arrivals, swing
from tests.conftest import Clock


def requests():
    class R:
        def __init__(self, i):
            self.request_id, self.temperature = f"r{i}", 0.0

    return (R(i) for i in count())


def test_arrivals_hand_out_only_what_arrived_and_shed_beyond_the_backlog():
    clock = Clock(100.0)
    arrivals = Arrivals(requests(), lambda t: 20.0, clock, seed=1, backlog=40)
    assert list(arrivals) == []  # nothing has arrived at t=0
    clock.now += 1.0
    first = list(arrivals)
    assert 5 <= len(first) <= 40 and arrivals.shed == 0  # a Poisson second at 20/s
    assert [r.request_id for r in first] == [f"r{i}" for i in range(len(first))]
    clock.now += 10.0
    assert arrivals.pending() and len(arrivals.waiting) == 40
    assert arrivals.shed == arrivals.arrived - len(first) - 40 > 0
    arrivals.temperature = 1.0
    assert next(arrivals).temperature == 1.0


def test_swing_moves_the_rate_around_its_mean():
    rate = swing(6.0, 0.5, 20.0, 0.0)
    assert rate(0) == pytest.approx(6.0) and rate(5) == pytest.approx(9.0) and rate(15) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        swing(6.0, 1.0, 20.0, 0.0)
