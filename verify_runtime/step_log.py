"""What the engine tells of one decode step: its requests' rows and its ``StepRecord`` (docs/design.md §4).

Pure: both read host values the step has already read back (one list per field, one entry per request in
batch order) and change nothing, so the engine's loop keeps the stages that move state and this module the
record's shape. A row's window, full-block acceptance and cap trim come from ``modes.labels``: what its
mode observed, never what it could not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sparkgate.collectors.schema import RequestRow, StepRecord

from .modes import labels
from .tiers import TierChoice


class Labelled(Protocol):
    """What a row reads of an ``engine.Request``."""

    request_id: str
    task: str
    temperature: float


class Stepping(Protocol):
    """What a step record reads of an ``engine.EngineConfig``."""

    replica_id: str
    gamma: int
    phase: str
    policy_revision: int
    sts_version: str | None
    cost_table_version: str | None
    epoch: int | None
    arm: str | None


@dataclass(frozen=True)
class StepOutcome:
    """A step's per-request host values, batch order: the scheduler's suggestion and the window each row
    verified (``limit``), drafts accepted, full-block acceptance, the committed tokens, the drafts, where
    draft 1 went, the confidences and survivals, and the next draft's acceptance probability."""

    modes: list[str]
    suggested: list[int]
    limits: list[int]
    accepted: list[int]
    full: list[int]
    committed: list[list[int]]
    drafts: list[list[int]]
    positions: list[int]
    confidence: list[list[float]]
    survival: list[list[float]]
    next_prob: list[float | None]


def request_rows(reqs: Sequence[Labelled], outcome: StepOutcome, gamma: int) -> list[RequestRow]:
    """One ``RequestRow`` per request; ``next_accept_prob`` only where the row's full-block label is censored
    (recovery reads it; an observed row needs none)."""
    o, rows = outcome, []
    for i, r in enumerate(reqs):
        window, full_accept, cap_trim = labels(o.modes[i], o.limits[i], o.accepted[i], o.full[i], gamma)
        rows.append(
            RequestRow(
                request_id=r.request_id,
                mode=o.modes[i],
                task=r.task,
                temperature=r.temperature,
                window_suggested=o.suggested[i],
                window=window,
                accepted=o.accepted[i],
                full_accept=full_accept,
                cap_trim=cap_trim,
                confidence=o.confidence[i],
                survival=o.survival[i],
                committed_tokens=o.committed[i],
                draft_tokens=o.drafts[i],
                position=o.positions[i],
                next_accept_prob=o.next_prob[i] if full_accept is None else None,
            )
        )
    return rows


@dataclass(frozen=True)
class StepCosts:
    """What a step cost and what its table priced it at: stage wall times (ms, from ``StageClock``: draft,
    schedule, verify, accept, commit), the rows each request verified, the graph tier, host syncs, the
    CPU time, and the scheduler's and the served table's predictions."""

    stage_ms: list[float]
    lens: list[int]
    tier: TierChoice
    host_syncs: int
    cpu_ms: float
    predicted_step_ms: float | None
    table_step_ms: float | None


def step_record(config: Stepping, step_id: int, ts: float, costs: StepCosts, rows: list[RequestRow],
                versions: tuple[str, str], contract: str) -> StepRecord:  # fmt: skip
    """The step's record; ``versions`` is (model, drafter). The accept time counts the commit stage too."""
    draft_ms, schedule_ms, verify_ms, accept_ms, commit_ms = costs.stage_ms
    return StepRecord(
        replica_id=config.replica_id,
        step_id=step_id,
        ts=ts,
        batch_size=len(rows),
        gamma=config.gamma,
        verify_rows=sum(costs.lens),
        tier_rows=costs.tier.tier_rows,
        tier=costs.tier.tier,
        graph_hit=costs.tier.graph_hit,
        miss_reason=costs.tier.miss_reason,
        draft_ms=draft_ms,
        schedule_ms=schedule_ms,
        verify_ms=verify_ms,
        accept_ms=accept_ms + commit_ms,
        step_ms=sum(costs.stage_ms),
        predicted_step_ms=costs.predicted_step_ms,
        table_step_ms=costs.table_step_ms,
        host_syncs=costs.host_syncs,
        phase=config.phase,
        policy_revision=config.policy_revision,
        model_version=versions[0],
        drafter_version=versions[1],
        sts_version=config.sts_version,
        cost_table_version=config.cost_table_version,
        requests=rows,
        contract=contract,
        epoch=config.epoch,
        arm=config.arm,
        step_cpu_ms=costs.cpu_ms,
    )
