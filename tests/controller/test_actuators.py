"""The SGLang push actuator against stand-ins that answer as SGLang's own code does
(tests/collectors/sglang_stand_in.py cites it: one boolean per DP rank; the budget fraction in (0, 1] or null)."""

from __future__ import annotations

import pytest

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.sglang import SGLangPoller
from sparkgate.controller.actuators import (
    FORCE_KEY,
    MIN_FRACTION,
    ActuatorError,
    SGLangActuator,
    arms,
    budget_fractions,
)
from tests.collectors.sglang_stand_in import Server, running
from tests.conftest import policy_payload


def payload(phase, fraction, fallback_window=7, gamma=7, observe=0.05):
    return policy_payload(phase, fraction, fallback_window=fallback_window, gamma=gamma, observe_fraction=observe)


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
    assert set(budget_fractions(urls, payload("fallback", 0.0, fallback_window=2)).values()) == {2 / 7}


def test_arms_name_the_servers_running_the_scheduler_treatment_by_the_ids_their_replicas_are_stored_under(store):
    urls = ["https://b:2/", "http://a:1", "http://a:10"]
    poller_ids = [SGLangPoller(url, Ingestor(store)).replica_id(rank) for url in urls for rank in (0, 11)]
    for phase, fraction in (("shadow", 0.0), ("canary", 0.25), ("compact", 1.0)):
        found = dict(arms(urls, payload(phase, fraction)))
        by_url = budget_fractions(urls, payload(phase, fraction))
        # Each stored replica id starts with exactly one server's prefix: the server its arm is pushed to.
        for url, replica in zip([u for u in urls for _ in (0, 11)], poller_ids, strict=True):
            (prefix,) = [p for p in found if replica.startswith(p)]
            fraction_pushed = by_url[url]
            assert found[prefix] == ("treatment" if fraction_pushed is None else "control")
    assert arms(urls, payload("fallback", 0.0, fallback_window=2)) == ()  # every server the same window


def test_serving_phases_keep_observation_servers_at_the_full_window():
    urls = [f"http://s{i}" for i in range(10)]
    # compact fraction 1: ceil(0.05 x 10) = 1 server still verifies in full, so uncensored labels flow.
    assert list(budget_fractions(urls, payload("compact", 1.0)).values()) == [None] * 9 + [1.0]
    assert list(budget_fractions(urls, payload("adaptive", 1.0, observe=0.25)).values()) == [None] * 7 + [1.0] * 3
    assert list(budget_fractions(urls, payload("canary", 0.5)).values()) == [None] * 5 + [1.0] * 5
    # One server cannot be both arms: it runs the scheduler.
    assert budget_fractions(["http://only"], payload("compact", 1.0)) == {"http://only": None}


def test_a_fallback_window_of_zero_is_a_fraction_sglang_accepts():
    server = Server()
    with running(server) as url:
        assert SGLangActuator([url])(payload("fallback", 0.0, fallback_window=0)) == {url: MIN_FRACTION}
    assert server.server_args == {FORCE_KEY: MIN_FRACTION}


def test_fallback_forces_the_full_window_and_canary_restores_the_scheduler():
    a_server, b_server = Server(ranks=2), Server(ranks=2)
    with running(a_server) as a, running(b_server) as b:
        actuator = SGLangActuator([a, b])
        assert actuator(payload("fallback", 0.0)) == {a: 1.0, b: 1.0}
        assert a_server.posted[-1] == {FORCE_KEY: 1.0} and a_server.server_args == {FORCE_KEY: 1.0}
        actuator(payload("canary", 0.5))
        first, second = sorted([(a, a_server), (b, b_server)])
        assert first[1].server_args == {FORCE_KEY: None}
        assert second[1].server_args == {FORCE_KEY: 1.0}


def test_a_refusing_or_missing_server_is_reported_after_the_others_were_pushed():
    refusing, good_server = Server(ranks=2, refuse=frozenset({FORCE_KEY})), Server()
    with running(refusing) as bad, running(good_server) as good:
        with pytest.raises(ActuatorError, match=f"{bad}: not updated: \\[False, False\\]") as err:
            SGLangActuator([bad, good, "http://127.0.0.1:9"])(payload("fallback", 0.0))
        assert "http://127.0.0.1:9" in str(err.value) and "2 server(s)" in str(err.value)
        assert good_server.server_args == {FORCE_KEY: 1.0}
    with pytest.raises(ValueError, match="urls"):
        SGLangActuator([])
