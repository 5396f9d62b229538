"""Consistency checks: token comparison, the static greedy replay, and the KV-cache state check."""

from __future__ import annotations

import pytest

from sparkgate.policies.window import FixedWindow
from sparkgate.verify_runtime.admission import positions_needed
from sparkgate.verify_runtime.consistency import GreedyReplay, compare, state_check, wanted
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from tests.conftest import tiny_model
from tests.verify_runtime.reference import greedy_decode

GAMMA = 4
pytestmark = pytest.mark.usefixtures("one_thread")


def test_compare_reports_the_first_differing_token():
    assert compare("r", [1, 2, 3], [1, 2, 3, 4]).to_dict() == {
        "request_id": "r",
        "kind": "greedy_replay",
        "tokens": 3,
        "mismatch_at": None,
        "expected": None,
        "got": None,
    }
    check = compare("r", [1, 2, 3], [1, 5, 6])
    assert (check.mismatch_at, check.expected, check.got) == (1, 2, 5)


def test_static_replay_is_the_greedy_continuation():
    target = tiny_model()
    replay = GreedyReplay(target, ModelDrafter(target, noise=1.5), GAMMA)
    prompt = [3, 1, 4, 1, 5]
    assert replay.replay(prompt, 12) == greedy_decode(target, prompt, 12)
    assert wanted(Request("x", prompt, 4, temperature=0.0), "compact", 1.0)
    assert not wanted(Request("x", prompt, 4, temperature=0.7), "compact", 1.0)
    assert not wanted(Request("x", prompt, 4), "shadow", 1.0)


def test_a_request_served_at_the_caches_edge_is_replayed_whole():
    """The replay took 2 tokens fewer than admission allows, so such a request's check covered less of it."""
    target = tiny_model()
    replay = GreedyReplay(target, ModelDrafter(target, noise=1.5), GAMMA)
    prompt = [3, 1, 4, 1, 5]
    most = target.args.max_seq_len - positions_needed(len(prompt), 0, GAMMA)
    assert replay.replay(prompt, most) == greedy_decode(target, prompt, most)


def test_state_check_finds_a_corrupted_cache():
    target = tiny_model()
    engine = Engine(
        target, ModelDrafter(target, noise=1.5), EngineConfig(gamma=GAMMA, max_batch=2), policy=FixedWindow(2)
    )
    for i, mode in enumerate(["compact", "static"]):
        engine.submit(Request(f"s{i}", [3, 1, 4, 1 + i], 20, mode=mode, stop_at_eos=False))
    for _ in range(3):
        engine.step()
    healthy = [state_check(engine, r) for r in engine.active]
    assert all(c.mismatch_at is None and c.kind == "state_rollback" for c in healthy)
    assert engine.run()  # the checks left every request able to finish
    engine.submit(Request("bad", [3, 1, 4, 1], 20, mode="compact", stop_at_eos=False))
    engine.step()
    request = engine.active[0]
    engine.cache.k[:, request.slot, : engine.cache.lengths[request.slot]] *= -3.0  # a committed row gone wrong
    bad = state_check(engine, request)
    assert bad.mismatch_at == len(request.history) and bad.expected != bad.got
