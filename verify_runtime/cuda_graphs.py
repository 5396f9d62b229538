"""CUDA-graph tiers: one captured graph per row-count tier, replayed with static buffers.

Every captured graph has fixed shapes: ``tier_rows`` packed rows, ``max_batch``
requests plus the scratch request, a strided width of ``γ+1`` and keys up to the
cache's ``max_len``. A replay copies the step's layout into the static buffers
(extra requests point at the scratch slot) and reads back the first rows.
Only constructed on CUDA; CPU runs the same padded shapes eagerly.
"""
from __future__ import annotations

import torch

from .kv_cache import KVCache
from .model import Transformer, forward_packed
from .packing import PackedLayout, build_layout, gather_rows
from .tiers import TierGrid


class GraphTiers:
    def __init__(self, model: Transformer, cache: KVCache, grid: TierGrid, gamma: int, max_batch: int):
        if cache.k.device.type != "cuda":
            raise ValueError("CUDA graph tiers need the cache on a CUDA device")
        self.model, self.cache = model, cache
        self.width, self.max_batch = gamma + 1, max_batch
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, PackedLayout, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        for rows in grid.captured_tiers:
            self._capture(rows)

    def _static_layout(self, rows: int) -> PackedLayout:
        # One row per request for the first requests, the rest padding: any valid
        # layout works, replays overwrite every buffer.
        n = min(rows, self.max_batch)
        return build_layout([0] * n, [1] * n, [self.cache.scratch_slot] * n, self.cache.scratch_slot,
                            tier_rows=rows, q_len=self.width, kv_len=self.cache.max_len, device=self.cache.k.device)

    def _pad_requests(self, layout: PackedLayout) -> PackedLayout:
        extra = self.max_batch - layout.batch_size
        fill = lambda t, v: torch.cat([t[:-1], t.new_full((extra,), v), t[-1:]])
        row_req = torch.where(layout.row_req == layout.batch_size, self.max_batch, layout.row_req)
        return PackedLayout(
            cu_seqlens=layout.cu_seqlens, row_req=row_req, row_q=layout.row_q, positions=layout.positions,
            kv_slot=layout.kv_slot, req_slot=fill(layout.req_slot, self.cache.scratch_slot),
            req_start=fill(layout.req_start, 0), n_rows=layout.n_rows, q_len=self.width, kv_len=self.cache.max_len,
        )

    @torch.inference_mode()
    def _capture(self, rows: int) -> None:
        layout = self._pad_requests(self._static_layout(rows))
        tokens = torch.zeros(rows, dtype=torch.long, device=self.cache.k.device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels and allocator outside the capture
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
        real = build_layout(starts, lens, slots, self.cache.scratch_slot, tier_rows=rows,
                            q_len=self.width, kv_len=self.cache.max_len, device=tokens.device)
        padded = self._pad_requests(real)
        for name in ("row_req", "row_q", "positions", "kv_slot", "req_slot", "req_start"):
            getattr(static, name).copy_(getattr(padded, name))
        static_tokens.copy_(gather_rows(tokens, real))
        graph.replay()
        return hidden.clone(), logits.clone(), real
