import pytest

from sparkgate.policies.vocabulary import MissReason
from sparkgate.verify_runtime.tiers import TierGrid, parse_tiers, served_grid


def test_round_up_to_smallest_tier():
    grid = TierGrid((8, 16, 32))
    assert [(c.tier, c.tier_rows, c.graph_hit) for c in (grid.select(1), grid.select(8))] == [(0, 8, True)] * 2
    choice = grid.select(9)
    assert (choice.tier, choice.tier_rows, choice.graph_hit, choice.miss_reason) == (1, 16, True, None)
    assert grid.select(32).tier_rows == 32


def test_misses_carry_their_reason_and_run_unpadded():
    over = TierGrid((8, 16)).select(17)
    assert (over.tier, over.tier_rows, over.graph_hit, over.miss_reason) == (-1, 17, False, "over_max_tier")
    absent = TierGrid((8, 16, 32), captured=frozenset({8, 32})).select(12)
    assert (absent.tier_rows, absent.graph_hit, absent.miss_reason) == (12, False, "not_captured")
    forced = TierGrid((8, 16), force_eager=True).select(4)
    assert (forced.tier_rows, forced.miss_reason) == (4, "forced_eager")


def test_only_tiers_a_full_batch_can_select_are_reachable():
    grid = TierGrid((8, 16, 32, 64))
    assert grid.reachable(8) == (8,)
    assert grid.reachable(9) == grid.reachable(16) == (8, 16)
    assert grid.reachable(500) == (8, 16, 32, 64)  # past the grid: every tier, the rest miss
    for rows in range(1, 17):  # whatever a batch of at most 16 rows selects was kept
        assert grid.select(rows).tier_rows in grid.reachable(16)
    assert TierGrid((8, 16, 32), captured=frozenset({8, 32})).reachable(20) == (8, 32)


def test_bad_grids_fail_clearly():
    with pytest.raises(ValueError, match="strictly increasing"):
        TierGrid((16, 8))
    with pytest.raises(ValueError, match=r"captured tiers \[24\]"):
        TierGrid((8, 16), captured=frozenset({24}))
    with pytest.raises(ValueError, match="comma-separated"):
        parse_tiers("8,x")
    assert parse_tiers("8, 16,32") == (8, 16, 32)


def test_on_cuda_without_graphs_every_step_is_a_forced_eager_miss_at_its_rows():
    """A tier "hit" there recorded a graph replay that never ran; on CPU a hit is the padded static shapes."""
    grid = TierGrid((8, 16))
    eager = served_grid(grid, "cuda", graphs=False).select(10)
    assert (eager.graph_hit, eager.tier_rows, eager.miss_reason) == (False, 10, MissReason.FORCED_EAGER)
    assert served_grid(grid, "cuda", graphs=True) == grid and served_grid(grid, "cpu", graphs=False) == grid
