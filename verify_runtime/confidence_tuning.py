"""Second training stage: fit the confidence head on the drafter's own blocks.

Distillation teaches ``c_k`` on teacher-forced real text, where each depth is
judged alone. At serving time ``c_k`` means "depth k is accepted given depths
< k were", and acceptances along a block are strongly correlated (a prefix that
survived is usually in easy text), so the teacher-forced head under-states
survival more and more with depth. Here the engine drafts greedy blocks on
train-split prompts in ``static`` mode, which labels every depth; the head
(``DSparkNet.confidence``) is then refitted on the depths at risk
(``a* >= k − 1``) against the realised accept indicator ``1[a* >= k]``, with the
backbone frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sparkgate.collectors.schema import StepRecord

from .block_drafter import BlockDrafter, DSparkNet
from .drafters import DraftContext, DraftOutput
from .engine import Engine, EngineConfig, Request
from .model import Transformer


@dataclass
class OwnBlocks:
    """Drafter inputs and outcomes of real blocks, one row per (request, step)."""

    hidden: torch.Tensor  # [N, window, target_dim]
    hidden_len: torch.Tensor  # [N]
    prev: torch.Tensor  # [N, γ] pending token, then the drafts of depths 1..γ−1
    full_accept: torch.Tensor  # [N] a*


class _Recording:
    """Passes ``propose`` through and keeps each call's inputs and drafts, in batch order
    (the order of the step record's request rows)."""

    def __init__(self, drafter: BlockDrafter):
        self.drafter = drafter
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.version, self.hidden_window = drafter.version, drafter.hidden_window

    def propose(self, ctx: DraftContext) -> DraftOutput:
        out = self.drafter.propose(ctx)
        assert ctx.hidden is not None and ctx.hidden_len is not None, "BlockDrafter.propose requires both"
        pending = torch.tensor([h[-1] for h in ctx.history])
        self.calls.append(
            (ctx.hidden.cpu(), ctx.hidden_len.cpu(), torch.cat([pending[:, None], out.tokens.cpu()[:, :-1]], 1))
        )
        return out


def collect_own_blocks(
    target: Transformer, net: DSparkNet, prompts: list[list[int]], max_new_tokens: int, gamma: int = 7, batch: int = 32
) -> OwnBlocks:
    """Greedy static decoding of ``prompts`` with ``net`` drafting; every block it drafted."""
    recording = _Recording(BlockDrafter(net))
    records: list[StepRecord] = []
    engine = Engine(
        target, recording, EngineConfig(gamma=gamma, max_batch=batch, default_mode="static"), sink=records.append
    )
    for i, prompt in enumerate(prompts):
        engine.submit(Request(f"own-{i}", prompt, max_new_tokens, stop_at_eos=False))
    engine.run()
    hidden, hidden_len, prev = (torch.cat(parts) for parts in zip(*recording.calls))
    full_accept = torch.tensor([row.full_accept for rec in records for row in rec.requests])
    return OwnBlocks(hidden, hidden_len, prev, full_accept)


def fit_confidence_head(
    net: DSparkNet, blocks: OwnBlocks, steps: int = 600, lr: float = 0.02, weight_decay: float = 1e-3
) -> dict:
    """Refit ``net.confidence_head`` in place (full-batch Adam, backbone frozen); BCE before and after."""
    gamma = blocks.prev.shape[1]
    depth = torch.arange(1, gamma + 1)
    at_risk = blocks.full_accept[:, None] >= depth - 1
    labels = (blocks.full_accept[:, None] >= depth).float()[at_risk]
    with torch.no_grad():  # teacher-forced on its own drafts, the net redrafts each block exactly
        h = net.backbone(blocks.hidden, blocks.hidden_len, blocks.prev[:, 0], gamma)
        drafted_from = net.draft_logits(h, blocks.prev)
        head_input = net.confidence_input(h, blocks.prev, drafted_from)[at_risk]

    def loss() -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(net.confidence_head(head_input).squeeze(-1), labels)

    head = net.confidence_head
    net.requires_grad_(False)
    head.requires_grad_(True)
    optimizer = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.no_grad():
        before = float(loss())
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()
    net.requires_grad_(True)
    with torch.no_grad():
        after = float(loss())
    return {
        "blocks": len(blocks.full_accept),
        "labels_at_risk": int(at_risk.sum()),
        "steps": steps,
        "bce_before": round(before, 4),
        "bce_after": round(after, 4),
        "mean_accepted": round(float(blocks.full_accept.float().mean()), 4),
    }
