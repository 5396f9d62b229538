"""End to end: ``sparkgate serve --sglang`` in its own process pushing the rollout to three stand-ins that
answer as SGLang's code does (tests/collectors/sglang_stand_in.py cites it), checked at every revision."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import yaml

from sparkgate.demo.fleet import answers, free_port
from tests.collectors.sglang_stand_in import Server, running

FORCE = "dspark_force_budget_frac"
POLICY = {
    "canary_steps": [0.25],
    "observe_fraction": 0.05,
    "fallback_window": 2,
    "gates": [{"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True}],
}


def test_serve_walks_three_sglang_servers_through_canary_compact_and_fallback(tmp_path):
    servers = [Server(ranks=2) for _ in range(3)]
    policy = tmp_path / "rollout.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    port = free_port()
    with running(servers[0]) as a, running(servers[1]) as b, running(servers[2]) as c:
        by_url = dict(zip((a, b, c), servers))
        ordered = [by_url[url] for url in sorted(by_url)]
        argv = [sys.executable, "-m", "sparkgate", "serve", "--db", str(tmp_path / "c.duckdb"), "--policy", str(policy),
                "--port", str(port), "--sglang", a, "--sglang", b, "--sglang", c]  # fmt: skip
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while not answers(f"{url}/healthz"):
                assert child.poll() is None and time.monotonic() < deadline, child.stderr.read() if child.stderr else ""
                time.sleep(0.2)
            seen = {}
            for action in ("promote", "promote", "promote", "abort"):
                decision = httpx.post(f"{url}/v1/rollout/{action}", json={"operator": "ops"}, timeout=10).json()
                seen[(decision["revision"], decision["phase_to"])] = [
                    s.server_args.get(FORCE, "unset") for s in ordered
                ]
        finally:
            child.terminate()
            child.wait(timeout=30)
    assert seen == {
        (2, "shadow"): [1.0, 1.0, 1.0],  # every server verifies the full window
        (3, "canary"): [None, 1.0, 1.0],  # ceil(0.25 x 3) = 1 server runs the scheduler
        (4, "compact"): [None, None, 1.0],  # the observation server keeps uncensored labels flowing
        (5, "fallback"): [2 / 7] * 3,  # fallback_window / gamma on every server
    }
    assert all(s.posted and all(args.keys() == {FORCE} for args in s.posted) for s in servers)
