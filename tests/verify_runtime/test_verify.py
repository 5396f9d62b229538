"""The target side of a verify step: packed prefill and verify against the dense forward, and what prefill keeps."""

import pytest
import torch

from sparkgate.verify_runtime.kv_cache import KVCache
from sparkgate.verify_runtime.model import forward_full
from sparkgate.verify_runtime.verify import TargetRunner


@pytest.mark.parametrize(
    "prompt_lens, windows",
    [
        ((5, 1, 9), (3, 0, 2)),  # ragged: several attention groups, padded cells
        ((6, 6, 6), (2, 2, 2)),  # equal lengths: a dense layout, attention in place
    ],
)
def test_packed_prefill_and_decode_match_dense_forward(target, prompt_lens, windows):
    """Ragged rows against the cache give the dense causal forward's logits."""
    torch.manual_seed(1)
    prompts = [torch.randint(0, 32, (n,)).tolist() for n in prompt_lens]
    cache = KVCache(target.args, 4, dtype=torch.float64)
    runner = TargetRunner(target, cache)
    slots = [cache.alloc() for _ in prompts]
    runner.prefill([p[:-1] for p in prompts], slots)
    # one verify step: last prompt token + the window's extra tokens
    extra = [torch.randint(0, 32, (k,)).tolist() for k in windows]
    rows = [p[-1:] + e for p, e in zip(prompts, extra)]
    tokens = torch.zeros(3, 4, dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, : len(r)] = torch.tensor(r)
    out = runner.verify(tokens, [len(r) for r in rows], slots)
    for b, (p, e) in enumerate(zip(prompts, extra)):
        _, dense = forward_full(target, torch.tensor([p + e]))
        n = len(e) + 1
        torch.testing.assert_close(out.logits[b, :n], dense[0, -n:], rtol=0, atol=1e-9)
        assert out.logits[b, n:].eq(0).all()


def test_prefill_keeps_the_last_hidden_states_and_writes_every_rows_kv(target):
    torch.manual_seed(2)
    prompts = [torch.randint(0, 32, (n,)).tolist() for n in (7, 2, 0, 5)]

    def run(keep):
        cache = KVCache(target.args, 4, dtype=torch.float64)
        slots = [cache.alloc() for _ in prompts]
        return TargetRunner(target, cache).prefill(prompts, slots, keep=keep), cache

    full, full_cache = run(None)
    kept, kept_cache = run(3)
    assert [h.shape[0] for h in full] == [7, 2, 0, 5] and [h.shape[0] for h in kept] == [3, 2, 0, 3]
    for f, k in zip(full, kept):
        torch.testing.assert_close(k, f[f.shape[0] - k.shape[0] :], rtol=0, atol=1e-12)
    assert torch.equal(full_cache.k, kept_cache.k) and torch.equal(full_cache.v, kept_cache.v)
    assert kept_cache.lengths == full_cache.lengths == [7, 2, 0, 5]
    assert [h.shape[0] for h in run(0)[0]] == [0, 0, 0, 0]
