"""Push actuators: make fleets that do not poll ``/v1/policy`` follow the rollout.

SGLang (docs/design.md §8): ``POST /set_internal_state`` with
``{"server_args": {"dspark_force_budget_frac": x}}``; ``x = 1.0`` verifies the
full window, ``null`` hands the budget back to the scheduler. SGLang answers one
boolean per DP rank (``[true, true]``) and accepts x only in (0, 1] or null.

A server cannot split its own traffic by request (its verify mode is fixed at
launch), so the rollout's fractions are applied across servers, in sorted URL
order so a server keeps its arm:

- the first ``ceil(compact_fraction × n)`` servers run the scheduler;
- the last ``max(1, ceil(observe_fraction × n))`` stay at 1.0 whenever some server
  runs the scheduler, so uncensored labels keep flowing for the calibration gates
  even at compact fraction 1 (a one-server fleet has no second server to spare:
  it runs the scheduler, and its calibration gates stay inconclusive);
- in fallback every server gets ``fallback_window / gamma``: SGLang's scheduler
  turns a forced fraction into one draft budget for the batch, ``int(x × bs ×
  γ)`` draft slots (``HostConfidenceBudgetPlanner.compute_budget``: the fraction
  of the survival matrix's elements, ``bs × γ``) shared out to the requests'
  likeliest positions (``schedule_verify_lens_topk``), so its requests verify
  ``fallback_window`` drafts on average, not each exactly; a fallback window of 0
  is sent as the smallest positive fraction, which that floors to a zero budget.

The servers that run the scheduler are the treatment group and those held at 1.0
the control (``arms``): the comparison gates compare the two groups slice by slice
(``controller.comparison.Groups``), since no server can alternate arms by itself.

Every call pushes to every server, so a restarted server converges at the next
evaluation; a server that refuses or cannot be reached is reported in the raised
``ActuatorError`` after the others were still pushed.
"""

from __future__ import annotations

import math

import httpx

from sparkgate.collectors.sglang import replica_prefix
from sparkgate.policies.payload import PolicyPayload
from sparkgate.policies.vocabulary import Arm, Phase

FORCE_KEY = "dspark_force_budget_frac"
# Below 1 / (batch × γ) for any batch a server runs: the planner's budget is then 0.
MIN_FRACTION = 1e-6


class ActuatorError(RuntimeError):
    """Some servers did not take the setting; the message lists them with the reason."""


def budget_fractions(urls: list[str], payload: PolicyPayload) -> dict[str, float | None]:
    """The forced budget fraction per server for a policy payload (None: the scheduler decides)."""
    ordered = sorted(urls)
    if payload.phase is Phase.FALLBACK:
        forced = max(payload.fallback_window / payload.gamma, MIN_FRACTION)
        return {url: forced for url in ordered}
    n = len(ordered)
    compact = math.ceil(payload.compact_fraction * n - 1e-9)
    if compact and n > 1:
        observers = max(1, math.ceil(payload.observe_fraction * n - 1e-9))
        compact = min(compact, n - observers)
    return {url: (None if i < compact else 1.0) for i, url in enumerate(ordered)}


def arms(urls: list[str], payload: PolicyPayload) -> tuple[tuple[str, Arm], ...]:
    """Each server's arm under ``payload``, keyed by the prefix of its replicas' ids; fallback has none (every
    server verifies the fallback window: there is nothing to compare)."""
    if payload.phase is Phase.FALLBACK:
        return ()
    return tuple(
        (replica_prefix(url), Arm.TREATMENT if fraction is None else Arm.CONTROL)
        for url, fraction in budget_fractions(urls, payload).items()
    )


class SGLangActuator:
    """Pushes the policy to SGLang servers (base URLs)."""

    def __init__(self, urls: list[str] | tuple[str, ...], timeout_s: float = 5.0):
        if not urls:
            raise ValueError("urls: at least one SGLang server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s

    def arms(self, payload: PolicyPayload) -> tuple[tuple[str, Arm], ...]:
        return arms(self.urls, payload)

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
        # One boolean per data-parallel rank: TokenizerManager returns [res.updated for res in responses].
        if not (isinstance(body, list) and body and all(answer is True for answer in body)):
            return f"not updated: {body!r}"[:300]
        return None
