"""Poll an SGLang server's DSpark records (``GET /server_info``, docs/design.md §8) into the store.

Each ``internal_states[rank].dspark_info_record.records[]`` entry is one verify
step of one DP rank; it becomes a step record of replica ``NAME/dpRANK``.

- De-duplication: per (server, rank) the highest ``forward_ct`` taken is kept;
  a poll takes only records above it, so an unchanged buffer adds nothing and a
  cleared buffer (no records) is harmless.
- Restarts: when every ``forward_ct`` a rank reports is below the last one
  taken, the server restarted; a new epoch starts and ``step_id = epoch << 40 |
  forward_ct`` keeps keys unique. A restart whose counter overtakes the old one
  between two polls cannot be told apart from progress.
- Resuming: the poller starts from the highest stored step_id per replica, so
  restarting the poller does not re-ingest the server's buffer.
- Absent fields (-1 or null): timings become 0; a missing confidence or survival
  is derived from the other (c_k = S_k / S_{k-1}, S_k = Π c_i); without a graph
  key the step counts as a hit at its exact row count; token ids not reported
  are -1. What stays inconsistent (e.g. cap-accept without cap_trim) is
  quarantined by validation like any other record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.schema import SCHEMA_VERSION
from sparkgate.collectors.store import IngestResult
from sparkgate.collectors.wire import from_dicts

EPOCH_SHIFT = 40
_MODES = {"static": "static", "compact": "compact", "cap-accept": "cap_accept", "cap_accept": "cap_accept"}


def _present(value):
    """SGLang marks an absent field with null or -1."""
    return None if value is None or value == -1 else value


def _probabilities(req: dict) -> tuple[list[float] | None, list[float] | None]:
    confidence, survival = _present(req.get("confidence")), _present(req.get("survival"))
    if confidence is None and survival:
        confidence = [s / prev if prev else 0.0 for s, prev in zip(survival, [1.0] + survival[:-1])]
    if survival is None and confidence:
        survival, running = [], 1.0
        for c in confidence:
            running *= c
            survival.append(running)
    return confidence, survival


def convert_request(req: dict, gamma: int | None, sglang_mode: str | None) -> dict:
    """One SGLang req of a record in ``sglang_mode`` as a wire-form request row (docs/design.md §8 mapping)."""
    mode = _MODES.get(sglang_mode or "", sglang_mode)
    verify_len, accepted = _present(req.get("verify_len")), _present(req.get("correct_drafts"))
    window = None if verify_len is None else verify_len - 1
    cap_trim = _present(req.get("cap_trim"))
    if mode == "compact":
        observed = window is not None and accepted is not None and (accepted < window or window == gamma)
        full_accept = accepted if observed else None
    else:
        trim = 0 if mode == "static" and cap_trim is None else cap_trim
        full_accept = None if accepted is None or trim is None else accepted + trim
    drafts, bonus = _present(req.get("draft_tokens")), _present(req.get("bonus_token"))
    committed = _present(req.get("acc_len")) or ((accepted or 0) + 1)
    tokens = (
        list(drafts[:accepted]) + [bonus]
        if drafts is not None and bonus is not None and accepted is not None
        else [-1] * committed
    )
    confidence, survival = _probabilities(req)
    return {
        "request_id": str(req.get("rid")),
        "mode": mode,
        "task": "sglang",
        "temperature": 0.0,
        "window_suggested": None,
        "window": window,
        "accepted": accepted,
        "full_accept": full_accept,
        "cap_trim": (full_accept - accepted) if mode == "cap_accept" and full_accept is not None else 0,
        "confidence": confidence,
        "survival": survival,
        "committed_tokens": tokens,
    }


def convert_record(
    record: dict, gamma: int | None, replica_id: str, step_id: int, ts: float, default_mode: str | None = None
) -> dict:
    """One SGLang verify record as a wire-form step record; its mode, else ``default_mode``, is every row's."""
    reqs = record.get("reqs") or []
    rows = sum((_present(r.get("verify_len")) or 0) for r in reqs)
    verify_rows = _present(record.get("num_verify_tokens")) or rows
    graph_key = _present(record.get("verify_tokens_graph_key"))
    tier_rows = graph_key if isinstance(graph_key, int) and graph_key >= verify_rows else verify_rows

    def ms(name: str) -> float:
        return float(_present(record.get(name)) or 0.0)

    return {
        "schema_version": SCHEMA_VERSION,
        "replica_id": replica_id,
        "step_id": step_id,
        "ts": ts,
        "batch_size": _present(record.get("bs")) or len(reqs),
        "gamma": gamma,
        "verify_rows": verify_rows,
        "tier_rows": tier_rows,
        "tier": tier_rows,
        "graph_hit": True,
        "miss_reason": None,
        "draft_ms": ms("draft_gpu_ms"),
        "schedule_ms": 0.0,
        "verify_ms": ms("target_verify_gpu_ms"),
        "accept_ms": 0.0,
        "step_ms": ms("step_gpu_ms") or ms("step_cpu_ms"),
        "predicted_step_ms": _present(record.get("predicted_step_ms")),
        "host_syncs": 0,
        "phase": "external",
        "policy_revision": 0,
        "model_version": "sglang",
        "drafter_version": "sglang",
        "sts_version": None,
        "cost_table_version": None,
        "requests": [convert_request(r, gamma, record.get("mode") or default_mode) for r in reqs],
    }


@dataclass
class _Cursor:
    epoch: int = 0
    last: int = -1  # highest forward_ct taken in this epoch


class SGLangPoller:
    """Polls one server; ``poll_once`` commits the new records of every DP rank as one batch."""

    def __init__(self, url: str, ingestor: Ingestor, name: str | None = None, client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self.name = name or self.url.split("://", 1)[-1]
        self.ingestor = ingestor
        self.client = client or httpx.Client(timeout=10.0)
        self.restarts = 0
        self._cursors: dict[int, _Cursor] = {}
        self._stored = ingestor.store.max_step_ids()

    def _cursor(self, rank: int) -> _Cursor:
        if rank not in self._cursors:
            stored = self._stored.get(self.replica_id(rank))
            self._cursors[rank] = (
                _Cursor() if stored is None else _Cursor(stored >> EPOCH_SHIFT, stored & ((1 << EPOCH_SHIFT) - 1))
            )
        return self._cursors[rank]

    def replica_id(self, rank: int) -> str:
        return f"{self.name}/dp{rank}"

    def _new_records(self, rank: int, info: dict, now: float) -> tuple[list[dict], _Cursor]:
        """Converted records above the rank's cursor, and the cursor to keep once they are committed."""
        records = [r for r in info.get("records") or [] if isinstance(r.get("forward_ct"), int)]
        cursor = self._cursor(rank)
        if not records:
            return [], cursor  # buffer cleared, or nothing yet
        if max(r["forward_ct"] for r in records) < cursor.last:
            cursor = _Cursor(cursor.epoch + 1, -1)  # the server restarted: its counter went backwards
        fresh = sorted((r for r in records if r["forward_ct"] > cursor.last), key=lambda r: r["forward_ct"])
        gamma = _present(info.get("gamma"))
        out = [
            convert_record(
                r, gamma, self.replica_id(rank), cursor.epoch << EPOCH_SHIFT | r["forward_ct"], now, info.get("mode")
            )
            for r in fresh
        ]
        return out, _Cursor(cursor.epoch, fresh[-1]["forward_ct"]) if fresh else cursor

    def poll_once(self) -> IngestResult | None:
        """Fetch ``/server_info`` and commit what is new; None when nothing was new.

        Cursors move only after the commit, so a failed commit is retried by the next poll.
        """
        response = self.client.get(f"{self.url}/server_info")
        response.raise_for_status()
        now = time.time()
        steps, cursors = [], {}
        for rank, state in enumerate(response.json().get("internal_states") or []):
            info = (state or {}).get("dspark_info_record")
            if info:
                new, cursors[rank] = self._new_records(rank, info, now)
                steps.extend(new)
        result = self.ingestor.ingest(from_dicts(steps), f"sglang:{self.name}") if steps else None
        for rank, cursor in cursors.items():
            self.restarts += cursor.epoch - self._cursor(rank).epoch
            self._cursors[rank] = cursor
        return result
