"""Stage timing on CPU: one duration per pair of consecutive marks, in milliseconds of wall clock."""

import pytest
import torch

from sparkgate.verify_runtime import timing
from sparkgate.verify_runtime.timing import StageClock


def test_durations_are_the_gaps_between_marks_in_milliseconds(monkeypatch):
    # A clock the test sets: the durations are exactly the gaps it put between the marks, not a sleep's.
    now = iter([10.0, 10.02, 10.02, 10.035])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(now))
    clock = StageClock(torch.device("cpu"))
    assert not clock.cuda and len(clock.marks) == 1  # the clock starts marked
    clock.mark()
    clock.mark()
    clock.mark()
    assert clock.durations_ms() == pytest.approx([20.0, 0.0, 15.0], abs=1e-9)


def test_a_clock_marked_once_has_no_durations():
    assert StageClock(torch.device("cpu")).durations_ms() == []
