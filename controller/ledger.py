"""The decisions table as the rollout's ledger: write a decision before it takes effect, read them back.

A restarted controller replays the ledger (``load_state``) and so resumes the
same phase, stage, revision, pass streak and failure count. When the policy file
changed so that the persisted stage no longer exists, ``load_state`` says so and
the caller decides (the supervisor rolls back to fallback, recording why).
"""

from __future__ import annotations

import json

from sparkgate.collectors.store import Store
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import CHANGES_POLICY

from .rollout_state import Decision, RolloutState, replay, stage_of

_COLUMNS = (
    "decided_at, revision, phase_from, phase_to, compact_fraction, action, outcome, reasons, operator, contract, rung"
)
# Policy changes, as a SQL filter on ``action`` (its parameters: ``sorted(CHANGES_POLICY)``).
_CHANGES = f"action IN ({', '.join('?' * len(CHANGES_POLICY))})"


def record(store: Store, decision: Decision) -> None:
    """Persist ``decision``; returns after the commit."""
    store.record_decision(
        decision.revision,
        decision.phase_from,
        decision.phase_to,
        decision.action,
        list(decision.reasons),
        decision.decided_at,
        compact_fraction=decision.compact_fraction,
        outcome=decision.outcome,
        operator=decision.operator,
        contract=decision.contract,
        rung=decision.rung,
    )


def _decision(row: dict, policy: RolloutPolicy | None) -> Decision:
    stage = None
    if policy is not None and row["action"] in CHANGES_POLICY:
        stage = stage_of(policy, row["phase_to"], row["compact_fraction"] or 0.0, row["phase_from"], row["rung"])
    return Decision(
        row["decided_at"],
        row["revision"],
        row["phase_from"],
        row["phase_to"],
        row["compact_fraction"] or 0.0,
        row["action"],
        row["outcome"],
        tuple(json.loads(row["reasons"])),
        row["operator"],
        stage,
        row["contract"],
        row["rung"],
    )


def decisions(
    store: Store, limit: int | None = None, since: float | None = None, changes_only: bool = False
) -> list[Decision]:
    """Persisted decisions, oldest first: the newest ``limit`` of them, from ``since`` on."""
    clauses: list[str] = ["TRUE"]
    params: list[object] = []
    if since is not None:
        clauses.append("decided_at >= ?")
        params.append(since)
    if changes_only:
        clauses.append(_CHANGES)
        params.extend(sorted(CHANGES_POLICY))
    # rowid breaks ties between decisions made in the same clock tick, in insertion order.
    sql = f"SELECT {_COLUMNS} FROM decisions WHERE {' AND '.join(clauses)} ORDER BY decided_at DESC, rowid DESC"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    rows = store.query(sql, params).to_pylist()
    return [_decision(r, None) for r in reversed(rows)]


def _decided_before(before: float | None) -> tuple[str, list]:
    return ("decided_at < ?", [before]) if before is not None else ("TRUE", [])


def _last_change_row(store: Store, before: float | None) -> dict | None:
    """The newest policy change decided before ``before`` (any, for None) as written, with its ``rowid``:
    by insertion, not ``decided_at``, which a wall clock stepped back can make an older decision's later."""
    until, params = _decided_before(before)
    rows = store.query(
        f"SELECT rowid, {_COLUMNS} FROM decisions WHERE {until} AND {_CHANGES} ORDER BY rowid DESC LIMIT 1",
        [*params, *sorted(CHANGES_POLICY)],
    ).to_pylist()
    return rows[0] if rows else None


def newest(store: Store) -> Decision | None:
    """The decision written last (by insertion, as ``load_state`` replays), or None in an empty ledger: the
    contract in force is the one it carries."""
    rows = store.query(f"SELECT {_COLUMNS} FROM decisions ORDER BY rowid DESC LIMIT 1").to_pylist()
    return _decision(rows[0], None) if rows else None


def last_change(store: Store) -> Decision | None:
    """The newest policy change as written (the one ``load_state`` replays from), or None in an empty
    ledger."""
    row = _last_change_row(store, None)
    return None if row is None else _decision(row, None)


def load_state(store: Store, policy: RolloutPolicy, before: float | None = None) -> RolloutState | None:
    """The state the ledger ends in (None when empty), or was in just before ``before`` (its decisions
    decided earlier). Only decisions since the last policy change matter, so only those are read. Raises
    ``LookupError`` when that change names a stage ``policy`` does not have."""
    last = _last_change_row(store, before)
    if last is None:
        return None
    until, params = _decided_before(before)
    rows = store.query(
        f"SELECT {_COLUMNS} FROM decisions WHERE rowid >= ? AND {until} ORDER BY rowid", [last["rowid"], *params]
    ).to_pylist()
    return replay(_decision(r, policy) for r in rows)
