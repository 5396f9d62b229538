"""The KV cache's slot bookkeeping: allocation, release and committed lengths, against a plain model."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.verify_runtime.kv_cache import CacheFull, KVCache
from sparkgate.verify_runtime.model import ModelArgs

ARGS = ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=32, max_seq_len=16)

operations = st.lists(
    st.one_of(
        st.tuples(st.just("alloc")),
        st.tuples(st.just("release"), st.integers(-1, 4)),
        st.tuples(st.just("commit"), st.integers(0, 3), st.integers(-2, 10)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_slots_and_lengths_follow_a_plain_model(ops):
    cache = KVCache(ARGS, 3, max_len=12)
    allocated: set[int] = set()
    lengths = {}
    for op in ops:
        if op[0] == "alloc":
            if len(allocated) == 3:
                with pytest.raises(CacheFull, match="all 3 cache slots are in use"):
                    cache.alloc()
                continue
            slot = cache.alloc()
            assert slot not in allocated and 0 <= slot < 3 and cache.lengths[slot] == 0
            allocated.add(slot)
            lengths[slot] = 0
        elif op[0] == "release":
            if op[1] not in allocated:
                with pytest.raises(ValueError, match="is not allocated"):
                    cache.release(op[1])
                continue
            cache.release(op[1])
            allocated.discard(op[1])
        else:
            _, slot, rows = op
            if slot not in allocated:
                continue
            if rows < 0 or lengths[slot] + rows > 12:
                with pytest.raises(ValueError, match=f"commit of {rows} rows takes slot {slot}"):
                    cache.commit(slot, rows)
            else:
                cache.commit(slot, rows)
                lengths[slot] += rows
        assert cache.free_slots == 3 - len(allocated)
        assert all(cache.lengths[s] == n for s, n in lengths.items() if s in allocated)


def test_layout_has_a_scratch_slot_past_the_real_ones():
    cache = KVCache(ARGS, 4, dtype=torch.float64)
    assert cache.max_len == ARGS.max_seq_len and cache.scratch_slot == 4
    assert cache.k.shape == cache.v.shape == (2, 5, 16, 2, ARGS.head_dim) and cache.k.dtype == torch.float64
    assert [cache.alloc() for _ in range(4)] == [0, 1, 2, 3]  # the scratch slot is never handed out
    cache.release(2)
    assert cache.alloc() == 2
    with pytest.raises(ValueError, match="max_len=17 exceeds the model's max_seq_len=16"):
        KVCache(ARGS, 1, max_len=17)
