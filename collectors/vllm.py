"""vLLM adapter: the unconditional survival curve from ``/metrics`` spec-decode counters (docs/design.md §8).

vLLM exports, per engine, how many drafts it proposed and how many tokens were
accepted at each draft position. Over an interval, ``S_k = accepted at position
k-1 / drafts``: the fraction of drafts whose first k tokens were all accepted.
There are no confidences, so this feeds acceptance curves, not calibration.
Counters from several label sets (models, engines) are summed; a counter that
went down means the server restarted, and the interval then starts from zero.

Censoring (read from vllm-project/vllm ``vllm/v1/core/sched/scheduler.py`` and
``vllm/v1/spec_decode/metrics.py``; the test cites the commits): every draft counts
in the denominator, but a draft shorter than the deepest position never reaches
it, so ``S_k`` is then a lower bound. That shows in the counters when dynamic
speculation schedules fewer tokens (``draft_tokens < drafts × positions``). Adaptive
verification trims slots *after* scheduling and counts them as rejections, which the
counters cannot show, and so does the GPU model runner's draft trimmer, which is switched
on by itself for a drafter of variable-length drafts (n-gram; ``VariableDraftTrimmer`` in
``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`` @ 057929c3: "Trimmed slots
surface as ordinary rejections"): tell the scraper (``adaptive=True``, ``collect
--vllm-adaptive``). Either way the curve is marked ``censored`` with the reason.

Per request (``response_curve``): a server started with
``--per-request-spec-decode-metrics detailed`` returns, in the top-level
``metrics.speculative_decoding`` of each completion (when streaming, the final usage
chunk, which comes only with ``stream_options.include_usage`` or
``--enable-force-include-usage``), ``per_step_accepted`` and ``per_step_drafted``: per verify step, the
drafts accepted (no bonus token) and the drafts proposed. That resolves the
censoring of short drafts that the counters cannot (not trimming after
scheduling, whose slots were scheduled and so count as proposed: ``adaptive``
says so here too): a step that proposed d drafts and accepted a < d observed
depths 1..a+1 (the prefix failed at a+1, so deeper labels are 0); one that
accepted all d < k observed 1..d and is censored beyond. ``S_k`` is then the
product-limit (Kaplan-Meier) estimate over steps, exact when no step is
censored. ``summary`` responses carry ``acceptance_histogram`` (steps by drafts
accepted) and, in newer builds, ``acceptance_histogram_by_draft_length`` (steps by
drafts proposed, then accepted), which resolves short drafts as the per-step arrays
do. With the first alone a summary is exact when every step proposed all k drafts
(``num_draft_tokens == num_spec_steps * num_spec_tokens``), else a lower bound,
marked censored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sparkgate.policies import json_text

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True)
class Counters:
    """Cumulative spec-decode counters from one scrape."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, earlier: Counters) -> Counters:
        """The interval since ``earlier``; after a reset (any counter lower) the whole current value."""
        values = [
            (self.drafts, earlier.drafts),
            (self.draft_tokens, earlier.draft_tokens),
            (self.accepted, earlier.accepted),
        ]
        values += [(v, earlier.per_position.get(k, 0.0)) for k, v in self.per_position.items()]
        if any(now < before for now, before in values):
            return self
        return Counters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            {k: v - earlier.per_position.get(k, 0.0) for k, v in self.per_position.items()},
        )


@dataclass(frozen=True)
class SurvivalCurve:
    """``survival[k-1]`` = S_k for depth k; ``acceptance_rate`` = accepted / draft tokens."""

    drafts: float
    survival: list[float]
    acceptance_rate: float | None
    mean_accepted: float | None  # accepted draft tokens per draft
    censored: str | None = None  # why survival is only a lower bound, or None

    def to_dict(self) -> dict:
        return {
            "drafts": self.drafts,
            "survival": self.survival,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted": self.mean_accepted,
            "censored": self.censored,
        }


def parse_counters(text: str) -> Counters:
    """Sum the spec-decode counters of a Prometheus text exposition over all label sets."""
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name == PER_POSITION and sample.name.endswith("_total"):
                k = int(sample.labels["position"])
                per_position[k] = per_position.get(k, 0.0) + sample.value
            elif name in totals and sample.name.endswith("_total"):
                totals[name] += sample.value
    return Counters(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], per_position)


# Why a curve of a server that trims drafts after scheduling is a lower bound: the trimmed slots were
# scheduled, so they count as drafted, and are then rejected.
TRIMMED = (
    "drafts are trimmed after scheduling (adaptive verification, variable-length drafts): "
    "deep positions are under-counted"
)


def survival_curve(counters: Counters, adaptive: bool = False) -> SurvivalCurve:
    """The curve of an interval's counters (positions are 0-based in vLLM: position k-1 is depth k)."""
    depths = max(counters.per_position, default=-1) + 1
    drafts = counters.drafts
    survival = [counters.per_position.get(k, 0.0) / drafts if drafts else 0.0 for k in range(depths)]
    censored = None
    if adaptive:
        censored = TRIMMED
    elif drafts and counters.draft_tokens < drafts * depths:
        censored = (
            f"{counters.draft_tokens:g} draft tokens over {drafts:g} drafts of up to {depths} positions: "
            "shorter drafts never reached the deep positions"
        )
    return SurvivalCurve(
        drafts,
        survival,
        counters.accepted / counters.draft_tokens if counters.draft_tokens else None,
        counters.accepted / drafts if drafts else None,
        censored,
    )


class VLLMScraper:
    """Scrapes ``URL/metrics``; each ``scrape`` returns the curve of the interval since the last one."""

    def __init__(self, url: str, client: httpx.Client | None = None, adaptive: bool = False):
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=10.0)
        self.adaptive = adaptive
        self._last = Counters()

    def scrape(self) -> SurvivalCurve:
        response = self.client.get(f"{self.url}/metrics")
        response.raise_for_status()
        current = parse_counters(response.text)
        interval, self._last = current.minus(self._last), current
        return survival_curve(interval, self.adaptive)


def _speculative(response: Any, line: int) -> dict[str, Any] | None:
    if not isinstance(response, dict):
        raise ValueError(f"response {line}: expected a JSON object (a completion response or its final chunk)")
    metrics = response.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec is not None and not isinstance(spec, dict):
        raise ValueError(f"response {line}: metrics.speculative_decoding: expected an object, got {spec!r}")
    return spec


def _steps(spec: dict[str, Any], line: int) -> list[tuple[int, int]] | None:
    """(drafted, accepted) per verify step, or None when the response has no per-step arrays."""
    accepted, drafted = spec.get("per_step_accepted"), spec.get("per_step_drafted")
    if accepted is None and drafted is None:
        return None
    if not (isinstance(accepted, list) and isinstance(drafted, list) and len(accepted) == len(drafted)):
        raise ValueError(f"response {line}: per_step_accepted and per_step_drafted must be lists of one length")
    for a, d in zip(accepted, drafted):
        if not (isinstance(a, int) and isinstance(d, int) and 0 <= a <= d):
            raise ValueError(f"response {line}: a step accepted {a!r} of {d!r} drafts (need 0 <= accepted <= drafted)")
    return list(zip(drafted, accepted))


def _dense_counts(counts: Any, width: int, line: int) -> list[int]:
    """``acceptance_histogram`` checked: a list of at most ``width + 1`` counts (steps that accepted exactly j
    drafts). An older build writes a map of only the counts it saw, which read as a list would be its keys."""
    where = f"response {line}: metrics.speculative_decoding.acceptance_histogram"
    if not isinstance(counts, list):
        raise ValueError(f"{where}: expected a list of counts (steps that accepted 0, 1, … drafts), got {counts!r}")
    if len(counts) > width + 1:
        raise ValueError(f"{where}: expected at most {width + 1} counts (num_spec_tokens {width}), got {counts!r}")
    for j, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"{where}[{j}]: expected a count, got {count!r}")
    return counts


def _summary_steps(spec: dict[str, Any], width: int, line: int) -> tuple[list[tuple[int, int]], bool]:
    """(drafted, accepted) per verify step of a summary response, and whether they are exact: from the
    histogram by draft length where the build writes it, else every step counted as proposing ``width``."""
    by_length = spec.get("acceptance_histogram_by_draft_length")
    if by_length is None:
        counts = _dense_counts(spec.get("acceptance_histogram") or [], width, line)
        steps = [(width, a) for a, count in enumerate(counts) for _ in range(count)]
        return steps, spec.get("num_draft_tokens") == spec.get("num_spec_steps", 0) * width
    where = f"response {line}: metrics.speculative_decoding.acceptance_histogram_by_draft_length"
    if not isinstance(by_length, dict):
        raise ValueError(f"{where}: expected an object of draft length to counts, got {by_length!r}")
    steps = []
    for key, counts in by_length.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise ValueError(f"{where}: key {key!r} is not a draft length")
        d = int(key)
        if not (isinstance(counts, list) and len(counts) == d + 1):
            raise ValueError(f"{where}[{key!r}]: expected a list of {d + 1} counts, got {counts!r}")
        for a, count in enumerate(counts):
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(f"{where}[{key!r}][{a}]: expected a count, got {count!r}")
            steps += [(d, a)] * count
    return steps, True


def _per_choice(response: Any) -> bool:
    choices = response.get("choices") if isinstance(response, dict) else None
    return isinstance(choices, list) and any(isinstance(c, dict) and "speculative_decoding_stats" in c for c in choices)


def response_curve(responses: Iterable[Any], adaptive: bool = False) -> SurvivalCurve:
    """The survival curve of decoded vLLM responses (one per request; those without speculative metrics,
    n > 1 or no speculation, are skipped). Raises ``ValueError`` naming the line of a malformed one.

    A ``summary`` response's histogram enters as steps that proposed all k drafts, which is exact when its
    steps did and a lower bound otherwise (said in ``censored``), so detailed and summary responses of one
    file are one estimate. The curve ends before the first depth no step reached while some prefix still
    survived: nothing observed it. ``adaptive``: the server trims drafts after scheduling, and a step's
    drafts are the scheduled ones (``Scheduler``'s ``num_draft_tokens``), so trimmed slots read as
    rejections here too."""
    at_risk: dict[int, int] = {}
    failed: dict[int, int] = {}
    steps = drafts = accepted_total = 0
    k = 0
    exact_summaries = True
    for line, response in enumerate(responses, 1):
        spec = _speculative(response, line)
        if spec is None:
            continue
        width = int(spec.get("num_spec_tokens") or 0)
        k = max(k, width)
        per_step = _steps(spec, line)
        if per_step is None:
            per_step, exact = _summary_steps(spec, width, line)
            exact_summaries &= exact
        for d, a in per_step:
            for depth in range(1, min(a + 1, d) + 1):
                at_risk[depth] = at_risk.get(depth, 0) + 1
            if a < d:
                failed[a + 1] = failed.get(a + 1, 0) + 1
        steps += int(spec.get("num_spec_steps") or 0)
        drafts += int(spec.get("num_draft_tokens") or 0)
        accepted_total += int(spec.get("num_accepted_draft_tokens") or 0)
    survival, running, reasons = [], 1.0, []
    for depth in range(1, k + 1 if at_risk else 1):
        n = at_risk.get(depth, 0)
        if not n and running > 0:  # once no prefix survives, deeper depths are 0 without being reached
            reasons.append(f"no step reached depth {depth}: the curve ends at depth {depth - 1}")
            break
        running *= 1 - failed.get(depth, 0) / n if n else 1.0
        survival.append(running)
    if not exact_summaries:
        reasons.insert(0, "summary metrics whose steps proposed fewer drafts: deep positions are a lower bound")
    if adaptive:
        reasons.insert(0, TRIMMED)
    return SurvivalCurve(
        float(steps),
        survival,
        accepted_total / drafts if drafts else None,
        accepted_total / steps if steps else None,
        "; ".join(reasons) or None,
    )


def read_responses(path: str, adaptive: bool = False) -> SurvivalCurve:
    """``response_curve`` of a JSONL file of saved vLLM responses."""
    with open(path, encoding="utf-8") as lines:
        decoded = []
        for line, text in enumerate(lines, 1):
            if text.strip():
                try:
                    decoded.append(json_text.loads(text))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}: line {line}: not JSON ({exc.msg})") from exc
    if not any(_speculative(response, line) for line, response in enumerate(decoded, 1)):
        # An empty curve would read as "no drafts"; say why nothing was read instead.
        if any(_per_choice(response) for response in decoded):
            raise ValueError(
                f"{path}: the responses carry choices[].speculative_decoding_stats, an older build's "
                "(--per-request-spec-decode-stats), which is not read; a build with "
                "--per-request-spec-decode-metrics writes metrics.speculative_decoding"
            )
        raise ValueError(
            f"{path}: no response carries metrics.speculative_decoding (the server needs "
            "--per-request-spec-decode-metrics, a stream stream_options.include_usage, and a request n = 1)"
        )
    return response_curve(decoded, adaptive)
