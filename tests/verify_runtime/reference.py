"""Plain non-speculative decoding with the dense forward: the ground truth the
speculative modes must reproduce token for token (docs/design.md §3, invariant 1)."""

from __future__ import annotations

import torch

from sparkgate.verify_runtime.model import Transformer, forward_full


@torch.inference_mode()
def greedy_decode(model: Transformer, prompt: list[int], max_new_tokens: int) -> list[int]:
    tokens = list(prompt)
    device = model.output.weight.device
    for _ in range(max_new_tokens):
        _, logits = forward_full(model, torch.tensor([tokens], device=device))
        tokens.append(int(logits[0, -1].argmax()))
    return tokens[len(prompt) :]
