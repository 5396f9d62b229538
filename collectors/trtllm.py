"""TensorRT-LLM adapter: speculative-decoding acceptance from ``trtllm-serve``'s JSON ``GET /metrics``.

Read from NVIDIA/TensorRT-LLM (``tensorrt_llm/serve/openai_server.py``,
``tensorrt_llm/executor/result.py``, ``cpp/tensorrt_llm/executor/jsonSerialization.cpp``,
``tensorrt_llm/executor/iteration_stats.py``; the test cites the commits): the route returns a JSON list of
per-iteration stats and *drains* them, so each read holds only the iterations since the last one. An
iteration carries ``timestamp`` (local time, no zone), ``iter``, ``iterLatencyMS`` and, with speculative
decoding on, ``specDecodingStats = {numDraftTokens, numAcceptedTokens, numRequestsWithDraftTokens,
acceptanceLength, iterLatencyMS, draftOverhead}`` (null without it), where ``draftOverhead`` is the
drafting's ``iterLatencyMS`` over the iteration's. The PyTorch backend fills them only with
``enable_iter_perf_stats: true``, and on every iteration once speculation is on, with zero counts where
no request drafted (a prefill): the draft overhead is over the iterations that drafted, weighted by their
time. Only a separate draft model's time is measured (``_update_iter_stats`` reads the drafter's
``last_draft_latency_ms``, else 0.0): with one-model drafting (MTP, one-model EAGLE3) or n-gram the drafting
time is 0 and the draft overhead is unknown (None), not zero. A build that buffers iterations client-side
also writes ``statsSequence`` and ``statsDroppedFrames``; a read whose rows say frames were dropped
under-counts, and says so.

Under attention data parallelism an iteration is one row per rank (``attentionDpRank``), each a copy of
the same iteration's report with that rank's batch counts: the speculative-decoding stats and the
latency repeat in every row. Only rank 0's row (or a row naming no rank) counts, so N ranks do not
count each iteration N times; the figures are then rank 0's requests alone, all the engine publishes
(``acceptance_ranks`` 1). With ``TLLM_METRICS_ALL_RANKS=1`` each rank's row is its own stats, keyed
``rank`` instead: their tokens add up over the ranks, and the iteration (its latency, its count) is
rank 0's.

There is no per-position count and no confidence: this gives the interval's acceptance rate and mean
acceptance length (TensorRT-LLM's own definition, ``(accepted + requests) / requests``), for PromQL-style
floors and the acceptance views, not calibration.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class AcceptanceSummary:
    """What one read of ``/metrics`` says about the iterations since the previous read."""

    iterations: int
    spec_iterations: int  # iterations that carried specDecodingStats
    drafting_iterations: int  # of those, the ones where some request drafted
    attention_dp_ranks: int  # distinct ranks read (``rank``, else ``attentionDpRank``; a row naming none is 0)
    # Ranks whose requests the token counts cover: every rank with TLLM_METRICS_ALL_RANKS, else 1 (the
    # default fan-out copies rank 0's stats into every rank's row; the others' requests are not published).
    acceptance_ranks: int
    first_timestamp: str | None
    last_timestamp: str | None
    draft_tokens: int
    accepted_tokens: int
    requests_with_drafts: int
    acceptance_rate: float | None  # accepted / draft tokens
    mean_acceptance_length: float | None  # tokens committed per request-step that drafted
    draft_overhead: float | None  # share of the drafting iterations' time spent drafting (None: not timed)
    # The largest statsDroppedFrames a row carried: at least that many frames of iteration stats were dropped
    # before this read, whether the engine counts them per frame or in total (None: it does not report them).
    dropped_frames: int | None
    p50_iter_ms: float | None
    p99_iter_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(obj: dict[str, Any], key: str, where: str) -> float:
    value = obj.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}.{key}: expected a number, got {value!r}")
    return float(value)


def _spec_stats(stats: dict[str, Any], where: str) -> dict[str, Any] | None:
    sd = stats.get("specDecodingStats")
    if sd is not None and not isinstance(sd, dict):
        raise ValueError(f"{where}.specDecodingStats: expected an object or null, got {sd!r}")
    return sd


def summarize(iterations: list[Any]) -> AcceptanceSummary:
    """Sum the speculative-decoding stats of a ``/metrics`` reply; ValueError naming the bad field."""
    if not isinstance(iterations, list):
        raise ValueError(f"/metrics: expected a JSON list of iteration stats, got {type(iterations).__name__}")
    drafts = accepted = requests = drafting_ms = drafting_iteration_ms = 0.0
    latencies, stamps, spec, drafting, ranks, own, dropped = [], [], 0, 0, set(), set(), None
    for i, stats in enumerate(iterations):
        where = f"[{i}]"
        if not isinstance(stats, dict):
            raise ValueError(f"{where}: expected an object, got {stats!r}")
        rank = _number(stats, "rank" if "rank" in stats else "attentionDpRank", where)
        ranks.add(rank)
        if "rank" in stats:
            own.add(rank)
        # Rank 0's row is the iteration (its latency, its count); another rank's row adds its own requests'
        # tokens where it carries them (keyed rank), and is a copy of rank 0's otherwise.
        iteration = rank == 0
        if not (iteration or "rank" in stats):
            continue
        if iteration:
            latency = _number(stats, "iterLatencyMS", where)
            latencies.append(latency)
            if "statsDroppedFrames" in stats:
                dropped = max(dropped or 0, int(_number(stats, "statsDroppedFrames", where)))
            if isinstance(stats.get("timestamp"), str):
                stamps.append(stats["timestamp"])
        sd = _spec_stats(stats, where)
        if sd is None:
            continue
        drafts += _number(sd, "numDraftTokens", f"{where}.specDecodingStats")
        accepted += _number(sd, "numAcceptedTokens", f"{where}.specDecodingStats")
        drafted = _number(sd, "numRequestsWithDraftTokens", f"{where}.specDecodingStats")
        requests += drafted
        if not iteration:
            continue
        spec += 1
        overhead = _number(sd, "draftOverhead", f"{where}.specDecodingStats")
        if drafted > 0:
            drafting += 1
            # A drafting time of 0 is one never measured (one-model drafting, n-gram), not a free draft.
            if _number(sd, "iterLatencyMS", f"{where}.specDecodingStats") > 0:
                drafting_ms += overhead * latency
                drafting_iteration_ms += latency
    ordered = sorted(latencies)
    return AcceptanceSummary(
        iterations=len(latencies),  # one per iteration counted
        spec_iterations=spec,
        drafting_iterations=drafting,
        attention_dp_ranks=len(ranks),
        acceptance_ranks=max(len(own), 1),
        first_timestamp=stamps[0] if stamps else None,
        last_timestamp=stamps[-1] if stamps else None,
        draft_tokens=int(drafts),
        accepted_tokens=int(accepted),
        requests_with_drafts=int(requests),
        acceptance_rate=accepted / drafts if drafts else None,
        mean_acceptance_length=(accepted + requests) / requests if requests else None,
        draft_overhead=drafting_ms / drafting_iteration_ms if drafting_iteration_ms else None,
        dropped_frames=dropped,
        p50_iter_ms=statistics.median(ordered) if ordered else None,
        p99_iter_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else None,
    )


class TRTLLMScraper:
    """Reads ``URL/metrics``; each ``scrape`` summarises the iterations the server queued since the last."""

    def __init__(self, url: str, client: httpx.Client | None = None):
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=10.0)

    def scrape(self) -> AcceptanceSummary:
        response = self.client.get(f"{self.url}/metrics")
        response.raise_for_status()
        return summarize(response.json())
