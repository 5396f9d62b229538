"""Window policies: the behaviours issue 4 asks for, on hand-computed cases, and the threshold policy's
range and monotonicity as properties."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.policies.cost_model import AdditiveCostTable, CostMeta, StepsPerSecondTable
from sparkgate.policies.window import (
    ConfidenceThreshold,
    CostAwareScheduler,
    FixedWindow,
    WindowContext,
)
from tests.conftest import survivals

FREE = StepsPerSecondTable(sample_batch_tokens=(1,), sample_steps_per_sec=(100.0,), max_batch_tokens=100_000)
# T(bs, M) = 2 + M seconds: a fixed overhead plus a cost proportional to rows (probed over every row count
# the tests plan: tables are clamped beyond their last probe, as SGLang reads them).
PROPORTIONAL = AdditiveCostTable(
    bias_seconds=2.0, bs_probes=(1,), alpha_seconds=(0.0,), m_probes=(1, 1024), theta_seconds=(1.0, 1024.0)
)
# Rows are nearly free up to 64 (memory-bound), then every row costs (compute-bound).
KNEE = AdditiveCostTable(
    bias_seconds=0.01,
    bs_probes=(1,),
    alpha_seconds=(0.0,),
    m_probes=(1, 64, 128, 1024),
    theta_seconds=(0.0, 0.0005, 0.0105, 0.1505),
)


def decide(policy, survival, lagged=None):
    return policy(survival, WindowContext(survival.shape[0], survival.shape[1], lagged))


def test_free_verification_verifies_everything():
    survival = torch.cumprod(torch.rand(16, 7, generator=torch.Generator().manual_seed(0)) * 0.9 + 0.05, dim=1)
    for table in (FREE, AdditiveCostTable(0.01, (1,), (0.0,), (1,), (0.0,))):
        decision = decide(CostAwareScheduler(table), survival)
        assert decision.windows.tolist() == [7] * 16
        assert int(decision.budget) == 16 * 7


def test_one_price_for_every_budget_verifies_the_whole_block_even_past_a_zero_survival():
    # A batch of 2 at gamma 3 plans 2..8 rows; the shipped tiers put all of them in one 8-row tier.
    tiered = AdditiveCostTable(0.004, (1,), (0.0,), (8, 16), (0.002, 0.003), meta=CostMeta(tiers=(8, 16)))
    survival = torch.tensor([[0.9, 0.0, 0.0], [0.5, 0.2, 0.0]])
    scheduler = CostAwareScheduler(tiered)
    assert scheduler.flat_price(2, 3, "cpu")
    decision = decide(scheduler, survival)
    assert decision.windows.tolist() == [3, 3] and int(decision.budget) == 6
    assert float(decision.predicted_step_ms) == pytest.approx(6.0)
    assert float(decision.predicted_tokens_per_s) == pytest.approx((2 + 1.6) / 0.006)
    # One more request crosses into the 16-row tier: prices differ, and ties go to the smaller budget again
    # (the zero-survival cells are not taken).
    wider = torch.tensor([[0.9, 0.0, 0.0], [0.5, 0.2, 0.0], [0.9, 0.0, 0.0]])
    assert not scheduler.flat_price(3, 3, "cpu")
    assert decide(scheduler, wider).windows.tolist() == [1, 2, 1]


def test_proportional_cost_picks_the_hand_computed_optimum():
    # One request, S = [0.9, 0.5, 0.1], T = 2 + (1 + k):
    # rate(k) = tau/T = 1/3, 1.9/4, 2.4/5, 2.5/6 -> k = 2 (0.48 tokens/s).
    decision = decide(CostAwareScheduler(PROPORTIONAL), torch.tensor([[0.9, 0.5, 0.1]]))
    assert decision.windows.tolist() == [2]
    assert float(decision.predicted_step_ms) == pytest.approx(5000.0)
    assert float(decision.predicted_tokens_per_s) == pytest.approx(0.48)


def test_requests_with_different_confidences_get_different_windows():
    # Admission: .9(r0) .8(r0) .6(r1) .2(r1) .1 .1; T = 2 + 2 + k:
    # rate = 2/4, 2.9/5, 3.7/6, 4.3/7, 4.5/8 ... -> k = 2, both for request 0.
    survival = torch.tensor([[0.9, 0.8, 0.1], [0.6, 0.2, 0.1]])
    decision = decide(CostAwareScheduler(PROPORTIONAL), survival)
    assert decision.windows.tolist() == [2, 0]
    assert float(decision.predicted_tokens_per_s) == pytest.approx(3.7 / 6)


def test_by_default_a_request_may_verify_no_draft_as_in_sglang():
    """SGLang's DSpark planner counts the anchor row in a verify length: ``DSparkScheduleConfig.min_verify_len``
    is 1 and ``compute_verify_token_budget`` ranks every draft's survival with no floor, pricing
    ``num_requests + k`` rows (sgl-project/sglang@00c3cffac9ff,
    python/sglang/srt/speculative/dspark_components/dspark_planner.py); the verify lengths are
    ``min_verify_len`` plus the drafts selected, clamped to at least 1 (@98984213ca90,
    python/sglang/kernels/ops/speculative/dspark/dspark_schedule.py). A request with poor drafts therefore
    verifies the anchor alone, a window of 0 here, and a floor of one draft is a choice that costs rows."""
    # Admission: .9(r0) .8(r0) .6(r1) .2(r1) .1 .1; T = 2 + 2 + k: the best budget is 2, both request 0's.
    survival = torch.tensor([[0.9, 0.8, 0.1], [0.6, 0.2, 0.1]])
    assert decide(CostAwareScheduler(PROPORTIONAL), survival).windows.tolist() == [2, 0]
    floored = decide(CostAwareScheduler(PROPORTIONAL, min_window=1), survival)
    assert floored.windows.tolist() == [2, 1]
    assert float(floored.predicted_tokens_per_s) < 3.7 / 6


def test_the_same_confidences_at_a_larger_batch_get_shorter_windows():
    row = torch.tensor([[0.95, 0.9, 0.8, 0.7, 0.55, 0.4, 0.3]])
    small = decide(CostAwareScheduler(KNEE), row.repeat(4, 1)).windows
    large = decide(CostAwareScheduler(KNEE), row.repeat(64, 1)).windows
    assert small.tolist() == [7] * 4
    assert large.float().mean() < small.float().mean()
    assert large.max() < 7


def test_min_window_holds_even_when_rows_are_expensive():
    survival = torch.full((8, 5), 0.01)
    windows = decide(CostAwareScheduler(PROPORTIONAL, min_window=2), survival).windows
    assert windows.tolist() == [2] * 8
    assert decide(CostAwareScheduler(PROPORTIONAL, min_window=9), survival).windows.tolist() == [5] * 8


def test_max_batch_tokens_caps_the_planned_rows():
    capped = StepsPerSecondTable(sample_batch_tokens=(1,), sample_steps_per_sec=(100.0,), max_batch_tokens=4 + 6)
    decision = decide(CostAwareScheduler(capped), torch.full((4, 7), 0.9))
    assert int(decision.windows.sum()) == 6


def test_decisions_are_deterministic():
    survival = torch.tensor([[0.8, 0.8, 0.4], [0.8, 0.4, 0.4], [0.8, 0.8, 0.8]])
    policy = CostAwareScheduler(PROPORTIONAL)
    first = decide(policy, survival).windows
    for _ in range(5):
        assert torch.equal(decide(policy, survival).windows, first)


def test_lagged_mode_decides_the_budget_from_the_older_survivals():
    current = torch.tensor([[0.99, 0.98, 0.97], [0.99, 0.98, 0.97]])
    lagged = torch.tensor([[0.3, 0.1, 0.05], [0.9, 0.8, 0.1]])
    unlagged_on_lagged = decide(CostAwareScheduler(PROPORTIONAL), lagged)
    decision = decide(CostAwareScheduler(PROPORTIONAL, lag=2), current, lagged)
    assert int(decision.budget) == int(unlagged_on_lagged.budget) == 2
    # Within that budget the windows follow the current survivals (depth first, then request).
    assert decision.windows.tolist() == [1, 1]
    assert int(decide(CostAwareScheduler(PROPORTIONAL), current).budget) > 2


def test_lagged_mode_needs_matching_lagged_survivals():
    policy = CostAwareScheduler(PROPORTIONAL, lag=2)
    with pytest.raises(ValueError, match="lagged_survival, got None"):
        decide(policy, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"lagged_survival: shape \(1, 3\)"):
        decide(policy, torch.ones(2, 3), torch.ones(1, 3))


def test_scheduler_checks_the_context_and_handles_an_empty_batch():
    with pytest.raises(ValueError, match="does not match ctx"):
        CostAwareScheduler(FREE)(torch.ones(2, 3), WindowContext(2, 4))
    assert decide(CostAwareScheduler(FREE), torch.ones(0, 3)).windows.shape == (0,)
    with pytest.raises(ValueError, match="min_window"):
        CostAwareScheduler(FREE, min_window=-1)


def test_confidence_threshold_counts_survivors():
    survival = torch.tensor([[0.9, 0.6, 0.3], [0.4, 0.2, 0.1]])
    assert decide(ConfidenceThreshold(0.5), survival).windows.tolist() == [2, 0]
    assert decide(ConfidenceThreshold(0.5, min_window=1), survival).windows.tolist() == [2, 1]
    assert decide(ConfidenceThreshold(0.0), survival).windows.tolist() == [3, 3]
    with pytest.raises(ValueError, match="p must be in"):
        ConfidenceThreshold(1.5)


def test_fixed_window_clamps_to_gamma():
    assert decide(FixedWindow(9), torch.ones(2, 4)).windows.tolist() == [4, 4]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scheduler_never_syncs_on_cuda():
    survival = torch.cumprod(torch.rand(64, 7, device="cuda") * 0.7 + 0.3, dim=1)
    lagged_host = torch.cumprod(torch.rand(64, 7) * 0.7 + 0.3, dim=1)
    for policy, lagged in (
        (CostAwareScheduler(KNEE), None),
        (CostAwareScheduler(KNEE, lag=2), lagged_host),
        (ConfidenceThreshold(0.5), None),
    ):
        decide(policy, survival, lagged)  # warm-up copies the cost curve once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            decision = decide(policy, survival, lagged)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert decision.windows.is_cuda


@settings(max_examples=100, deadline=None)
@given(survivals(), st.floats(0.0, 1.0))
def test_threshold_windows_are_in_range_and_shrink_as_p_grows(survival, p):
    ctx = WindowContext(*survival.shape)
    windows = ConfidenceThreshold(p)(survival, ctx).windows
    assert bool(((windows >= 0) & (windows <= survival.shape[1])).all())
    assert bool((ConfidenceThreshold(min(1.0, p + 0.1))(survival, ctx).windows <= windows).all())
