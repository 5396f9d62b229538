"""Hypothesis strategies and builders for valid v1 step records, and their NDJSON encoding."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import strategies as st

from sparkgate.collectors.schema import MODES, RequestRow, StepRecord

probability = st.floats(0.0, 1.0, allow_nan=False)


@st.composite
def request_rows(draw, gamma: int, request_id: str) -> RequestRow:
    """A request row consistent with docs/design.md §2-§3 for a random mode."""
    mode = draw(st.sampled_from(MODES))
    full = draw(st.integers(0, gamma))  # a*, what the full block would accept
    window = gamma if mode in ("static", "shadow") else draw(st.integers(0, gamma))
    accepted = min(full, window)
    censored = mode == "compact" and accepted == window < gamma
    full_accept = None if censored else (full if mode == "cap_accept" else accepted)
    confidence = draw(st.lists(probability, min_size=gamma, max_size=gamma))
    survival = sorted(draw(st.lists(probability, min_size=gamma, max_size=gamma)), reverse=True)
    return RequestRow(
        request_id=request_id,
        mode=mode,
        task=draw(st.sampled_from(["chat", "code"])),
        temperature=draw(st.sampled_from([0.0, 0.7, 1.0])),
        window_suggested=draw(st.integers(0, gamma)) if mode == "shadow" else None,
        window=window,
        accepted=accepted,
        full_accept=full_accept,
        cap_trim=full - accepted if mode == "cap_accept" else 0,
        confidence=confidence,
        survival=survival,
        committed_tokens=draw(st.lists(st.integers(0, 50000), min_size=accepted + 1, max_size=accepted + 1)),
    )


def step(step_id: int = 1, gamma: int = 4, requests: list[RequestRow] | None = None, **overrides) -> StepRecord:
    """A valid step with graph hit and plausible timings; ``overrides`` replace fields."""
    requests = [] if requests is None else requests
    record = StepRecord(
        replica_id="replica-a",
        step_id=step_id,
        ts=1.75e9 + step_id,
        batch_size=len(requests),
        gamma=gamma,
        verify_rows=len(requests) * (gamma + 1),
        tier_rows=64,
        tier=64,
        graph_hit=True,
        miss_reason=None,
        draft_ms=1.0,
        schedule_ms=0.1,
        verify_ms=3.0,
        accept_ms=0.2,
        step_ms=4.5,
        predicted_step_ms=4.4,
        host_syncs=1,
        phase="shadow",
        policy_revision=3,
        model_version="tiny-lm",
        drafter_version="tiny-drafter",
        sts_version="sts-1",
        cost_table_version=None,
        requests=requests,
    )
    return dataclasses.replace(record, **overrides)


@st.composite
def step_records(draw, step_id: int | None = None, replica_id: str = "replica-a") -> StepRecord:
    gamma = draw(st.integers(1, 6))
    n = draw(st.integers(0, 4))
    sid = draw(st.integers(0, 10**9)) if step_id is None else step_id
    rows = [draw(request_rows(gamma, f"r{sid}-{i}")) for i in range(n)]
    return step(sid, gamma, rows, replica_id=replica_id, verify_rows=n * (gamma + 1), tier_rows=n * (gamma + 1) + 3)


def compact_row(gamma: int = 4, window: int = 2, accepted: int = 2, request_id: str = "r1") -> RequestRow:
    """A compact row; censored when accepted == window < gamma."""
    censored = accepted == window < gamma
    return RequestRow(
        request_id,
        "compact",
        "chat",
        0.0,
        window,
        window,
        accepted,
        None if censored else accepted,
        0,
        [0.9] * gamma,
        [0.9 ** (k + 1) for k in range(gamma)],
        list(range(accepted + 1)),
    )


def ndjson(*records) -> bytes:
    return b"".join(json.dumps(r.to_dict() if hasattr(r, "to_dict") else r).encode() + b"\n" for r in records)


def static_row(gamma: int = 4, accepted: int = 1, request_id: str = "r1") -> RequestRow:
    return RequestRow(
        request_id,
        "static",
        "chat",
        0.0,
        None,
        gamma,
        accepted,
        accepted,
        0,
        [0.8] * gamma,
        [0.8 ** (k + 1) for k in range(gamma)],
        list(range(accepted + 1)),
    )
