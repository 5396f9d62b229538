"""The narrow twin keeps the target's operators and calls, and the compute ratio is the arithmetic's."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.verify_runtime.model import ModelArgs
from sparkgate.verify_runtime.verify_overhead import TWIN_DIM, narrow_twin, overhead_summary


def test_the_twin_keeps_layers_heads_and_vocabulary_and_narrows_the_width():
    args = ModelArgs()
    twin = narrow_twin(args)
    assert (twin.n_layers, twin.n_heads, twin.n_kv_heads, twin.vocab_size) == (
        args.n_layers,
        args.n_heads,
        args.n_kv_heads,
        args.vocab_size,
    )
    assert twin.dim == TWIN_DIM and twin.ffn_hidden == args.ffn_hidden * TWIN_DIM // args.dim


def test_the_twin_gives_every_head_at_least_two_dimensions():
    assert narrow_twin(ModelArgs(dim=512, n_heads=16, n_kv_heads=4)).head_dim == 2


@given(
    st.floats(1.0, 50.0),
    st.floats(0.05, 0.95),
    st.floats(0.0, 5.0),
    st.floats(0.0, 5.0),
)
def test_the_compute_ratio_is_compact_over_static_once_the_fixed_cost_is_taken_out(work, share, fixed_s, fixed_c):
    # A step that costs fixed + work: the compute ratio recovers the share of the work, whatever the fixed costs.
    static, compact = [fixed_s + work] * 5, [fixed_c + share * work] * 5
    out = overhead_summary(static, compact, [fixed_s] * 5, [fixed_c] * 5)
    assert out["compute_ratio"]["median"] == pytest.approx(share, abs=1e-4)
    assert out["fixed_share_static"]["median"] == pytest.approx(fixed_s / (fixed_s + work), abs=1e-3)


def test_a_step_no_slower_than_its_twin_gives_no_compute_ratio():
    out = overhead_summary([1.0], [0.5], [1.0], [0.5])
    assert out["compute_ratio"] is None
