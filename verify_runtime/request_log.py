"""What the engine tells of one request once it stops: its ``RequestRecord`` (docs/design.md §4).

The engine stamps every commit with its unix time and the output length after
it; a finish may then trim the output (past EOS, past ``max_new_tokens``), so
the record counts only the tokens the request was given, commit by commit.
``epoch`` and ``arm`` are set only when the request arrived, was served and
finished inside one switchback epoch, so a comparison never mixes arms.
"""

from __future__ import annotations

from typing import Protocol

from sparkgate.collectors.request_records import RequestRecord
from sparkgate.policies.vocabulary import FinishReason


class Served(Protocol):
    """What the record reads of an ``engine.Request``."""

    request_id: str
    prompt: list[int]
    output: list[int]
    arrival_ts: float | None
    finish_ts: float | None
    finish_reason: str | None
    commit_ts: list[float]
    commit_len: list[int]
    first_mode: str | None
    epoch: int | None
    arm: str | None
    spans_epochs: bool


class Serving(Protocol):
    """What the record reads of an ``engine.EngineConfig``."""

    replica_id: str
    default_mode: str
    phase: str
    policy_revision: int
    epoch: int | None


def request_record(request: Served, config: Serving, contract: str | None) -> RequestRecord:
    """The record of a finished or cancelled ``request`` served under ``config``."""
    assert request.arrival_ts is not None and request.finish_ts is not None, "submitted and finished"
    offsets, tokens, before = [], [], 0
    for ts, length in zip(request.commit_ts, request.commit_len):
        delivered = min(length, len(request.output)) - before
        if delivered > 0:
            offsets.append(max(0.0, (ts - request.arrival_ts) * 1000))
            tokens.append(delivered)
            before += delivered
    whole = request.epoch is not None and not request.spans_epochs and request.epoch == config.epoch
    return RequestRecord(
        replica_id=config.replica_id,
        request_id=request.request_id,
        arrival_ts=request.arrival_ts,
        first_token_ts=request.arrival_ts + offsets[0] / 1000 if offsets else None,
        finish_ts=max(request.finish_ts, request.arrival_ts + (offsets[-1] / 1000 if offsets else 0.0)),
        finish_reason=request.finish_reason or FinishReason.CANCELLED,
        prompt_tokens=len(request.prompt),
        output_tokens=sum(tokens),
        mode=request.first_mode or config.default_mode,
        phase=config.phase,
        policy_revision=config.policy_revision,
        commit_offsets_ms=offsets,
        commit_tokens=tokens,
        epoch=request.epoch if whole else None,
        arm=request.arm if whole else None,
        contract=contract,
    )
