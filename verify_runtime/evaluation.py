"""Offline drafter evaluation: acceptance by depth, confidence quality, draft cost.

Blocks come from the real engine in ``static`` mode (full γ-block verification,
greedy), so every depth label is observed: ``a*`` is the accepted length and
``y_k = 1[a* >= k]``. Per domain of a corpus split it reports the conditional
acceptance ``c_k = P(a* >= k | a* >= k−1)``, the survival ``S_k = P(a* >= k)``, the
mean accepted length, and survival ECE / Brier / AUROC of the confidence head
before and after STS, with a bootstrap upper bound on the ECE that resamples
requests, not positions (docs/design.md §2).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from sparkgate.collectors.schema import StepRecord
from sparkgate.policies.calibration import (
    STS,
    auroc_per_depth,
    batched_ece,
    brier_per_depth,
    ece_per_depth,
)

from .corpus import DOMAINS, Corpus
from .drafters import DraftContext, Drafter
from .engine import Engine, EngineConfig, Request
from .model import Transformer, forward_full
from .training import require_at_least_one


@dataclass
class EvalConfig:
    split: str = "test"
    prompts_per_domain: int = 96
    prompt_len: int = 128
    max_new_tokens: int = 128
    gamma: int = 7
    batch: int = 32
    latency_repeats: int = 30
    bootstrap: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        require_at_least_one(
            self, ("prompts_per_domain", "prompt_len", "max_new_tokens", "gamma", "batch", "latency_repeats")
        )


def run_blocks(
    target: Transformer, drafter: Drafter, prompts: list[list[int]], cfg: EvalConfig, task: str
) -> list[StepRecord]:
    """Greedy static decoding of ``prompts`` with the engine; the step records it emitted."""
    records: list[StepRecord] = []
    engine = Engine(
        target, drafter, EngineConfig(gamma=cfg.gamma, max_batch=cfg.batch, default_mode="static"), sink=records.append
    )
    for i, prompt in enumerate(prompts):
        engine.submit(
            Request(
                f"{task}-{i}",
                prompt,
                cfg.max_new_tokens,
                temperature=0.0,
                seed=cfg.seed + i,
                task=task,
                stop_at_eos=False,
            )
        )
    engine.run()
    return records


@dataclass
class Blocks:
    """One row per (request, step): raw confidences, the full-block accepted length, the request."""

    confidence: torch.Tensor  # [N, γ] raw c_k
    full_accept: torch.Tensor  # [N] a*
    request: torch.Tensor  # [N] request index (the bootstrap's unit)

    @classmethod
    def from_records(cls, records: list[StepRecord]) -> Blocks:
        rows = [row for rec in records for row in rec.requests]
        ids = {rid: i for i, rid in enumerate(dict.fromkeys(r.request_id for r in rows))}
        return cls(
            torch.tensor([r.confidence for r in rows], dtype=torch.float64),
            torch.tensor([r.full_accept for r in rows]),
            torch.tensor([ids[r.request_id] for r in rows]),
        )

    @property
    def labels(self) -> torch.Tensor:
        depth = torch.arange(1, self.confidence.shape[1] + 1)
        return (self.full_accept[:, None] >= depth).double()


def acceptance(blocks: Blocks) -> dict:
    survival = blocks.labels.mean(0)
    conditional = survival / torch.cat([torch.ones(1, dtype=survival.dtype), survival[:-1]]).clamp(min=1e-12)
    return {
        "rows": len(blocks.full_accept),
        "mean_accepted": round(float(blocks.full_accept.double().mean()), 4),
        "conditional_acceptance": _r(conditional),
        "survival": _r(survival),
    }


def calibration(blocks: Blocks, sts: STS | None, bootstrap: int, seed: int) -> dict:
    """Survival ECE / Brier / AUROC per depth of raw and STS-calibrated survivals."""
    labels = blocks.labels
    out = {}
    for name, survival in (
        ("before", blocks.confidence.cumprod(-1)),
        ("after", sts(blocks.confidence) if sts else None),
    ):
        if survival is None:
            continue
        ece = ece_per_depth(survival, labels)
        out[name] = {
            "ece": _r(ece),
            "mean_ece": round(sum(ece) / len(ece), 4),
            "ece_upper": _r(_bootstrap_upper(survival, labels, blocks.request, bootstrap, seed)),
            "brier": _r(brier_per_depth(survival, labels)),
            "auroc": [None if a is None else round(a, 4) for a in auroc_per_depth(survival, labels)],
        }
    return out


def _bootstrap_upper(
    survival: torch.Tensor, labels: torch.Tensor, request: torch.Tensor, rounds: int, seed: int, quantile: float = 0.95
) -> list[float]:
    """Per depth, the ``quantile`` of ECE over resamples of whole requests."""
    n_requests = int(request.max()) + 1
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(n_requests, (rounds, n_requests), generator=gen)
    counts = torch.zeros(rounds, n_requests, dtype=torch.float64)
    counts.scatter_add_(1, picks, torch.ones_like(picks, dtype=torch.float64))
    weight = counts[:, request]  # [rounds, N]: each row counted as often as its request was drawn
    return [
        float(batched_ece(survival[None, :, k], labels[:, k], weight).quantile(quantile))
        for k in range(survival.shape[1])
    ]


def draft_verify_ratio(records: list[StepRecord], batch: int) -> dict:
    """Mean draft and verify time of the steps that ran at exactly ``batch`` requests."""
    steps = [r for r in records if r.batch_size == batch]
    if not steps:
        return {"steps": 0}
    draft, verify = statistics.mean(r.draft_ms for r in steps), statistics.mean(r.verify_ms for r in steps)
    return {
        "steps": len(steps),
        "draft_ms": round(draft, 3),
        "verify_ms": round(verify, 3),
        "draft_to_verify": round(draft / verify, 4),
    }


@torch.inference_mode()
def draft_latency(
    target: Transformer, drafters: Mapping[str, Drafter], prompts: list[list[int]], cfg: EvalConfig
) -> dict[str, float]:
    """Median ``propose`` time (ms) per drafter on the same batch of real contexts,
    timed in interleaved rounds so that load from other processes hits all alike."""
    tokens = torch.tensor(prompts[: cfg.batch], device=target.output.weight.device)
    hidden, _ = forward_full(target, tokens[:, :-1])
    batch = tokens.shape[0]
    times: dict[str, list[float]] = {name: [] for name in drafters}
    for _ in range(cfg.latency_repeats):
        for name, drafter in drafters.items():
            window = drafter.hidden_window
            ctx = DraftContext(
                tokens.tolist(),
                torch.full((batch,), tokens.shape[1] - 1),
                torch.arange(batch),
                torch.zeros(batch),
                cfg.gamma,
                hidden[:, -window:] if window else None,
                torch.full((batch,), window) if window else None,
            )
            start = time.perf_counter()
            drafter.propose(ctx)
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: round(statistics.median(t), 3) for name, t in times.items()}


def evaluate(
    target: Transformer,
    drafters: Mapping[str, Drafter],
    corpus: Corpus,
    cfg: EvalConfig,
    sts: STS | None,
    domains: tuple[str, ...] = DOMAINS,
) -> tuple[dict, dict]:
    """The evaluation report, and the main drafter's step records per domain.

    ``drafters`` maps a name to a drafter; the first one is the drafter under test
    (its confidences are evaluated), the others are ablations compared on acceptance.
    """
    main = next(iter(drafters))
    report: dict = {
        "split": cfg.split,
        "gamma": cfg.gamma,
        "batch": cfg.batch,
        "prompts_per_domain": cfg.prompts_per_domain,
        "max_new_tokens": cfg.max_new_tokens,
        "drafters": {name: d.version for name, d in drafters.items()},
        "sts_version": sts.version if sts else None,
        "domains": {},
    }
    all_records: dict[str, list[StepRecord]] = {}
    for domain in domains:
        prompts = corpus.prompts(cfg.split, domain, cfg.prompts_per_domain, cfg.prompt_len)
        section: dict = {}
        for name, drafter in drafters.items():
            records = run_blocks(target, drafter, prompts, cfg, domain)
            blocks = Blocks.from_records(records)
            section[name] = {**acceptance(blocks), **draft_verify_ratio(records, cfg.batch)}
            if name == main:
                all_records[domain] = records
                section["calibration"] = calibration(blocks, sts, cfg.bootstrap, cfg.seed)
        report["domains"][domain] = section
    merged = Blocks.from_records([r for recs in all_records.values() for r in recs])
    report["pooled"] = {
        "acceptance": acceptance(merged),
        "calibration": calibration(merged, sts, cfg.bootstrap, cfg.seed),
    }
    latency_prompts = corpus.prompts(cfg.split, domains[0], cfg.batch, cfg.prompt_len)
    report["draft_latency_ms"] = draft_latency(target, drafters, latency_prompts, cfg)
    report["targets"] = check_targets(report, main)
    return report, all_records


def check_targets(report: dict, main: str) -> dict:
    """The issue's acceptance targets, each with its measured value and whether it is met."""
    domains, pooled = report["domains"], report["pooled"]
    out = {}

    def target(name: str, value, threshold, met: bool) -> None:
        out[name] = {"value": value, "threshold": threshold, "met": bool(met)}

    if "code" in domains:
        code = domains["code"][main]["mean_accepted"]
        target("code_mean_accepted", code, 2.5, code >= 2.5)
        if "prose" in domains:
            prose = domains["prose"][main]["mean_accepted"]
            target("code_minus_prose_mean_accepted", round(code - prose, 4), 0.0, code > prose)
        ratio = domains["code"][main].get("draft_to_verify")
        if ratio is not None:
            target("draft_to_verify_at_batch", ratio, 0.25, ratio <= 0.25)
    ablations = [name for name in report["drafters"] if name != main]
    if ablations:
        other = ablations[0]
        mean = {
            name: sum(d[name]["mean_accepted"] * d[name]["rows"] for d in domains.values())
            / sum(d[name]["rows"] for d in domains.values())
            for name in (main, other)
        }
        gain = round(mean[main] / mean[other] - 1, 4) if mean[other] else None
        target("sequential_gain_mean_accepted", gain, 0.10, gain is not None and gain >= 0.10)
        latency = report["draft_latency_ms"]
        overhead = round(latency[main] / latency[other] - 1, 4)
        target("sequential_latency_overhead", overhead, 0.10, overhead <= 0.10)
    calib = pooled["calibration"]
    if "after" in calib:
        target("sts_mean_ece", calib["after"]["mean_ece"], 0.03, calib["after"]["mean_ece"] <= 0.03)
        worse = max(a - b for a, b in zip(calib["after"]["ece"], calib["before"]["ece"]))
        target("sts_worst_depth_regression", round(worse, 4), 0.005, worse <= 0.005)
    return out


def _r(values) -> list[float]:
    return [round(float(v), 4) for v in values]
