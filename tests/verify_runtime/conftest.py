"""Small random-initialised models for runtime tests (float64, so that packed and
dense paths agree far below any argmax margin)."""
from __future__ import annotations

import pytest
import torch

from verify_runtime.model import ModelArgs, Transformer


def tiny_model(vocab: int = 32, seed: int = 0, init_std: float = 0.3, **kw) -> Transformer:
    torch.manual_seed(seed)
    args = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=vocab,
                     max_seq_len=96, init_std=init_std, **kw)
    return Transformer(args).double().eval()


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_model()


class SurvivalWindows:
    """A deterministic window policy that still varies per request and step: the
    window is read off digits of the survival values, which depend only on the
    request's state."""

    def __call__(self, survival, ctx):
        from policies.window import WindowDecision
        digits = (survival[:, 0].double() * 1e6).long()
        return WindowDecision(digits % (ctx.gamma + 1))
