"""What a request must be before the engine takes it: every problem is refused at ``Engine.submit``, naming
its field, instead of failing later inside a step, where it would stall the requests batched with it or
have the collector refuse the step record they share (docs/design.md §3)."""

from __future__ import annotations

import math
from collections.abc import Container, Sequence
from typing import Protocol

from sparkgate.collectors.schema import MODES, id_problem


class Request(Protocol):
    """What admission reads of an ``engine.Request``."""

    @property
    def request_id(self) -> str: ...
    @property
    def prompt(self) -> Sequence[int]: ...
    @property
    def max_new_tokens(self) -> int: ...
    @property
    def temperature(self) -> float: ...
    @property
    def mode(self) -> str | None: ...


def positions_needed(prompt_len: int, max_new_tokens: int, gamma: int) -> int:
    """Cache positions a request can reach. A verify block starts at the newest committed token and writes
    it with γ drafts; a request still verifies while it has at most ``prompt_len + max_new_tokens - 1``
    tokens, so its last block reaches position ``prompt_len + max_new_tokens + γ - 2``, past the tokens it
    keeps."""
    return prompt_len + max_new_tokens + gamma - 1


def check_request(request: Request, vocab_size: int, cache_len: int, gamma: int, taken: Container[str]) -> None:
    """Raises ``ValueError`` naming the request and the first field that cannot be served: its id (a record
    id, not one ``taken`` by a request still queued or running), prompt (non-empty token ids of the
    vocabulary), ``max_new_tokens`` (≥ 1, within the cache), temperature (finite, ≥ 0) and mode."""
    rid = request.request_id
    why = id_problem(rid) if isinstance(rid, str) else "must be a string"
    if why is not None:
        raise ValueError(f"request_id {rid!r}: {why}")
    if rid in taken:
        raise ValueError(f"request {rid!r}: request_id is already queued or running")
    if not request.prompt:
        raise ValueError(f"request {rid!r} has an empty prompt")
    bad = next((t for t in request.prompt if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"request {rid!r}: prompt token {bad!r} is not in the vocabulary [0, {vocab_size})")
    if request.max_new_tokens < 1:
        raise ValueError(f"request {rid!r} has max_new_tokens={request.max_new_tokens} (< 1)")
    need = positions_needed(len(request.prompt), request.max_new_tokens, gamma)
    if need > cache_len:
        raise ValueError(
            f"request {rid!r} needs {need} positions (prompt {len(request.prompt)} "
            f"+ max_new_tokens {request.max_new_tokens} + gamma - 1) but the cache holds {cache_len}"
        )
    if not (isinstance(request.temperature, (int, float)) and math.isfinite(request.temperature)
            and request.temperature >= 0):  # fmt: skip
        raise ValueError(f"request {rid!r}: temperature={request.temperature!r} must be a finite number >= 0")
    if request.mode is not None and request.mode not in MODES:
        raise ValueError(f"request {rid!r}: unknown verify mode {request.mode!r}; expected one of {list(MODES)}")
