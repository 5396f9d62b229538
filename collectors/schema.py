"""Event schema v1 (DESIGN §4): the typed records shared by producer and consumer.

One ``StepRecord`` per verify step per replica, holding one ``RequestRow`` per
request in the batch. Field names are the wire names (JSON / Arrow).

Invariants a valid record holds (``validate`` enforces them):
- ``0 <= window <= gamma``; ``0 <= accepted <= window``;
- ``full_accept`` is None only when censored (compact, ``accepted == window < gamma``),
  and equals ``accepted`` whenever ``accepted < window``;
- ``confidence`` and ``survival`` have ``gamma`` finite values in [0, 1], survival
  non-increasing with depth;
- ``committed_tokens`` holds ``accepted + 1`` token ids.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

SCHEMA_VERSION = 1
MODES = ("static", "shadow", "compact", "cap_accept")
MISS_REASONS = ("over_max_tier", "not_captured", "forced_eager")


@dataclass
class RequestRow:
    request_id: str
    mode: str
    task: str
    temperature: float
    window_suggested: int | None
    window: int
    accepted: int
    full_accept: int | None
    cap_trim: int
    confidence: list[float]
    survival: list[float]
    committed_tokens: list[int]


@dataclass
class StepRecord:
    replica_id: str
    step_id: int
    ts: float
    batch_size: int
    gamma: int
    verify_rows: int
    tier_rows: int
    tier: int
    graph_hit: bool
    miss_reason: str | None
    draft_ms: float
    schedule_ms: float
    verify_ms: float
    accept_ms: float
    step_ms: float
    predicted_step_ms: float | None
    host_syncs: int
    phase: str
    policy_revision: int
    model_version: str
    drafter_version: str
    sts_version: str | None
    cost_table_version: str | None
    requests: list[RequestRow] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict:
        """The wire form: one JSON object with ``requests`` as a list of objects."""
        return dataclasses.asdict(self)
