"""Stage timing on CPU: one duration per pair of consecutive marks, in milliseconds of wall clock."""

import time

import torch

from sparkgate.verify_runtime.timing import StageClock


def test_durations_are_the_gaps_between_marks_in_milliseconds():
    start = time.perf_counter()
    clock = StageClock(torch.device("cpu"))
    assert not clock.cuda and len(clock.marks) == 1  # the clock starts marked
    time.sleep(0.02)
    clock.mark()
    clock.mark()
    time.sleep(0.01)
    clock.mark()
    elapsed_ms = (time.perf_counter() - start) * 1000.0
    first, empty, last = clock.durations_ms()
    assert first >= 20.0 and last >= 10.0 and empty >= 0.0
    assert first + empty + last <= elapsed_ms
    assert StageClock(torch.device("cpu")).durations_ms() == []
