"""Consistency checks behind the controller's critical gates (docs/design.md §3 invariants 1 and 4, §6).

- Greedy replay: a sampled greedy request that ran ``compact`` is replayed from
  its prompt in ``static`` with the same model and drafter, and the replay is
  compared token by token with the committed tokens the store holds for it.
- State check: for a live request, the next-token logits read through the KV
  cache are compared with a dense forward over its committed tokens; after any
  rollback of rejected drafts the two must agree.

Any difference is a correctness bug that the controller treats as a critical
gate failure, however rare.

Sampling is a stable hash of the request id, so every replica picks the same
requests and a re-run picks them again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from sparkgate.policies.vocabulary import CheckKind
from sparkgate.policies.window import FixedWindow

from .admission import positions_needed
from .drafters import Drafter
from .engine import Engine, EngineConfig, Request
from .model import Transformer, forward_full

# Logit gap under which the dense top two tokens are a numerical tie: the cached path may pick either.
TIE_MARGIN = 1e-3


def unit_hash(key: str, salt: str) -> float:
    """A uniform number in [0, 1) fixed by ``key`` and ``salt`` (same value in every process)."""
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


@dataclass(frozen=True)
class Check:
    """One comparison, in the controller's ``POST /v1/consistency`` shape."""

    request_id: str
    tokens: int
    mismatch_at: int | None = None
    expected: int | None = None
    got: int | None = None
    kind: CheckKind = CheckKind.GREEDY_REPLAY

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "kind": self.kind,
            "tokens": self.tokens,
            "mismatch_at": self.mismatch_at,
            "expected": self.expected,
            "got": self.got,
        }


def compare(request_id: str, expected: list[int], got: list[int]) -> Check:
    """``expected`` (the static replay) against ``got`` (what was committed), over their common length."""
    n = min(len(expected), len(got))
    for i in range(n):
        if expected[i] != got[i]:
            return Check(request_id, n, i, expected[i], got[i])
    return Check(request_id, n)


class GreedyReplay:
    """Replays prompts greedily in static mode on its own single-slot engine."""

    def __init__(self, model: Transformer, drafter: Drafter, gamma: int):
        self.model, self.drafter, self.gamma = model, drafter, gamma

    def replay(self, prompt: list[int], tokens: int) -> list[int]:
        """The static greedy continuation of ``prompt``, ``tokens`` long (shorter if the cache is smaller)."""
        engine = Engine(
            self.model,
            self.drafter,
            EngineConfig(gamma=self.gamma, max_batch=1, replica_id="consistency"),
            policy=FixedWindow(self.gamma),
        )
        # The most new tokens admission takes (``positions_needed``): a request the engine served at the
        # cache's edge is replayed whole.
        room = engine.cache.max_len - positions_needed(len(prompt), 0, self.gamma)
        n = min(tokens, room)
        if n < 1:
            return []
        engine.submit(Request("replay", list(prompt), n, temperature=0.0, mode="static", stop_at_eos=False))
        return engine.run()["replay"]

    def check(self, request_id: str, prompt: list[int], committed: list[int]) -> Check:
        return compare(request_id, self.replay(prompt, len(committed)), committed)


def wanted(request: Request, mode: str, fraction: float) -> bool:
    """Whether a finished request is in the checked sample: greedy, served compact, hash below ``fraction``."""
    return request.temperature <= 0 and mode == "compact" and unit_hash(request.request_id, "consistency") < fraction


@torch.inference_mode()
def state_check(engine: Engine, request: Request) -> Check:
    """The cache-read next token of an active request against a dense forward over its committed tokens.

    The check re-verifies only the pending token, whose K/V row the next step
    writes again with the same value, so it leaves the request's state as it was.
    """
    device = engine.device
    tokens = torch.zeros(1, 2, dtype=torch.long, device=device)
    tokens[0, 0] = request.history[-1]
    cached = engine.runner.verify(tokens, [1], [request.slot]).logits[0, 0]
    _, dense = forward_full(engine.model, torch.tensor([request.history], device=device))
    top = dense[0, -1].topk(2)
    expected, got = int(top.indices[0]), int(cached.argmax())
    clear = float(top.values[0] - top.values[1]) > TIE_MARGIN
    position = len(request.history)
    if expected != got and clear:
        return Check(request.request_id, position, position, expected, got, CheckKind.STATE_ROLLBACK)
    return Check(request.request_id, position, kind=CheckKind.STATE_ROLLBACK)
