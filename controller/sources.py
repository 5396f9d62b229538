"""Which gates each kind of record source can feed: what ``sparkgate report`` states beside the figures,
so an operator never reads a gate that its fleet cannot inform as a pass.

A source is told by what its records carry: the SGLang poller writes ``model_version = "sglang"``
(docs/design.md §8); everything else is sparkgate's own runtime (``sparkgate replica``) or a runtime that
posts records the same way. vLLM and TensorRT-LLM store no records: their curves come from
``sparkgate collect`` and PromQL gates.
"""

from __future__ import annotations

from typing import Any

from sparkgate.collectors.sglang_records import SGLANG_MODEL
from sparkgate.collectors.store import Store
from sparkgate.policies.gate import METRICS

from .queries import Slice, Window, steps_by_model

# metric -> why an SGLang fleet cannot feed it through the store (absent: it can).
SGLANG_CANNOT = {
    "tier_miss_rate": "SGLang reports the padded tier, not whether a step replayed a graph (tier -2)",
    "p99_step_ratio": "the collector's file holds no baseline of the controller's; use a PromQL gate",
    "tokens_per_s_ratio": "the collector's file holds no baseline of the controller's; use a PromQL gate",
    "p99_step_ratio_drift": "as p99_step_ratio",
    "tokens_per_s_ratio_drift": "as tokens_per_s_ratio",
    "consistency_mismatches": "no greedy replay runs against an SGLang server",
    "state_rollback_failures": "no cache-state check runs against an SGLang server",
}
SGLANG_NOTES = {
    "survival_ece": "on the server's own STS calibration (confidences arrive calibrated; no refit)",
    "survival_ece_upper": "on the server's own STS calibration",
    "upper_bound_utilization": "from the servers the actuator keeps at the full window",
}


def sources(store: Store, window: Window, slice_: Slice) -> list[dict[str, Any]]:
    """Per source in the window: its steps and replicas, the gates it feeds and those it cannot, and why."""
    out = []
    for row in steps_by_model(store, window, slice_, SGLANG_MODEL):
        sglang = row["matches"]
        if sglang:
            feeds = {m: SGLANG_NOTES.get(m, "") for m in METRICS if m not in SGLANG_CANNOT}
            cannot = dict(SGLANG_CANNOT)
        else:
            feeds, cannot = {m: "" for m in METRICS}, {}
        out.append({"source": "sglang" if sglang else "runtime", "steps": row["steps"],
                    "replicas": row["replicas"], "feeds": feeds, "cannot_feed": cannot})  # fmt: skip
    return out
