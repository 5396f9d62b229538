"""The target side of a verify step: pack, pick a tier, run, unpack.

``TargetRunner.verify`` takes the strided ``[B, W]`` tokens of a step (each
request's last committed token followed by its drafts) and the number of rows
each request submits, and returns the target's logits in the same strided view.
Only ``sum(lens)`` rows (rounded up to a tier) go through the model, so the
cost follows the packed rows, not ``B × W``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .kv_cache import KVCache
from .model import Transformer, forward_packed
from .packing import PackedLayout, build_layout, gather_rows, scatter_rows
from .tiers import TierChoice, TierGrid


@dataclass
class VerifyOutput:
    logits: torch.Tensor  # [B, W, V]; cells past a request's rows are zero
    hidden: torch.Tensor  # [B, W, dim]
    layout: PackedLayout
    tier: TierChoice


class TargetRunner:
    def __init__(self, model: Transformer, cache: KVCache, grid: TierGrid | None = None, graphs=None):
        self.model, self.cache = model, cache
        self.grid = grid or TierGrid()
        self.graphs = graphs  # cuda_graphs.GraphTiers on CUDA, else None

    @property
    def device(self) -> torch.device:
        return self.cache.k.device

    def layout(
        self, starts: list[int], lens: list[int], slots: list[int], tier_rows: int | None = None
    ) -> PackedLayout:
        return build_layout(starts, lens, slots, self.cache.scratch_slot, tier_rows=tier_rows, device=self.device)

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], slots: list[int], keep: int | None = None) -> list[torch.Tensor]:
        """Write the K/V of each prompt's tokens at positions 0.. and commit them (eager).

        Returns each prompt's final hidden states ``[n, dim]``: all of them, or its
        last ``keep`` (fewer for a shorter prompt, none for an empty one). Rows
        nobody keeps skip the last layer's feed-forward.
        """
        hidden = [self.cache.k.new_zeros(0, self.model.args.dim) for _ in prompts]
        present = [i for i, p in enumerate(prompts) if p]
        if not present:
            return hidden
        lens = [len(prompts[i]) for i in present]
        layout = self.layout([0] * len(present), lens, [slots[i] for i in present])
        tokens = torch.tensor([t for i in present for t in prompts[i]], dtype=torch.long, device=self.device)
        kept = lens if keep is None else [min(keep, n) for n in lens]
        ends = itertools.accumulate(lens)  # on the host: reading cu_seqlens back would sync a device
        rows = (
            None
            if keep is None
            else torch.tensor(
                [r for end, k in zip(ends, kept) for r in range(end - k, end)], dtype=torch.long, device=self.device
            )
        )
        packed, _ = forward_packed(self.model, self.cache, tokens, layout, rows)
        for i, n, part in zip(present, lens, packed.split(kept)):
            self.cache.commit(slots[i], n)
            hidden[i] = part
        return hidden

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, lens: list[int], slots: list[int]) -> VerifyOutput:
        """Run ``lens[b]`` leading tokens of ``tokens[b]`` at the slot's committed length."""
        starts = [self.cache.lengths[s] for s in slots]
        tier = self.grid.select(sum(lens))
        if self.graphs is not None and tier.graph_hit:
            hidden, logits, layout = self.graphs.replay(tier.tier_rows, tokens, starts, lens, slots)
        else:
            layout = self.layout(starts, lens, slots, tier_rows=tier.tier_rows)
            hidden, logits = forward_packed(self.model, self.cache, gather_rows(tokens, layout), layout)
        width = tokens.shape[1]
        return VerifyOutput(scatter_rows(logits, layout, width), scatter_rows(hidden, layout, width), layout, tier)
