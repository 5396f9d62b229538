"""End to end: ``sparkgate serve --sglang`` in its own process pushing the rollout to three stand-ins that
answer as SGLang's code does (tests/collectors/sglang_stand_in.py cites it), checked at every revision, and
polling their records, whose replica groups the comparison gates compare."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml

from sparkgate.demo.fleet import answers, free_port
from tests.collectors.sglang_stand_in import Server, running
from tests.conftest import record, req

FORCE = "dspark_force_budget_frac"
POLICY = {
    "canary_steps": [0.25],
    "observe_fraction": 0.05,
    "fallback_window": 2,
    "gates": [{"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True}],
}


@contextlib.contextmanager
def serving(tmp_path, policy: dict, servers: list[Server], *extra: str):
    """``sparkgate serve --sglang`` over the running stand-ins; yields its URL and the servers in URL order."""
    (tmp_path / "rollout.yaml").write_text(yaml.safe_dump(policy))
    port = free_port()
    with running(servers[0]) as a, running(servers[1]) as b, running(servers[2]) as c:
        by_url = dict(zip((a, b, c), servers))
        argv = [sys.executable, "-m", "sparkgate", "serve", "--db", str(tmp_path / "c.duckdb"), "--policy",
                str(tmp_path / "rollout.yaml"), "--port", str(port), "--sglang", a, "--sglang", b, "--sglang", c,
                *extra]  # fmt: skip
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not answers(f"{url}/healthz"):
                assert child.poll() is None and time.monotonic() < deadline, child.stderr.read() if child.stderr else ""
                time.sleep(0.2)
            yield url, [by_url[u] for u in sorted(by_url)]
        finally:
            child.terminate()
            child.wait(timeout=30)


def act(url: str, action: str) -> dict:
    return httpx.post(f"{url}/v1/rollout/{action}", json={"operator": "ops"}, timeout=10).json()


def test_serve_walks_three_sglang_servers_through_canary_compact_and_fallback(tmp_path):
    with serving(tmp_path, POLICY, [Server(ranks=2) for _ in range(3)]) as (url, ordered):
        seen = {}
        for action in ("promote", "promote", "promote", "abort"):
            decision = act(url, action)
            seen[(decision["revision"], decision["phase_to"])] = [s.server_args.get(FORCE, "unset") for s in ordered]
    assert seen == {
        (2, "shadow"): [1.0, 1.0, 1.0],  # every server verifies the full window
        (3, "canary"): [None, 1.0, 1.0],  # ceil(0.25 x 3) = 1 server runs the scheduler
        (4, "compact"): [None, None, 1.0],  # the observation server keeps uncensored labels flowing
        (5, "fallback"): [2 / 7] * 3,  # fallback_window / gamma on every server
    }
    assert all(s.posted and all(args.keys() == {FORCE} for args in s.posted) for s in ordered)


def feed(server: Server, stop: threading.Event, regression: float) -> None:
    """Step records as a server writes them, every 20 ms: a server the scheduler runs (budget null) takes
    ``regression`` times as long per step as one held at the full window."""
    ct = 0
    while not stop.wait(0.02):
        ct += 1
        treated = FORCE in server.server_args and server.server_args[FORCE] is None
        reqs = [req(f"q{i}", 5, 2, prefix_len=10 + 3 * ct, req_pool_index=i) for i in range(4)]
        server.push(0, record(ct, "compact", reqs, step_gpu_ms=10.0 * (regression if treated else 1.0)))


def test_serve_polls_the_servers_and_a_slower_treatment_group_fails_its_comparison_and_falls_back(tmp_path):
    policy = {
        "phases": ["baseline", "shadow", "compact"],
        "evaluation_interval_s": 0.5,
        "failure_limit": 0,
        "comparison": {"epoch_s": 0.5, "burn_in_s": 0.4},
        "gates": [{"metric": "p99_step_ratio", "threshold": 1.1, "direction": "at_most", "min_samples": 5}],
    }
    servers, stop = [Server() for _ in range(3)], threading.Event()
    feeders = [threading.Thread(target=feed, args=(s, stop, 1.3), daemon=True) for s in servers]
    with serving(tmp_path, policy, servers, "--sglang-interval", "0.1") as (url, ordered):
        for thread in feeders:
            thread.start()
        try:
            act(url, "promote")
            compact = act(url, "promote")
            assert compact["phase_to"] == "compact"
            assert [s.server_args.get(FORCE, "unset") for s in ordered][:2] == [None, None]  # the treatment group
            deadline, last = time.monotonic() + 60, None
            while time.monotonic() < deadline:
                last = httpx.get(f"{url}/v1/decisions", params={"limit": 1}, timeout=10).json()[0]
                if last["phase_to"] == "fallback":
                    break
                time.sleep(0.3)
        finally:
            stop.set()
    assert last is not None and last["phase_from"] == "compact" and last["phase_to"] == "fallback", last
    (verdict,) = [r for r in last["reasons"] if r.get("gate") == "p99_step_ratio"]
    assert verdict["outcome"] == "fail" and verdict["samples"] >= 5 and verdict["low"] > 1.1
    assert verdict["value"] == pytest.approx(1.3, rel=0.01)
    assert "treatment group against control group" in verdict["method"]
