"""The four verify modes: what each verifies and may commit, and the labels it logs, which the collectors accept."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.collectors.schema import MODES, RequestRow
from sparkgate.collectors.validate import validate
from sparkgate.verify_runtime.modes import labels, mode_codes, verify_plan
from tests.collectors.strategies import step


def test_mode_codes_are_the_collectors_order_and_unknown_modes_are_named():
    assert mode_codes(["compact", "static", "cap_accept", "shadow"]).tolist() == [
        MODES.index(m) for m in ("compact", "static", "cap_accept", "shadow")
    ]
    with pytest.raises(ValueError, match=r"unknown verify mode\(s\) \['fast', 'wide'\]"):
        mode_codes(["static", "wide", "fast"])


def test_verify_plan_follows_the_mode_table():
    modes = ["static", "shadow", "cap_accept", "compact"]
    verified, limit = verify_plan(mode_codes(modes), torch.tensor([2, 2, 2, 2]), gamma=5)
    assert verified.tolist() == [5, 5, 5, 2]  # only compact verifies fewer than gamma
    assert limit.tolist() == [5, 5, 2, 2]  # cap_accept verifies the block but commits within the window


@given(st.sampled_from(list(MODES)), st.integers(1, 8), st.data())
def test_logged_labels_pass_the_collectors_validation(mode, gamma, data):
    window = data.draw(st.integers(0, gamma))
    full = data.draw(st.integers(0, gamma))  # a*, what the full block would accept
    accepted = full if mode in ("static", "shadow") else min(full, window)
    logged_window, full_accept, cap_trim = labels(mode, window, accepted, full, gamma)
    censored = mode == "compact" and accepted == window < gamma
    assert logged_window == (gamma if mode in ("static", "shadow") else window)
    assert full_accept == (None if censored else full)
    assert cap_trim == (full - accepted if mode == "cap_accept" else 0)
    row = RequestRow(
        "r",
        mode,
        "chat",
        0.0,
        window if mode == "shadow" else None,
        logged_window,
        accepted,
        full_accept,
        cap_trim,
        [0.5] * gamma,
        [0.5 ** (k + 1) for k in range(gamma)],
        list(range(accepted + 1)),
    )
    assert validate(step(gamma=gamma, requests=[row])) == []
