"""Properties of the prefix scheduler, checked against a plain-Python reference."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.policies.cost_model import AdditiveCostTable
from sparkgate.policies.scheduler import admission_order, assign_windows, clean_survival
from sparkgate.policies.window import (
    ConfidenceThreshold,
    CostAwareScheduler,
    WindowContext,
)

# Few distinct values so ties are common: the tie-break is what is under test.
CONFIDENCES = st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9, 1.0])


@st.composite
def survivals(draw, max_batch=6, max_gamma=5):
    batch = draw(st.integers(1, max_batch))
    gamma = draw(st.integers(1, max_gamma))
    conf = draw(st.lists(st.lists(CONFIDENCES, min_size=gamma, max_size=gamma), min_size=batch, max_size=batch))
    return torch.cumprod(torch.tensor(conf, dtype=torch.float32), dim=1)


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


@settings(max_examples=100, deadline=None)
@given(survivals(), st.floats(0.0, 1.0))
def test_threshold_windows_are_in_range_and_shrink_as_p_grows(survival, p):
    ctx = WindowContext(*survival.shape)
    windows = ConfidenceThreshold(p)(survival, ctx).windows
    assert bool(((windows >= 0) & (windows <= survival.shape[1])).all())
    assert bool((ConfidenceThreshold(min(1.0, p + 0.1))(survival, ctx).windows <= windows).all())
