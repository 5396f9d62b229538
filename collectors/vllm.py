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
counters cannot show: tell the scraper (``adaptive=True``, ``collect --vllm-adaptive``).
Either way the curve is marked ``censored`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

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


def survival_curve(counters: Counters, adaptive: bool = False) -> SurvivalCurve:
    """The curve of an interval's counters (positions are 0-based in vLLM: position k-1 is depth k)."""
    depths = max(counters.per_position, default=-1) + 1
    drafts = counters.drafts
    survival = [counters.per_position.get(k, 0.0) / drafts if drafts else 0.0 for k in range(depths)]
    censored = None
    if adaptive:
        censored = "adaptive verification trims drafts after scheduling: deep positions are under-counted"
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
