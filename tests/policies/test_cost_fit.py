"""Fitting a cost table to measured steps, and bounding one update."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.policies.cost_fit import (
    StepTimes,
    bounded,
    change,
    fit_additive,
    grid_ms,
    median_relative_error,
    predict_ms,
)
from sparkgate.policies.cost_model import AdditiveCostTable, CostMeta, CostTableError, StepsPerSecondTable

PARENT = AdditiveCostTable(
    bias_seconds=0.006,
    bs_probes=(1, 8, 32, 64),
    alpha_seconds=(0.0, 0.002, 0.006, 0.02),
    m_probes=(8, 64, 256, 512),
    theta_seconds=(0.0, 0.004, 0.02, 0.05),
    meta=CostMeta(hardware={"cpu": "x"}, model="m", tiers=(8, 16, 32, 64, 128, 256, 512), version="static-1"),
)
PROBES = (PARENT.bs_probes, PARENT.m_probes)


def steps_from(table: AdditiveCostTable, n: int, noise: float, seed: int) -> StepTimes:
    """Steps timed by ``table`` itself, with multiplicative lognormal noise, and a few preempted ones."""
    g = torch.Generator().manual_seed(seed)
    batch = torch.randint(1, 65, (n,), generator=g)
    rows = batch + (torch.rand(n, generator=g) * 7 * batch).round().to(torch.int64)
    truth = predict_ms(table, StepTimes(batch, rows, torch.ones(n)))
    ms = truth * torch.exp(noise * torch.randn(n, generator=g, dtype=torch.float64))
    ms[torch.rand(n, generator=g) < 0.03] *= 10  # preempted steps: the robust fit must shrug them off
    return StepTimes(batch, rows, ms)


def scaled(table: AdditiveCostTable, factor: float) -> AdditiveCostTable:
    return dataclasses.replace(
        table,
        bias_seconds=table.bias_seconds * factor,
        alpha_seconds=tuple(a * factor for a in table.alpha_seconds),
        theta_seconds=tuple(t * factor for t in table.theta_seconds),
    )


def test_the_fit_recovers_a_table_the_parent_misprices_by_half():
    truth = scaled(PARENT, 1.6)
    steps = steps_from(truth, 4000, 0.05, 0)
    assert median_relative_error(PARENT, steps) > 0.3
    fitted = fit_additive(PARENT, steps, "static-1+a1")
    assert median_relative_error(fitted, steps) < 0.06
    assert fitted.meta == dataclasses.replace(PARENT.meta, version="static-1+a1")  # probes, tiers, fingerprints kept
    assert fitted.bs_probes == PARENT.bs_probes and fitted.m_probes == PARENT.m_probes


def test_a_probe_no_step_came_near_keeps_the_parent_value():
    truth = scaled(PARENT, 1.5)
    steps = steps_from(truth, 2000, 0.05, 1)
    small = steps.take(steps.verify_rows <= 64)  # nothing near the 256- and 512-row probes
    fitted = fit_additive(PARENT, small)
    assert fitted.theta_seconds[-1] == pytest.approx(PARENT.theta_seconds[-1], rel=0.05)


def test_a_1d_table_and_no_steps_are_refused_by_name():
    sps = StepsPerSecondTable((8, 64), (100.0, 50.0), 64)
    one = StepTimes(torch.tensor([1]), torch.tensor([8]), torch.tensor([5.0]))
    with pytest.raises(CostTableError, match="additive"):
        fit_additive(sps, one)
    with pytest.raises(CostTableError, match="at least one"):
        fit_additive(PARENT, one.take(slice(0, 0)))
    with pytest.raises(ValueError, match="must match"):
        StepTimes(torch.tensor([1, 2]), torch.tensor([8]), torch.tensor([5.0]))


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_a_step_time_that_is_not_a_positive_number_is_refused_by_index(bad):
    # The fit's least squares failed inside LAPACK on one such step ("INTERNAL ASSERT FAILED").
    with pytest.raises(ValueError, match=rf"^StepTimes: ms\[1\]={bad}: must be a finite number > 0$"):
        StepTimes(torch.tensor([1, 2, 3]), torch.tensor([8, 8, 8]), torch.tensor([5.0, bad, 6.0]))


@settings(max_examples=40, deadline=None)
@given(st.floats(0.2, 5.0), st.floats(0.01, 1.0), st.integers(0, 1000))
def test_an_update_never_moves_a_prediction_by_more_than_the_bound(factor, max_change, seed):
    truth = scaled(PARENT, factor)
    candidate = fit_additive(PARENT, steps_from(truth, 300, 0.1, seed))
    limited = bounded(PARENT, candidate, max_change)
    assert change(PARENT, limited, PROBES) <= 1 + max_change + 1e-9
    ratio = grid_ms(limited, PROBES) / grid_ms(PARENT, PROBES)
    assert bool((ratio > 0).all())
    if change(PARENT, candidate, PROBES) <= 1 + max_change:
        assert limited == candidate  # within the bound it is the candidate itself


def test_bounded_moves_towards_the_candidate_as_far_as_the_bound_allows():
    candidate = scaled(PARENT, 3.0)
    limited = bounded(PARENT, candidate, 0.5)
    assert change(PARENT, limited, PROBES) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="max_change"):
        bounded(PARENT, candidate, -0.1)


def test_a_parent_whose_first_probe_is_not_its_cheapest_is_kept_where_no_step_came_and_bounded_exactly():
    # A valid table (values >= 0) that neither profiler writes: alpha falls after its first probe. Its
    # values relative to the first probe are negative; they used to be clamped to 0 after the mixing step was
    # chosen, which moved a prediction by 1.27x under max_change 0.05.
    parent = AdditiveCostTable(
        bias_seconds=0.010,
        bs_probes=(1, 8, 32),
        alpha_seconds=(0.004, 0.001, 0.002),
        m_probes=(1, 64, 256),
        theta_seconds=(0.0, 0.004, 0.012),
    )
    probes = (parent.bs_probes, parent.m_probes)
    rows = torch.tensor([1, 8, 30, 64, 120, 200, 256] * 50)
    at_one = StepTimes(
        torch.ones_like(rows), rows, predict_ms(parent, StepTimes(torch.ones_like(rows), rows, torch.ones(350)))
    )
    fitted = fit_additive(parent, at_one)  # every step at batch size 1, priced as the parent prices it
    assert change(parent, fitted, probes) == pytest.approx(1.0, abs=1e-6)
    candidate = fit_additive(parent, StepTimes(at_one.batch_size, rows, at_one.ms * 1.5))
    limited = bounded(parent, candidate, 0.05)
    assert change(parent, limited, probes) <= 1.05 + 1e-9
    assert min(limited.alpha_seconds) >= 0 and min(limited.theta_seconds) >= 0 and limited.bias_seconds > 0
