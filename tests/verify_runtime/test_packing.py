import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.verify_runtime.packing import build_layout, gather_rows, scatter_rows

batches = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 9)), min_size=1, max_size=12)


@given(batches, st.integers(0, 20))
@settings(max_examples=80, deadline=None)
def test_layout_invariants_and_round_trip(reqs, extra):
    starts, lens = [s for s, _ in reqs], [n for _, n in reqs]
    slots = list(range(10, 10 + len(reqs)))
    layout = build_layout(starts, lens, slots, scratch_slot=99, tier_rows=sum(lens) + extra)
    n = sum(lens)
    assert layout.n_rows == n and layout.tier_rows == n + extra
    assert layout.cu_seqlens.tolist() == [sum(lens[:i]) for i in range(len(lens) + 1)]
    # every real row sits at its request's start plus its offset, in its slot
    for r in range(n):
        b, q = int(layout.row_req[r]), int(layout.row_q[r])
        assert 0 <= q < lens[b]
        assert int(layout.positions[r]) == starts[b] + q
        assert int(layout.kv_slot[r]) == slots[b]
    # padding rows belong to the scratch request, slot and spare cell
    assert layout.row_req[n:].eq(len(reqs)).all() and layout.kv_slot[n:].eq(99).all()
    assert layout.cell[n:].eq(layout.n_cells).all()
    cells = layout.cell[:n].tolist()
    assert len(set(cells)) == n and max(cells) < layout.n_cells
    # dense (attention in place) exactly when row r owns cell r and nothing is padding
    assert layout.dense == (extra == 0 and layout.n_cells == n and cells == list(range(n)))
    # padded query cells stay under 2x the real rows; a group is as wide as its longest member
    assert layout.n_cells < 2 * n
    for group in layout.groups:
        assert group.q_len == max(lens[b] for b in range(len(lens)) if slots[b] in group.slots.tolist())
    # gather then scatter restores every real cell and zeroes the rest
    width = max(lens)
    strided = torch.randn(len(reqs), width, 3)
    back = scatter_rows(gather_rows(strided, layout), layout, width)
    for b, length in enumerate(lens):
        assert torch.equal(back[b, :length], strided[b, :length])
        assert back[b, length:].eq(0).all()


def test_equal_lengths_pad_no_cell():
    layout = build_layout([0, 0, 0], [95, 95, 95], [0, 1, 2], scratch_slot=3)
    assert [(g.q_len, g.n_cells) for g in layout.groups] == [(95, 285)] and layout.n_cells == layout.n_rows
    assert layout.dense
    assert not build_layout([0, 0], [95, 95], [0, 1], scratch_slot=3, tier_rows=192).dense  # tier padding
    assert not build_layout([0, 0], [94, 95], [0, 1], scratch_slot=3).dense  # a padded cell


def test_fixed_shape_layout_is_one_group():
    layout = build_layout([3, 5], [2, 4], [0, 1], scratch_slot=7, tier_rows=8, q_len=8, kv_len=32)
    assert len(layout.groups) == 1
    group = layout.groups[0]
    assert (group.q_len, group.kv_len, group.n_cells) == (8, 32, 16)


def test_mask_admits_prefix_and_earlier_window_rows_only():
    layout = build_layout([4], [3], [0], scratch_slot=1)
    mask = layout.groups[0].mask()[0, 0]
    # row q (position 4 + q) sees keys 0 .. 4 + q
    for q in range(3):
        assert mask[q].nonzero().flatten().tolist() == list(range(5 + q))


def test_bad_layouts_fail_clearly():
    import pytest

    with pytest.raises(ValueError, match="at least one row"):
        build_layout([0], [0], [0], scratch_slot=1)
    with pytest.raises(ValueError, match="smaller than the 5 real rows"):
        build_layout([0], [5], [0], scratch_slot=1, tier_rows=4)
    with pytest.raises(ValueError, match="differ in length"):
        build_layout([0, 1], [1], [0], scratch_slot=1)
