"""Webhook notifications against loopback receivers: every policy change arrives once despite retries,
a receiver that is down never holds a decision, and a refusal is not retried."""

from __future__ import annotations

import json
import threading
import time

import pytest

from sparkgate.collectors.store import Store
from sparkgate.controller.notify import Notifier, Target, message, resolve, slack
from sparkgate.controller.rollout import start
from sparkgate.controller.supervisor import Controller
from sparkgate.demo.fleet import free_port
from sparkgate.policies.rollout import RolloutPolicyError, Webhook, parse_rollout_policy
from tests.collectors.loopback import QuietHandler, serving
from tests.conftest import T0, Clock

POLICY = parse_rollout_policy({"gates": [{"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most"}]})


class Receiver:
    """Answers each notice with the next status of ``script`` (per Idempotency-Key; the last repeats)."""

    def __init__(self, *script: int, hold: threading.Event | None = None):
        self.script, self.hold = script, hold
        self.attempts: list[tuple[str, dict]] = []
        self.accepted: list[dict] = []

    def handler(self) -> type[QuietHandler]:
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                key = self.headers["Idempotency-Key"]
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                tries = sum(k == key for k, _ in receiver.attempts)
                receiver.attempts.append((key, body))
                status = receiver.script[min(tries, len(receiver.script) - 1)]
                if status < 300:
                    receiver.accepted.append(body)
                self.reply(b"{}", "application/json", status)

        return Handler


def wait_until(predicate, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_every_policy_change_arrives_once_despite_retries(tmp_path):
    receiver = Receiver(500, 200)  # every notice fails once, then goes through
    with serving(receiver.handler()) as url, Store(tmp_path / "n.duckdb") as store:
        notifier = Notifier([Target(url, "json", 5.0, 3)], backoff_s=0.01)
        controller = Controller(store, POLICY, observers=[notifier], clock=Clock(T0))
        controller.act("promote", "alice", "looks fine")
        controller.act("abort", "bob")
        notifier.close()
    assert [(n["action"], n["phase_to"], n["revision"]) for n in receiver.accepted] == [
        ("start", "baseline", 1),
        ("promote", "shadow", 2),
        ("abort", "fallback", 3),
    ]
    assert [key for key, _ in receiver.attempts] == [k for k in ("sparkgate-1-start", "sparkgate-2-promote",
                                                                   "sparkgate-3-abort") for _ in range(2)]  # fmt: skip
    assert receiver.accepted[1]["operator"] == "alice" and notifier.sent == 3 and notifier.failed == 0


def test_holds_are_not_announced(tmp_path):
    receiver = Receiver(200)
    with serving(receiver.handler()) as url, Store(tmp_path / "n.duckdb") as store:
        notifier = Notifier([Target(url, "json", 5.0, 0)])
        controller = Controller(store, POLICY, observers=[notifier], clock=Clock(T0))
        controller.tick()  # baseline with no data: an inconclusive hold
        notifier.close()
    assert [n["action"] for n in receiver.accepted] == ["start"]


def test_a_slow_or_dead_receiver_never_holds_a_decision(tmp_path):
    hold = threading.Event()
    slow = Receiver(200, hold=hold)
    dead = f"http://127.0.0.1:{free_port()}"
    with serving(slow.handler()) as url, Store(tmp_path / "n.duckdb") as store:
        notifier = Notifier([Target(url, "json", 30.0, 0), Target(dead, "json", 1.0, 2)], backoff_s=0.01)
        controller = Controller(store, POLICY, observers=[notifier], clock=Clock(T0))
        decision = controller.act("promote", "ops")
        assert decision.phase_to == "shadow" and slow.accepted == []  # decided while the receiver still waits
        hold.set()
        notifier.close()
    assert [n["action"] for n in slow.accepted] == ["start", "promote"]
    assert notifier.sent == 2 and notifier.failed == 2  # the dead receiver: 3 attempts per notice, then given up


def test_a_refused_notice_is_not_retried(tmp_path):
    receiver = Receiver(400)
    with serving(receiver.handler()) as url, Store(tmp_path / "n.duckdb") as store:
        notifier = Notifier([Target(url, "json", 5.0, 5)], backoff_s=0.01)
        Controller(store, POLICY, observers=[notifier], clock=Clock(T0))
        notifier.close()
    assert len(receiver.attempts) == 1 and notifier.failed == 1


@pytest.mark.parametrize("status", [503, None])  # refused by the receiver; nothing listening
def test_a_failed_delivery_is_logged_without_the_webhooks_url(tmp_path, caplog, status):
    """A Slack incoming webhook's path is its secret: every failed attempt logged it in full."""
    receiver = Receiver(status or 200)
    with serving(receiver.handler()) as url, Store(tmp_path / "n.duckdb") as store:
        secret = f"{url if status else f'http://127.0.0.1:{free_port()}'}/services/T000/B000/XXXXSECRETTOKEN"
        notifier = Notifier([Target(secret, "slack", 2.0, 1)], backoff_s=0.01)
        Controller(store, POLICY, observers=[notifier], clock=Clock(T0))
        notifier.close()
    assert notifier.failed == 1 and "gave up notifying a slack webhook at 127.0.0.1" in caplog.text
    assert "XXXXSECRETTOKEN" not in caplog.text


def test_notices_left_at_shutdown_are_counted_and_logged_not_lost_unsaid(tmp_path, caplog):
    hold = threading.Event()
    stuck = Receiver(200, hold=hold)
    with serving(stuck.handler()) as url, Store(tmp_path / "n.duckdb") as store:
        notifier = Notifier([Target(url, "json", 30.0, 0)])
        controller = Controller(store, POLICY, observers=[notifier], clock=Clock(T0))  # start: in delivery
        controller.act("abort", "ops")  # queued behind it
        notifier.close(timeout_s=0.5)
        hold.set()
    assert notifier.dropped == 1 and notifier.sent + notifier.failed <= 1
    assert "notice of revision 2 (abort) not delivered" in caplog.text and url not in caplog.text


def test_slack_messages_carry_the_headline_and_the_gate_table():
    decision = start(POLICY, T0)
    rollback = decision.__class__(
        **{**decision.__dict__, "action": "rollback", "phase_from": "compact", "phase_to": "fallback",
           "reasons": ({"rule": "failure limit"}, {"gate": "tier_miss_rate", "metric": "tier_miss_rate",
                       "value": 0.05, "threshold": 0.02, "direction": "at_most", "samples": 200,
                       "outcome": "fail", "critical": False, "dry_run": False})}
    )  # fmt: skip
    body = slack(rollback)
    assert body["text"] == "sparkgate rollback: compact -> fallback (revision 1): failure limit"
    assert "tier_miss_rate" in body["blocks"][1]["text"]["text"] and "fail" in body["blocks"][1]["text"]["text"]
    assert message(rollback)["gates"][0]["value"] == 0.05


def test_urls_from_the_environment_and_what_the_policy_refuses():
    hooks = (Webhook(url_env="SLACK_HOOK", format="slack"), Webhook(url="https://hooks.example/x"))
    assert [t.url for t in resolve(hooks, {"SLACK_HOOK": "https://hooks.slack.example/T/B/secret"})] == [
        "https://hooks.slack.example/T/B/secret",
        "https://hooks.example/x",
    ]
    with pytest.raises(ValueError, match="notify\\[0\\].url_env: environment variable SLACK_HOOK is not set"):
        resolve(hooks, {})
    with pytest.raises(RolloutPolicyError, match="notify\\[0\\].url: expected exactly one of url and url_env"):
        parse_rollout_policy({"notify": [{"url": "https://a", "url_env": "B"}]})
    with pytest.raises(RolloutPolicyError, match="notify\\[0\\].url: expected an http:// or https:// URL"):
        parse_rollout_policy({"notify": [{"url": "ftp://a"}]})
    with pytest.raises(RolloutPolicyError, match="notify\\[0\\].formt: unknown key"):
        parse_rollout_policy({"notify": [{"url": "https://a", "formt": "slack"}]})
