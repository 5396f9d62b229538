"""The policy payload: one typed model, so a key renamed or a value out of range fails where it is read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sparkgate.policies.payload import PolicyPayload, SwitchbackSpec
from sparkgate.policies.vocabulary import Phase

GOOD = {
    "revision": 3,
    "phase": "canary",
    "compact_fraction": 0.25,
    "observe_fraction": 0.05,
    "fallback_window": 7,
    "gamma": 7,
    "cost_table_version": "ct-1",
    "cost_tables": {"ct-1": "ct-1+a2"},
    "sts_version": None,
    "switchback": None,
}


def test_a_payload_round_trips_through_json():
    payload = PolicyPayload.model_validate(GOOD)
    assert payload.phase is Phase.CANARY
    assert PolicyPayload.model_validate_json(payload.model_dump_json()) == payload
    assert payload.model_dump(mode="json") == GOOD


@pytest.mark.parametrize(
    "change, field",
    [
        ({"phase": "rollout"}, "phase"),
        ({"compact_fraction": 1.5}, "compact_fraction"),
        ({"gamma": 0}, "gamma"),
        ({"revision": -1}, "revision"),
        ({"windows": 3}, "windows"),
        # each of these used to pass, and the replica switched phase before schedule() raised
        ({"fallback_window": 8}, "fallback_window"),
        ({"switchback": {"seed": 0, "epoch_s": float("inf"), "origin": 0.0}}, "switchback"),
        ({"switchback": {"seed": 0, "epoch_s": 10.0, "origin": float("nan")}}, "switchback"),
    ],
)
def test_a_bad_payload_names_the_field(change, field):
    with pytest.raises(ValidationError) as caught:
        PolicyPayload.model_validate({**GOOD, **change})
    assert [e["loc"][0] for e in caught.value.errors()] == [field]


def test_a_missing_key_is_an_error_not_a_none():
    body = dict(GOOD)
    del body["sts_version"]
    with pytest.raises(ValidationError, match="sts_version"):
        PolicyPayload.model_validate(body)


@given(st.sampled_from(list(Phase)), st.floats(0, 1), st.integers(1, 64))
def test_every_valid_payload_survives_the_wire(phase, fraction, gamma):
    payload = PolicyPayload(
        revision=1, phase=phase, compact_fraction=fraction, observe_fraction=0.5, fallback_window=gamma,
        gamma=gamma, cost_table_version=None, cost_tables={"g": "g+a1"}, sts_version="s",
        switchback=SwitchbackSpec(seed=gamma, epoch_s=fraction + 0.5, origin=1.75e9),
    )  # fmt: skip
    assert payload.schedule() is not None and payload.schedule().epoch_s == fraction + 0.5
    assert PolicyPayload.model_validate_json(payload.model_dump_json()) == payload
