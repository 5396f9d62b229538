"""Properties of the prefix scheduler, checked against a plain-Python reference, and its tie-break and
prefix repair on hand-made cases."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.policies.cost_model import AdditiveCostTable
from sparkgate.policies.scheduler import (
    admission_order,
    assign_windows,
    best_budget,
    clean_survival,
    expected_committed,
)
from sparkgate.policies.window import CostAwareScheduler, WindowContext
from tests.conftest import survivals


@st.composite
def tables(draw):
    theta = draw(st.lists(st.floats(0.0, 1.0), min_size=3, max_size=3))
    return AdditiveCostTable(
        bias_seconds=draw(st.floats(0.01, 2.0)),
        bs_probes=(1,),
        alpha_seconds=(0.0,),
        m_probes=(1, 8, 40),
        theta_seconds=tuple(sorted(theta)),
    )


def reference_windows(survival: torch.Tensor, budget: int) -> list[int]:
    """Top-``budget`` (request, depth) cells by (survival desc, depth asc, request asc)."""
    s = clean_survival(survival).tolist()
    cells = sorted(((-v, d, r) for r, row in enumerate(s) for d, v in enumerate(row)))
    windows = [0] * len(s)
    for _, _, r in cells[:budget]:
        windows[r] += 1
    return windows


@settings(max_examples=150, deadline=None)
@given(survivals(), st.data())
def test_windows_match_the_reference_top_k_and_are_prefixes(survival, data):
    batch, gamma = survival.shape
    budget = data.draw(st.integers(0, batch * gamma))
    requests, _ = admission_order(clean_survival(survival))
    windows = assign_windows(requests, budget, batch)
    assert windows.tolist() == reference_windows(survival, budget)
    # Prefix: a request's admitted cells are exactly its first `window` depths.
    admitted_depths = {r: [] for r in range(batch)}
    for position, r in enumerate(requests.tolist()[:budget]):
        admitted_depths[r].append(sum(1 for q in requests.tolist()[:position] if q == r))
    for r, depths in admitted_depths.items():
        assert depths == list(range(int(windows[r])))


@settings(max_examples=100, deadline=None)
@given(survivals(), st.data())
def test_windows_are_monotone_in_budget(survival, data):
    batch, gamma = survival.shape
    low = data.draw(st.integers(0, batch * gamma))
    high = data.draw(st.integers(low, batch * gamma))
    requests, _ = admission_order(clean_survival(survival))
    assert bool((assign_windows(requests, low, batch) <= assign_windows(requests, high, batch)).all())


@settings(max_examples=100, deadline=None)
@given(survivals(), tables(), st.integers(0, 3))
def test_scheduler_windows_are_in_range_and_its_budget_is_optimal(survival, table, min_window):
    batch, gamma = survival.shape
    decision = CostAwareScheduler(table, min_window=min_window)(survival, WindowContext(batch, gamma))
    windows = decision.windows
    assert windows.dtype == torch.int64 and windows.shape == (batch,)
    assert bool(((windows >= min(min_window, gamma)) & (windows <= gamma)).all())
    assert int(windows.sum()) == int(decision.budget)
    # Brute force over every feasible budget: none commits more tokens per second.
    _, admitted = admission_order(clean_survival(survival), min(min_window, gamma))
    best = 0.0
    for k in range(batch * min(min_window, gamma), batch * gamma + 1):
        tau = batch + float(admitted[:k].sum())
        best = max(best, tau / float(table.step_seconds(batch, torch.tensor([float(batch + k)]))[0]))
    assert float(decision.predicted_tokens_per_s) >= best * (1 - 1e-5)


def test_tie_break_is_survival_then_depth_then_request():
    survival = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    requests, _ = admission_order(clean_survival(survival))
    assert requests.tolist() == [0, 1, 2, 0, 1, 2]
    assert assign_windows(requests, 4, 3).tolist() == [2, 1, 1]
    # Survival first; among equal survivals the shallower depth beats the lower request.
    survival = torch.tensor([[0.5, 0.5], [0.7, 0.5]])
    requests, _ = admission_order(clean_survival(survival))
    assert requests.tolist() == [1, 0, 0, 1]


def test_wobbly_survivals_still_give_prefixes():
    # Calibration round-off: depth 2 a hair above depth 1 must not be admitted before it.
    survival = torch.tensor([[0.5, 0.5000001, float("nan")], [0.6, 0.1, 0.0]])
    requests, admitted = admission_order(clean_survival(survival))
    assert requests.tolist()[:3] == [1, 0, 0]
    assert admitted.tolist()[-1] == 0.0


raw_survivals = st.integers(1, 5).flatmap(
    lambda gamma: st.lists(
        st.lists(st.floats(-2.0, 2.0) | st.just(float("nan")), min_size=gamma, max_size=gamma), min_size=1, max_size=4
    )
)


@settings(max_examples=100, deadline=None)
@given(raw_survivals)
def test_clean_survival_is_a_non_increasing_probability_and_leaves_clean_input_alone(rows):
    cleaned = clean_survival(torch.tensor(rows, dtype=torch.float64))
    assert cleaned.dtype == torch.float32 and cleaned.shape == (len(rows), len(rows[0]))
    assert bool(((cleaned >= 0) & (cleaned <= 1)).all())
    assert bool((cleaned[:, 1:] <= cleaned[:, :-1]).all())
    assert torch.equal(clean_survival(cleaned), cleaned)


def test_expected_tokens_count_one_per_request_and_ties_go_to_the_smaller_budget():
    tau = expected_committed(torch.tensor([0.9, 0.5, 0.0]), batch_size=2)
    assert torch.allclose(tau, torch.tensor([2.0, 2.9, 3.4, 3.4]))
    assert int(best_budget(tau, torch.ones(4))) == 2  # the zero-survival cell adds nothing: not taken
    assert int(best_budget(tau, torch.tensor([1.0, 1.0, float("inf"), float("inf")]))) == 1  # infeasible
    assert int(best_budget(tau, torch.tensor([1.0, 2.0, 4.0, 8.0]))) == 0
