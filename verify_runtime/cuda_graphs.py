"""CUDA graphs for the two fixed-shape stages of a step: verify tiers and the schedule.

Verify tiers (``GraphTiers``): one captured graph per row-count tier, replayed with static buffers.

Every captured graph has fixed shapes: ``tier_rows`` packed rows and one
attention group of ``max_batch`` requests × ``γ+1`` query cells reading keys up
to the cache's ``max_len``. A replay copies the step's layout into the static
buffers (unused request places point at the scratch slot, padding rows at the
spare cell) and reads back the first rows. Only constructed on CUDA; on CPU the
same padded row counts run eagerly.

The schedule stage (``ScheduleGraphs``: confidence logits -> confidences,
survivals, window decision) is a few dozen tiny kernels; on a GPU, launching
them one by one cost more than running them (about half a millisecond a step
at batch 32, a tenth of the step), so it is captured once per batch size.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch

from sparkgate.policies.window import WindowDecision

from .kv_cache import KVCache
from .model import Transformer, forward_packed
from .packing import AttentionGroup, PackedLayout, build_layout, gather_rows
from .tiers import TierGrid

# (confidence logits [B, γ], lagged survivals [B, γ] or None) -> (confidences, survivals, decision)
Schedule = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor, WindowDecision]]

# The layout tensors a graph reads; a replay overwrites each in place.
_STATIC_FIELDS = ("positions", "kv_slot", "cell")


class StaticLayouts:
    """Fixed-shape layouts: every step at a tier looks the same to a captured graph."""

    def __init__(self, cache: KVCache, gamma: int, max_batch: int):
        self.cache, self.width, self.max_batch = cache, gamma + 1, max_batch

    def real(self, starts: list[int], lens: list[int], slots: list[int], rows: int) -> PackedLayout:
        """The step's own requests at the fixed query width and key length."""
        if len(lens) > self.max_batch:
            raise ValueError(f"{len(lens)} requests exceed the captured max_batch={self.max_batch}")
        return build_layout(
            starts,
            lens,
            slots,
            self.cache.scratch_slot,
            tier_rows=rows,
            q_len=self.width,
            kv_len=self.cache.max_len,
            device=self.cache.k.device,
        )

    def padded(self, real: PackedLayout) -> PackedLayout:
        """``real`` widened to ``max_batch`` request places, as a captured graph expects."""
        extra = self.max_batch - real.batch_size
        group = real.groups[0]
        spare = self.max_batch * self.width
        return dataclasses.replace(
            real,
            dense=False,  # a captured graph takes the general path whatever the step it replays
            cell=torch.where(real.row_req < real.batch_size, real.cell, spare),
            groups=[
                AttentionGroup(
                    slots=torch.cat([group.slots, group.slots.new_full((extra,), self.cache.scratch_slot)]),
                    starts=torch.cat([group.starts, group.starts.new_zeros(extra)]),
                    q_len=self.width,
                    kv_len=group.kv_len,
                    offset=0,
                )
            ],
        )


class GraphTiers:
    def __init__(self, model: Transformer, cache: KVCache, grid: TierGrid, gamma: int, max_batch: int):
        if cache.k.device.type != "cuda":
            raise ValueError("CUDA graph tiers need the cache on a CUDA device")
        self.model, self.cache = model, cache
        self.shapes = StaticLayouts(cache, gamma, max_batch)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, PackedLayout, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for rows in grid.reachable(max_batch * (gamma + 1)):
            self._capture(rows)

    @torch.inference_mode()
    def _capture(self, rows: int) -> None:
        n = min(rows, self.shapes.max_batch)  # any valid layout: replays overwrite every buffer
        layout = self.shapes.padded(self.shapes.real([0] * n, [1] * n, [self.cache.scratch_slot] * n, rows))
        tokens = torch.zeros(rows, dtype=torch.long, device=self.cache.k.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm kernels and the allocator outside the capture
                forward_packed(self.model, self.cache, tokens, layout)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hidden, logits = forward_packed(self.model, self.cache, tokens, layout)
        self.graphs[rows] = (graph, layout, tokens, hidden, logits)

    @torch.inference_mode()
    def replay(self, rows: int, tokens: torch.Tensor, starts: list[int], lens: list[int], slots: list[int]):
        """Run one step at tier ``rows``: (hidden [rows, dim], logits [rows, V], real-request layout)."""
        graph, static, static_tokens, hidden, logits = self.graphs[rows]
        real = self.shapes.real(starts, lens, slots, rows)
        padded = self.shapes.padded(real)
        for name in _STATIC_FIELDS:
            getattr(static, name).copy_(getattr(padded, name))
        static.groups[0].slots.copy_(padded.groups[0].slots)
        static.groups[0].starts.copy_(padded.groups[0].starts)
        static_tokens.copy_(gather_rows(tokens, real))
        graph.replay()
        return hidden.clone(), logits.clone(), real


class ScheduleGraphs:
    """The schedule stage captured for every batch size ``1..max_batch`` and replayed.

    All sizes are captured up front (``prepare``), not on first use: a serving
    batch drifts through every size as requests finish, and a capture inside a
    step costs as much as many steps of scheduling. ``owner`` names what the
    graphs baked in (the engine's policy and calibration); when either is
    swapped, as a rollout does, the next call recaptures every size. The stage
    must be capturable: fixed shapes, no host syncs, no host-to-device copies
    after a warm-up call (the shipped policies and STS are). One that is not
    still runs, eagerly, with a warning and ``eager_reason`` saying why.
    Outputs live in the graph's static buffers, valid until the next replay at
    the same batch size: clone what must outlive the step.

    The graphs of the ``KEEP_OWNERS`` most recent owners are kept: in adaptive a
    replica alternates a fitted table's scheduler (treatment epochs) with the
    static one's (control epochs), and must not recapture at every epoch.
    """

    KEEP_OWNERS = 2

    def __init__(self, max_batch: int, gamma: int, device: torch.device):
        self.max_batch, self.gamma, self.device = max_batch, gamma, device
        self.owner: tuple = ()
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple, tuple]] = {}
        self.eager_reason: str | None = None
        self.kept: list[tuple[tuple, dict, str | None]] = []  # earlier owners' graphs, oldest first
        self.captures = 0  # owners captured so far (a swap back to a kept owner captures nothing)

    def _switch(self, owner: tuple) -> bool:
        """Make a kept owner's graphs current; False when ``owner`` was not kept."""
        for i, (kept, graphs, reason) in enumerate(self.kept):
            if _same(kept, owner):
                self.kept[i] = (self.owner, self.graphs, self.eager_reason)
                self.owner, self.graphs, self.eager_reason = kept, graphs, reason
                return True
        return False

    def prepare(self, schedule: Schedule, owner: tuple, lagged: bool) -> None:
        """Capture ``schedule`` at every batch size; ``lagged``: it takes lagged survivals."""
        if self.owner:
            self.kept = (self.kept + [(self.owner, self.graphs, self.eager_reason)])[-(self.KEEP_OWNERS - 1) :]
        self.owner, self.graphs, self.eager_reason = owner, {}, None
        self.captures += 1
        try:
            for batch in range(1, self.max_batch + 1):
                logits = torch.zeros(batch, self.gamma, device=self.device)
                self.graphs[batch] = _capture(schedule, logits, torch.ones_like(logits) if lagged else None)
        except RuntimeError as exc:
            self.graphs, self.eager_reason = {}, str(exc).splitlines()[0]
            warnings.warn(
                f"the schedule stage runs eagerly: it could not be captured ({self.eager_reason})", stacklevel=2
            )

    def __call__(self, schedule: Schedule, owner: tuple, logits: torch.Tensor, lagged: torch.Tensor | None):
        if not _same(owner, self.owner) and not self._switch(owner):
            self.prepare(schedule, owner, lagged is not None)
        if self.eager_reason is not None:
            return schedule(logits, lagged)
        graph, inputs, outputs = self.graphs[logits.shape[0]]
        for static, value in zip(inputs, (logits, lagged)):
            if static is not None:
                static.copy_(value)
        graph.replay()
        return outputs


def _same(a: tuple, b: tuple) -> bool:
    """The same objects, one by one (identity: a swapped policy is a new object)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@torch.inference_mode()
def _capture(schedule: Schedule, logits: torch.Tensor, lagged: torch.Tensor | None):
    inputs = (logits.clone(), None if lagged is None else lagged.clone())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # fills host-side caches (cost curves, STS temperatures) outside the capture
            schedule(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = schedule(*inputs)
    return graph, inputs, outputs
