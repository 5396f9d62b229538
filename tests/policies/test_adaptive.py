"""The rollout policy's ``adaptive:`` section: its defaults, and every bad key named at once."""

from __future__ import annotations

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies.adaptive import ADAPTIVE_METRICS, TABLE_METRICS, Adaptive
from sparkgate.policies.rollout import parse_rollout_policy


def test_a_policy_without_the_section_adapts_with_the_defaults():
    assert parse_rollout_policy({}).adaptive == Adaptive()
    assert (Adaptive().min_steps, Adaptive().max_steps, Adaptive().step_time) == (500, 2000, "wall")
    assert set(ADAPTIVE_METRICS) <= set(TABLE_METRICS)
    assert not {"survival_ece", "consistency_mismatches"} & set(TABLE_METRICS)  # not a table's doing


def test_every_bad_key_is_named_with_what_it_must_be():
    bad = {"min_interval_s": -1.0, "max_change": 0.0, "margin": float("nan"), "dead_band": -0.1,
           "holdout_fraction": 1.0, "min_steps": 1, "max_steps": 0}  # fmt: skip
    with pytest.raises(pydantic.ValidationError) as caught:
        Adaptive(**bad)
    text = str(caught.value)
    for key in bad:
        assert f"{key}: expected" in text, key
    with pytest.raises(pydantic.ValidationError, match="max_steps: expected an integer >= min_steps \\(600\\)"):
        Adaptive(min_steps=600, max_steps=500)
    with pytest.raises(pydantic.ValidationError, match="step_time"):
        Adaptive(step_time="gpu")


@given(
    holdout=st.floats(0.01, 0.99),
    min_steps=st.integers(2, 10_000),
    extra=st.integers(0, 10_000),
    change=st.floats(1e-3, 10.0),
)
def test_any_value_inside_the_bounds_is_kept_as_given(holdout, min_steps, extra, change):
    adaptive = Adaptive(holdout_fraction=holdout, min_steps=min_steps, max_steps=min_steps + extra, max_change=change)
    assert (adaptive.holdout_fraction, adaptive.min_steps, adaptive.max_steps, adaptive.max_change) == (
        holdout, min_steps, min_steps + extra, change
    )  # fmt: skip
