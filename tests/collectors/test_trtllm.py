"""The TensorRT-LLM adapter against a stand-in ``trtllm-serve`` that answers as its code does.

Read from NVIDIA/TensorRT-LLM:
- ``tensorrt_llm/serve/openai_server.py`` @ e7f7345e31e574b5d0918b756b871882c7346b3c: ``GET /metrics``
  returns ``JSONResponse(content=stats)``, a list of per-iteration stats;
- ``tensorrt_llm/executor/result.py`` @ a678b91aafbeff265cd0b764abb59d7def624ac2: the stats queue is
  drained by each read (a read returns only the iterations queued since the previous one);
- ``cpp/tensorrt_llm/executor/jsonSerialization.cpp`` @ 092229bb6e1ce6e7f0db2ba010b7fdaf654e1549: the field
  names of ``IterationStats`` and ``SpecDecodingStats`` (numDraftTokens, numAcceptedTokens,
  numRequestsWithDraftTokens, acceptanceLength, iterLatencyMS, draftOverhead);
- ``tensorrt_llm/executor/iteration_stats.py`` @ b11790149e0e12e52ea82ed7a4d51b51ea98dce6: the row's fields
  (``_iteration_report``, ``_materialize_frame``: maxBatchSize*/maxNumTokens* zeros, staticBatchingStats,
  schedulerMode, statsSequence, statsDroppedFrames); specDecodingStats is null without speculative
  decoding, acceptanceLength = (accepted + requests) / requests (0 when no request drafted), and
  draftOverhead = its iterLatencyMS / the iteration's (0 for an iteration of no latency); under
  attention DP, ``_materialize_frame`` emits one row per rank payload, each ``dict(base)`` of the same
  iteration report (so the same specDecodingStats and iterLatencyMS) with ``attentionDpRank`` set, that
  rank's inflightBatchingStats, and (rank != 0) the queue and completion counts zeroed;
- ``tensorrt_llm/_torch/pyexecutor/py_executor.py`` @ 9521caf4696c1fb79b0f946f0d980f8f0ebd3e64: the
  timestamp is local time as ``%m-%d-%Y %H:%M:%S.%f``; in a later version of the same file
  ``_update_iter_stats`` fills the drafting time only "from drafter if available (only for two-model mode)"
  (``self.drafter is not None and hasattr(self.drafter, 'last_draft_latency_ms')``), else
  ``draft_latency_ms = 0.0``, and writes it as specDecodingStats' iterLatencyMS, draftOverhead 0.0 with it.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.trtllm import TRTLLMScraper, summarize
from tests.collectors.loopback import QuietHandler, serving


def iteration(
    i: int, drafts: int, accepted: int, requests: int, latency: float = 20.0, spec: bool = True,
    draft_ms: float = 4.0, dropped: int = 0,
) -> dict:  # fmt: skip
    """One iteration's row as ``_iteration_report`` and ``_materialize_frame`` write it (no attention DP)."""
    sd = {"numDraftTokens": drafts, "numAcceptedTokens": accepted, "numRequestsWithDraftTokens": requests,
          "acceptanceLength": (accepted + requests) / requests if requests else 0.0, "iterLatencyMS": draft_ms,
          "draftOverhead": draft_ms / latency if latency > 0 else 0.0}  # fmt: skip
    limits = ("maxBatchSizeStatic", "maxBatchSizeTunerRecommended", "maxBatchSizeRuntime", "maxNumTokensStatic",
              "maxNumTokensTunerRecommended", "maxNumTokensRuntime")  # fmt: skip
    return {
        "timestamp": f"12-01-2026 09:30:{i:02d}.000000",
        "iter": i,
        "iterLatencyMS": latency,
        "newActiveRequestsQueueLatencyMS": 0.0,
        "numNewActiveRequests": 0,
        "numActiveRequests": requests,
        "numQueuedRequests": 0,
        "numCompletedRequests": 0,
        "maxNumActiveRequests": 64,
        **dict.fromkeys(limits, 0),
        "gpuMemUsage": 1,
        "cpuMemUsage": 1,
        "pinnedMemUsage": 0,
        "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 90, "usedNumBlocks": 10},
        "staticBatchingStats": {
            "numScheduledRequests": 0,
            "numContextRequests": 0,
            "numCtxTokens": 0,
            "numGenTokens": 0,
            "emptyGenSlots": 0,
        },
        "inflightBatchingStats": {"numScheduledRequests": requests, "numContextRequests": 0},
        "specDecodingStats": sd if spec else None,
        "schedulerMode": "non_overlap",
        "statsSequence": i,
        "statsDroppedFrames": dropped,
        "attentionDpRank": 0,
    }


class Server:
    """Queues iterations; a read drains the queue, as ``IterationResult`` does."""

    def __init__(self):
        self.queue: list[dict] = []

    def handler(self):
        server = self

        class Handler(QuietHandler):
            def do_GET(self):
                drained, server.queue = server.queue, []
                self.reply(json.dumps(drained).encode(), "application/json")

        return Handler


def test_each_read_summarises_only_the_iterations_since_the_last():
    server = Server()
    server.queue = [iteration(1, 12, 6, 4), iteration(2, 12, 9, 4, latency=30.0), iteration(3, 0, 0, 0, spec=False)]
    with serving(server.handler()) as url:
        scraper = TRTLLMScraper(url)
        first = scraper.scrape()
        empty = scraper.scrape()
        server.queue = [iteration(4, 8, 2, 2)]
        third = scraper.scrape()
    assert (first.iterations, first.spec_iterations, first.draft_tokens, first.accepted_tokens) == (3, 2, 24, 15)
    assert first.acceptance_rate == pytest.approx(15 / 24)
    assert first.mean_acceptance_length == pytest.approx((15 + 8) / 8)  # TensorRT-LLM's own definition
    assert (first.first_timestamp, first.last_timestamp) == ("12-01-2026 09:30:01.000000", "12-01-2026 09:30:03.000000")
    # Drafting's share of the drafting iterations' time: (4 + 4) ms of (20 + 30) ms.
    assert first.p50_iter_ms == 20.0 and first.draft_overhead == pytest.approx(8 / 50)
    assert (first.drafting_iterations, first.dropped_frames) == (2, 0)
    assert empty.iterations == 0 and empty.acceptance_rate is None and empty.p99_iter_ms is None
    assert (third.draft_tokens, third.accepted_tokens, third.mean_acceptance_length) == (8, 2, 2.0)


def dp_rows(row: dict, ranks: int) -> list[dict]:
    """One iteration under attention DP, as ``_materialize_frame`` writes it: a copy per rank."""
    rows = []
    for rank in range(ranks):
        copy = dict(row, attentionDpRank=rank)
        copy["inflightBatchingStats"] = dict(row["inflightBatchingStats"], numScheduledRequests=1 + rank)
        if rank:
            copy.update(numQueuedRequests=0, numCompletedRequests=0, numNewActiveRequests=0,
                        newActiveRequestsQueueLatencyMS=0)  # fmt: skip
        rows.append(copy)
    return rows


def test_iterations_where_no_request_drafted_leave_the_draft_overhead_alone_and_drops_are_reported():
    # With speculation on every iteration carries specDecodingStats; a prefill drafts nothing (zero counts).
    drafting = [iteration(1, 12, 6, 4, latency=20.0, draft_ms=5.0), iteration(2, 12, 9, 4, latency=30.0, draft_ms=3.0)]
    prefill = iteration(3, 0, 0, 0, latency=200.0, draft_ms=0.0, dropped=7)
    summary = summarize([*drafting, prefill])
    assert (summary.spec_iterations, summary.drafting_iterations) == (3, 2)
    assert summary.draft_overhead == pytest.approx((5.0 + 3.0) / 50.0)  # not the mean of 0.25, 0.1 and 0
    assert summary.mean_acceptance_length == pytest.approx((15 + 8) / 8) and summary.dropped_frames == 7
    assert summarize([{k: v for k, v in prefill.items() if k != "statsDroppedFrames"}]).dropped_frames is None


def test_attention_dp_ranks_count_each_iteration_once():
    alone = summarize([iteration(1, 12, 6, 4), iteration(2, 12, 9, 4, latency=30.0)])
    split = summarize(dp_rows(iteration(1, 12, 6, 4), 4) + dp_rows(iteration(2, 12, 9, 4, latency=30.0), 4))
    assert split.attention_dp_ranks == 4 and alone.attention_dp_ranks == 1
    assert {**split.to_dict(), "attention_dp_ranks": 1} == alone.to_dict()
    assert (split.iterations, split.draft_tokens, split.accepted_tokens, split.requests_with_drafts) == (2, 24, 15, 8)


def all_ranks_rows(i: int, accepted: list[int]) -> list[dict]:
    """One iteration with ``TLLM_METRICS_ALL_RANKS=1``: each attention-DP rank's own stats, as
    ``py_executor.py``'s ``_flush_iter_stats_synced`` gathers them (``local_dict["rank"] = tp_rank``) and
    ``base_worker.py``'s ``_stats_serializer`` emits a ``per_rank_dict`` as it is: keyed ``rank``, with no
    ``attentionDpRank`` (``jsonSerialization.cpp``'s IterationStats has none). Read from the index's newest
    versions of both files, for which it names no commit (its versions at the commits cited above predate
    the mode)."""
    rows = []
    for rank, a in enumerate(accepted):
        row = iteration(i, 12, a, 4)
        for key in ("attentionDpRank", "statsSequence", "statsDroppedFrames"):
            del row[key]
        rows.append({**row, "rank": rank})
    return rows


def test_each_ranks_own_stats_are_added_once_per_iteration_and_the_fan_out_is_one_ranks():
    # Rows keyed "rank" are each rank's own requests: read as rank 0's copies, every iteration counted four
    # times over. The default fan-out copies rank 0's stats into every row: its figures are one rank's.
    own = summarize(all_ranks_rows(1, [9, 3, 3, 3]) + all_ranks_rows(2, [6, 6, 6, 6]))
    assert (own.iterations, own.attention_dp_ranks, own.acceptance_ranks) == (2, 4, 4)
    assert (own.draft_tokens, own.accepted_tokens, own.requests_with_drafts) == (96, 42, 32)
    assert own.acceptance_rate == pytest.approx(42 / 96)
    copies = summarize(dp_rows(iteration(1, 12, 9, 4), 4))
    assert (copies.iterations, copies.attention_dp_ranks, copies.acceptance_ranks) == (1, 4, 1)


def test_a_reply_that_is_not_iteration_stats_is_named():
    with pytest.raises(ValueError, match="expected a JSON list"):
        summarize({"error": "stats disabled"})
    bad = iteration(1, 12, 6, 4)
    bad["specDecodingStats"]["numAcceptedTokens"] = "six"
    with pytest.raises(ValueError, match=r"\[0\].specDecodingStats.numAcceptedTokens: expected a number, got 'six'"):
        summarize([bad])
    with pytest.raises(ValueError, match=r"\[0\].attentionDpRank: expected a number, got 'zero'"):
        summarize([dict(iteration(1, 12, 6, 4), attentionDpRank="zero")])


def test_collect_prints_one_line_per_trtllm_poll():
    server = Server()
    server.queue = [iteration(1, 12, 6, 4)]
    with serving(server.handler()) as url:
        result = CliRunner().invoke(main, ["collect", "--trtllm", url, "--polls", "2", "--interval", "0"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["trtllm"], line["iterations"]) for line in lines] == [(url, 1), (url, 0)]


def test_drafting_never_timed_leaves_the_draft_overhead_unknown_not_zero():
    # One-model drafting (MTP) or n-gram: requests draft, but no separate drafter times it.
    untimed = [iteration(1, 12, 6, 4, draft_ms=0.0), iteration(2, 12, 9, 4, latency=30.0, draft_ms=0.0)]
    summary = summarize(untimed)
    assert summary.drafting_iterations == 2 and summary.draft_overhead is None
    assert summary.acceptance_rate == pytest.approx(15 / 24)  # the counts are still read
    timed = summarize([*untimed, iteration(3, 12, 6, 4, latency=40.0, draft_ms=10.0)])
    assert timed.draft_overhead == pytest.approx(10 / 40)  # over the iterations that timed their drafting
