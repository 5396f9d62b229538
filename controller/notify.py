"""Webhook notifications (the rollout policy's ``notify:``): the people on call hear of every decision that
changes the policy, with the gate table, as Argo Rollouts and Flagger tell theirs.

- Non-blocking: ``Notifier.__call__`` only queues; one background thread delivers. A full queue drops
  the oldest undelivered notice (counted in ``dropped``) rather than hold a decision.
- Retries: a connection error, a timeout, HTTP 429 or 5xx is retried ``retries`` times, waiting
  ``backoff_s × 2^k`` (capped at ``MAX_BACKOFF_S``); any other 4xx is final.
- Idempotency: every delivery of one decision carries the same ``Idempotency-Key`` (the ledger revision
  and the action), so a receiver that saw an attempt whose answer was lost can drop the repeat.
- Secrets: a webhook's URL may come from the environment (``url_env``), resolved when the notifier is
  built, so a missing variable is an error at start-up, naming it.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from sparkgate.policies.rollout import Webhook
from sparkgate.policies.vocabulary import CHANGES_POLICY

from .gates import verdict_table
from .rollout_state import Decision

log = logging.getLogger(__name__)
QUEUE_LIMIT = 1000
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class Target:
    """A webhook with its URL resolved."""

    url: str
    format: str
    timeout_s: float
    retries: int


def resolve(webhooks: tuple[Webhook, ...], environ: dict[str, str] | None = None) -> list[Target]:
    """Each webhook with its URL; ValueError naming the variable when a ``url_env`` is unset."""
    env = os.environ if environ is None else environ
    targets = []
    for i, hook in enumerate(webhooks):
        url = hook.url
        if hook.url_env is not None:
            url = env.get(hook.url_env)
            if not url:
                raise ValueError(f"notify[{i}].url_env: environment variable {hook.url_env} is not set")
        assert url is not None  # the policy model holds exactly one of url and url_env
        targets.append(Target(url, hook.format, hook.timeout_s, hook.retries))
    return targets


def message(decision: Decision) -> dict[str, Any]:
    """The generic JSON notice of one decision."""
    rule = decision.reasons[0] if decision.reasons else {}
    return {
        "source": "sparkgate",
        "event": "rollout.decision",
        "revision": decision.revision,
        "action": str(decision.action),
        "phase_from": decision.phase_from,
        "phase_to": decision.phase_to,
        "compact_fraction": decision.compact_fraction,
        "outcome": decision.outcome,
        "rule": rule.get("rule"),
        "operator": decision.operator,
        "decided_at": decision.decided_at,
        "gates": [r for r in decision.reasons if "gate" in r],
    }


def slack(decision: Decision) -> dict[str, Any]:
    """A Slack incoming-webhook message: a headline and the gate table."""
    notice = message(decision)
    headline = (
        f"sparkgate {notice['action']}: {notice['phase_from'] or '-'} -> {notice['phase_to']} "
        f"(revision {notice['revision']}): {notice['rule']}"
        + (f", by {notice['operator']}" if notice["operator"] else "")
    )
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{headline}*"}}]
    if notice["gates"]:
        table = verdict_table(notice["gates"], indent="")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{table}```"}})
    return {"text": headline, "blocks": blocks}


class Notifier:
    """Delivers notices of policy-changing decisions to webhooks from one background thread."""

    def __init__(self, targets: list[Target], backoff_s: float = 0.5, queue_limit: int = QUEUE_LIMIT):
        self.targets, self.backoff_s = targets, backoff_s
        self.sent = self.failed = self.dropped = 0
        self._queue: collections.deque[tuple[Target, Decision]] = collections.deque()
        self._limit = queue_limit
        self._wake = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="sparkgate-notify", daemon=True)
        self._thread.start()

    def __call__(self, decision: Decision) -> None:
        """Queue ``decision`` for every webhook when it changes the policy; returns at once."""
        if decision.action not in CHANGES_POLICY or not self.targets:
            return
        with self._wake:
            for target in self.targets:
                if len(self._queue) >= self._limit:
                    self._queue.popleft()
                    self.dropped += 1
                self._queue.append((target, decision))
            self._wake.notify()

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (waiting at most ``timeout_s``), then stop. What is still queued then is
        given up: counted in ``dropped`` and logged by revision and action (never by URL, which may be a
        secret), so no notice of a policy change vanishes unsaid."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout_s)
        with self._wake:
            left, delivering = list(self._queue), self._thread.is_alive()
            self._queue.clear()
        self.dropped += len(left)
        for target, decision in left:
            log.warning("shutting down: notice of revision %s (%s) not delivered to a %s webhook",
                        decision.revision, decision.action, target.format)  # fmt: skip
        if delivering:
            log.warning("shutting down: a notice was still being delivered (its result is not known)")

    def _run(self) -> None:
        with httpx.Client() as http:
            while True:
                with self._wake:
                    while not self._queue and not self._closed:
                        self._wake.wait()
                    if not self._queue:
                        return
                    target, decision = self._queue.popleft()
                if self._deliver(http, target, decision):
                    self.sent += 1
                else:
                    self.failed += 1

    def _deliver(self, http: httpx.Client, target: Target, decision: Decision) -> bool:
        body = slack(decision) if target.format == "slack" else message(decision)
        headers = {"Idempotency-Key": f"sparkgate-{decision.revision}-{decision.action}"}
        for attempt in range(target.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                response = http.post(target.url, json=body, headers=headers, timeout=target.timeout_s)
            except httpx.HTTPError as exc:
                problem = str(exc) or type(exc).__name__
            else:
                if response.status_code < 300:
                    return True
                problem = f"HTTP {response.status_code}"
                if response.status_code != 429 and response.status_code < 500:
                    break  # the receiver refused this notice; sending it again will not change that
            log.warning("notifying %s of revision %s: %s (attempt %d)", _named(target), decision.revision,
                        problem.replace(target.url, "<url>"), attempt + 1)  # fmt: skip
        log.error("gave up notifying %s of revision %s", _named(target), decision.revision)
        return False


def _named(target: Target) -> str:
    """A webhook as logs name it: its format and host, never its URL, whose path or query may be the
    secret (a Slack incoming webhook's is)."""
    return f"a {target.format} webhook at {urlsplit(target.url).hostname or 'an unparsed host'}"
