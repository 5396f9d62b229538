"""The SGLang push actuator against loopback stand-in servers."""

from __future__ import annotations

import pytest

from sparkgate.controller.actuators import (
    FORCE_KEY,
    ActuatorError,
    SGLangActuator,
    budget_fractions,
)
from sparkgate.policies.payload import PolicyPayload
from tests.collectors.loopback import stand_in


def sglang_ok(path, body):
    return 200, [{"updated": True, "server_args": body["server_args"]}] * 2  # two DP ranks


def payload(phase, fraction, fallback_window=7, gamma=7):
    return PolicyPayload(
        revision=1,
        phase=phase,
        compact_fraction=fraction,
        observe_fraction=0.05,
        fallback_window=fallback_window,
        gamma=gamma,
        cost_table_version=None,
        sts_version=None,
    )


def test_compact_fraction_is_spread_over_servers_in_a_stable_order():
    urls = ["http://c", "http://a", "http://b", "http://d"]
    assert budget_fractions(urls, payload("shadow", 0.0)) == {u: 1.0 for u in sorted(urls)}
    assert budget_fractions(urls, payload("canary", 0.25)) == {
        "http://a": None,
        "http://b": 1.0,
        "http://c": 1.0,
        "http://d": 1.0,
    }
    assert budget_fractions(urls, payload("canary", 0.3)) == {
        "http://a": None,
        "http://b": None,
        "http://c": 1.0,
        "http://d": 1.0,
    }
    assert set(budget_fractions(urls, payload("adaptive", 1.0)).values()) == {None}
    assert set(budget_fractions(urls, payload("fallback", 0.0, fallback_window=2)).values()) == {2 / 7}


def test_fallback_forces_the_full_window_and_canary_restores_the_scheduler():
    with stand_in(sglang_ok) as (a, seen_a), stand_in(sglang_ok) as (b, seen_b):
        actuator = SGLangActuator([a, b])
        assert actuator(payload("fallback", 0.0)) == {a: 1.0, b: 1.0}
        assert seen_a[-1] == ("/set_internal_state", {"server_args": {FORCE_KEY: 1.0}})
        actuator(payload("canary", 0.5))
        first, second = sorted([a, b])
        pushed = {a: seen_a[-1][1], b: seen_b[-1][1]}
        assert pushed[first] == {"server_args": {FORCE_KEY: None}}
        assert pushed[second] == {"server_args": {FORCE_KEY: 1.0}}


def test_a_refusing_or_missing_server_is_reported_after_the_others_were_pushed():
    def refuse(path, body):
        return 200, [{"updated": True}, {"updated": False}]

    with stand_in(refuse) as (bad, _), stand_in(sglang_ok) as (good, seen):
        with pytest.raises(ActuatorError, match=f"{bad}: not updated") as err:
            SGLangActuator([bad, good, "http://127.0.0.1:9"])(payload("fallback", 0.0))
        assert "http://127.0.0.1:9" in str(err.value) and "2 server(s)" in str(err.value)
        assert seen[-1][1] == {"server_args": {FORCE_KEY: 1.0}}
    with pytest.raises(ValueError, match="urls"):
        SGLangActuator([])
