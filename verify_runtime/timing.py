"""Stage timing for a step: CUDA events on CUDA (one sync at the end), wall clock on CPU."""

from __future__ import annotations

import time

import torch


class StageClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def durations_ms(self) -> list[float]:
        """Milliseconds between consecutive marks (syncs on the last event on CUDA)."""
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1000.0 for a, b in zip(self.marks, self.marks[1:])]
