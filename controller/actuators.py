"""Push actuators: make fleets that do not poll ``/v1/policy`` follow the rollout.

SGLang (docs/design.md §8): ``POST /set_internal_state`` with
``{"server_args": {"dspark_force_budget_frac": x}}``; ``x = 1.0`` verifies the
full window, ``null`` hands the budget back to the scheduler. A server cannot
split its own traffic by request, so the compact fraction is applied across
servers: the first ``ceil(fraction × n)`` servers (in sorted URL order, so a
server keeps its arm) run the scheduler and the rest verify in full. In
fallback every server verifies ``fallback_window / gamma`` of the window.

Every call pushes to every server, so a restarted server converges at the next
evaluation; a server that refuses or cannot be reached is reported in the raised
``ActuatorError`` after the others were still pushed.
"""

from __future__ import annotations

import math

import httpx

from sparkgate.policies.payload import PolicyPayload
from sparkgate.policies.vocabulary import Phase

FORCE_KEY = "dspark_force_budget_frac"


class ActuatorError(RuntimeError):
    """Some servers did not take the setting; the message lists them with the reason."""


def budget_fractions(urls: list[str], payload: PolicyPayload) -> dict[str, float | None]:
    """The forced budget fraction per server for a policy payload (None: the scheduler decides)."""
    ordered = sorted(urls)
    if payload.phase is Phase.FALLBACK:
        forced = payload.fallback_window / payload.gamma
        return {url: forced for url in ordered}
    compact = math.ceil(payload.compact_fraction * len(ordered) - 1e-9)
    return {url: (None if i < compact else 1.0) for i, url in enumerate(ordered)}


class SGLangActuator:
    """Pushes the policy to SGLang servers (base URLs)."""

    def __init__(self, urls: list[str] | tuple[str, ...], timeout_s: float = 5.0):
        if not urls:
            raise ValueError("urls: at least one SGLang server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s

    def __call__(self, payload: PolicyPayload) -> dict[str, float | None]:
        """Push ``payload``'s setting to every server; returns what each was set to."""
        settings = budget_fractions(self.urls, payload)
        failed = []
        with httpx.Client(timeout=self.timeout_s) as http:
            for url, value in settings.items():
                problem = self._push(http, url, value)
                if problem:
                    failed.append(f"{url}: {problem}")
        if failed:
            raise ActuatorError(f"{FORCE_KEY} not set on {len(failed)} server(s): " + "; ".join(failed))
        return settings

    @staticmethod
    def _push(http: httpx.Client, url: str, value: float | None) -> str | None:
        """None on success, else why the server did not take the setting."""
        try:
            response = http.post(f"{url}/set_internal_state", json={"server_args": {FORCE_KEY: value}})
        except httpx.HTTPError as exc:
            return str(exc) or type(exc).__name__
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        try:
            body = response.json()
        except ValueError:
            return "response is not JSON"
        # One answer per data-parallel rank (a list), or a single object.
        answers = body if isinstance(body, list) else [body]
        if not answers or not all(isinstance(a, dict) and a.get("updated") for a in answers):
            return f"not updated: {body!r}"[:300]
        return None
