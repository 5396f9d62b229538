"""One SGLang DSpark record as a step record (docs/design.md §8); ``sglang`` polls servers for them.

What SGLang sends was read from its own code (``speculative/dspark_components/dspark_observability.py``):
records are msgspec structs dumped with ``omit_defaults``, so a field at its default is an absent key, not
-1 or null.

- Time: records carry no timestamp; each is stamped with the time of the poll
  that read it (``ts``), so figures are as fine as the poll interval.
- Rows: ``num_verify_tokens`` and ``verify_tokens_graph_key`` are both the padded
  graph tier of the planned layout; in compact the verified rows are ``sum(reqs[].verify_len)``. A
  ``cap-accept`` step verifies every request's whole block (``DSparkVerifyPlanner.should_run_compact``
  is true in compact mode only; ``dspark_verify_planner.py``), its ``verify_len`` the window acceptance
  is capped at, so its rows and tier are ``γ + 1`` per request, as a cap-accept row of sparkgate's own
  runtime counts them. SGLang does not report whether a step replayed a graph: its steps carry ``tier``
  -2 (``TIER_UNREPORTED``), so tier gates stay inconclusive.
- Calibration: the server applies its STS temperatures before it dumps
  ``confidence``; records say so (``sts_version`` ``calibrated-at-source``), and
  ``sparkgate calibrate`` refuses to fit on them.
- Recovery: SGLang's ``ReqDetail`` carries ``draft_tokens``, ``bonus_token`` and
  ``prefix_len`` but no temperature, and its DSpark verifies sampled requests too
  (``kernels/accept_sampling.py``), so a server's drafts and positions are passed on
  for censored-label recovery (``collectors.recovery``, exact for greedy traffic
  only) when the operator says the traffic is greedy (``greedy``, ``--sglang-greedy``).
- Contract: every record carries the fingerprint (``policies.contract``) of what the
  server was launched with, read from the launch arguments ``/server_info`` returns
  at its top level (``dataclasses.asdict(server_args)``): ``model_path``,
  ``revision``, ``tokenizer_path``, ``speculative_algorithm``,
  ``speculative_draft_model_path`` and ``_revision``, the rank's ``gamma``,
  ``speculative_dspark_confidence_sts_path`` (None: no calibration), ``device``,
  ``tp_size``, ``dp_size`` and ``version``. A server relaunched with another drafter
  or STS file therefore sends the rollout back to shadow. The cost table
  (``speculative_dspark_sps_table_path``) is left out, as everywhere.
- Absent fields (-1 or null): a timing becomes 0 (unmeasured: the step comparisons leave the step
  out), except one whose GPU component the dump lists, which the engine left out because it ran past its
  1 s cap and is stored at the cap; without a graph key the step counts as a hit at its exact row count;
  token ids not reported are -1. A req without ``confidence`` and ``survival`` (the server dumps both or
  neither) is quarantined for them, as is what stays inconsistent (e.g. a negative cap_trim), by
  validation like any other record.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sparkgate.collectors.schema import CALIBRATED_AT_SOURCE, EXTERNAL_PHASE, SCHEMA_VERSION, TIER_UNREPORTED
from sparkgate.policies.contract import Contract

# model_version and drafter_version of the records the poller writes: what tells them apart downstream.
SGLANG_MODEL = "sglang"
# INFO_DUMP_MAX_STEP_CPU_SECONDS (dspark_observability.py @ 0b79ccf): a step or GPU segment timed past it is
# left out of the record, so the slowest steps would otherwise read as unmeasured.
TIMING_CAP_MS = 1000.0
_MODES = {"static": "static", "compact": "compact", "cap-accept": "cap_accept", "cap_accept": "cap_accept"}


def present(value):
    """SGLang marks an absent field with null or -1."""
    return None if value is None or value == -1 else value


def convert_request(
    req: dict, gamma: int | None, sglang_mode: str | None, request_id: str, greedy: bool = False
) -> dict:
    """One SGLang req of a record in ``sglang_mode`` as a wire-form request row (docs/design.md §8 mapping).
    With ``greedy`` (the operator says the server's traffic is greedy) the row carries its drafts and
    ``prefix_len`` for censored-label recovery."""
    mode = _MODES.get(sglang_mode or "", sglang_mode)
    verify_len, accepted = present(req.get("verify_len")), present(req.get("correct_drafts"))
    window = None if verify_len is None else verify_len - 1
    cap_trim = present(req.get("cap_trim"))
    if mode == "compact":
        observed = window is not None and accepted is not None and (accepted < window or window == gamma)
        full_accept = accepted if observed else None
    else:
        trim = 0 if mode == "static" and cap_trim is None else cap_trim
        full_accept = None if accepted is None or trim is None else accepted + trim
    drafts, bonus = present(req.get("draft_tokens")), present(req.get("bonus_token"))
    committed = present(req.get("acc_len")) or ((accepted or 0) + 1)
    tokens = (
        list(drafts[:accepted]) + [bonus]
        if drafts is not None and bonus is not None and accepted is not None
        else [-1] * committed
    )
    confidence, survival = present(req.get("confidence")), present(req.get("survival"))
    return {
        "request_id": request_id,
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
        **(_recovery_fields(req, drafts, gamma) if greedy else {}),
    }


def _recovery_fields(req: dict, drafts: list | None, gamma: int | None) -> dict:
    """``draft_tokens`` and ``position`` where SGLang reported them whole; an optional field that does not
    fit is left out rather than quarantining a record that is otherwise valid."""
    prefix = present(req.get("prefix_len"))
    if drafts is None or prefix is None or len(drafts) != gamma or not all(isinstance(t, int) for t in drafts):
        return {}
    return {"draft_tokens": list(drafts), "position": prefix}


def server_contract(server: dict[str, Any], gamma: int | None) -> str:
    """The contract fingerprint of a server's records at block length ``gamma``, from ``/server_info``."""

    def part(*names: str) -> str:
        return "|".join(f"{n}={server.get(n)}" for n in names)

    return Contract(
        target=part("model_path", "revision", "tokenizer_path"),
        drafter=part("speculative_algorithm", "speculative_draft_model_path", "speculative_draft_model_revision"),
        gamma=gamma if isinstance(gamma, int) else -1,
        sts=server.get("speculative_dspark_confidence_sts_path"),
        hardware=part("device", "tp_size", "dp_size", "version"),
    ).fingerprint()


def convert_record(
    record: dict,
    gamma: int | None,
    replica_id: str,
    step_id: int,
    ts: float,
    default_mode: str | None = None,
    request_ids: list[str] | None = None,
    contract: str | None = None,
    greedy: bool = False,
    components: Collection[str] = (),
) -> dict:
    """One SGLang verify record as a wire-form step record; its mode, else ``default_mode``, is every row's.

    ``request_ids`` names the rows (the poller's identities for requests without ``rid``); by default each
    row's ``rid``. ``components`` are the dump's: a timing its component is on for but the record leaves
    out was timed past the engine's cap, and is stored at the cap (``TIMING_CAP_MS``, a lower bound); any
    other absent timing is 0, unmeasured, which the step comparisons leave out."""
    reqs = record.get("reqs") or []
    ids = request_ids if request_ids is not None else [str(r.get("rid")) for r in reqs]
    lengths = [present(r.get("verify_len")) for r in reqs]
    # num_verify_tokens is the planned layout's padded tier (it equals verify_tokens_graph_key); compact's
    # rows are the requests' own, cap-accept's the whole blocks it ran (its windows only cap acceptance).
    padded = present(record.get("verify_tokens_graph_key")) or present(record.get("num_verify_tokens"))
    mode = _MODES.get(record.get("mode") or default_mode or "")
    if mode == "cap_accept" and reqs and isinstance(gamma, int):
        verify_rows = tier_rows = len(reqs) * (gamma + 1)
    else:
        verify_rows = sum(lengths) if reqs and None not in lengths else padded or 0
        tier_rows = padded if isinstance(padded, int) and padded >= verify_rows else verify_rows

    def ms(name: str, component: str) -> float:
        value = present(record.get(name))
        if value is not None:
            return float(value)
        return TIMING_CAP_MS if component in components else 0.0

    # The GPU step time first: an absent CPU time is also the first decode after a prefill, not only a
    # slow step, so it cannot be read as one.
    step_ms = ms("step_gpu_ms", "step_gpu_time") or float(present(record.get("step_cpu_ms")) or 0.0)

    return {
        "schema_version": SCHEMA_VERSION,
        "replica_id": replica_id,
        "step_id": step_id,
        "ts": ts,
        "batch_size": present(record.get("bs")) or len(reqs),
        "gamma": gamma,
        "verify_rows": verify_rows,
        "tier_rows": tier_rows,
        "tier": TIER_UNREPORTED,
        "graph_hit": True,
        "miss_reason": None,
        "draft_ms": ms("draft_gpu_ms", "draft_gpu_time"),
        "schedule_ms": 0.0,
        "verify_ms": ms("target_verify_gpu_ms", "target_verify_gpu_time"),
        "accept_ms": 0.0,
        "step_ms": step_ms,
        "predicted_step_ms": present(record.get("predicted_step_ms")),
        "host_syncs": 0,
        "phase": EXTERNAL_PHASE,
        "policy_revision": 0,
        "model_version": SGLANG_MODEL,
        "drafter_version": SGLANG_MODEL,
        "sts_version": CALIBRATED_AT_SOURCE,
        "cost_table_version": None,
        "contract": contract,
        "requests": [
            convert_request(r, gamma, record.get("mode") or default_mode, i, greedy)
            for r, i in zip(reqs, ids, strict=True)
        ],
    }
