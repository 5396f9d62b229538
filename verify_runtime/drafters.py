"""Drafters: propose γ tokens per request with their own probabilities and a confidence.

Interface (``Drafter.propose``): a ``DraftContext`` in, a ``DraftOutput`` out with
``tokens [B, γ]``, ``probs [B, γ, V]`` (the draft distribution each token was
drawn from, rows sum to 1) and ``confidence_logits [B, γ]`` (raw ``c_k`` before
sigmoid and calibration). Drafts are drawn with uniforms keyed by (request seed,
absolute position), so the same state always yields the same drafts.

Two stand-ins until the trained block drafter ships:
- ``NGramDrafter`` — prompt-lookup over the request's own history, a real and
  cheap technique whose acceptance varies with how repetitive the text is;
- ``ModelDrafter`` — an LM run autoregressively over the recent context, with
  optional deterministic logit noise (a "noised copy of the target").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .model import Transformer, forward_full
from .rng import DRAFT, NOISE, sample_from, uniform


@dataclass
class DraftContext:
    history: list[list[int]]  # committed tokens per request; the last one is pending
    positions: torch.Tensor  # [B] absolute position of the pending token
    seeds: torch.Tensor  # [B] int64
    temperatures: torch.Tensor  # [B] float; 0 = greedy
    gamma: int
    # The target's final hidden states of the last ``hidden_window`` committed
    # positions before the pending token, oldest first, left-padded with zeros
    # (``[B, K, dim]``), and how many are real (``[B]``). Present only when the
    # drafter asks for them with a ``hidden_window`` attribute > 0.
    hidden: torch.Tensor | None = None
    hidden_len: torch.Tensor | None = None
    # Whether any request samples (temperature > 0), as the host knows it: an
    # all-greedy batch then skips the keyed sampler without reading the device.
    # None: read it from ``temperatures``.
    sampled: bool | None = None

    def any_sampled(self) -> bool:
        return bool((self.temperatures > 0).any()) if self.sampled is None else self.sampled


@dataclass
class DraftOutput:
    tokens: torch.Tensor  # [B, γ] int64
    probs: torch.Tensor  # [B, γ, V]
    confidence_logits: torch.Tensor  # [B, γ]


class Drafter(Protocol):
    version: str
    hidden_window: int  # target hidden states wanted per request (0: none)

    def propose(self, ctx: DraftContext) -> DraftOutput: ...


def temperature_probs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Softmax at each request's temperature (``[B, ..., V]``, ``[B]``); greedy rows use T=1."""
    t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).to(logits.dtype)
    return torch.softmax(logits / t.view(-1, *([1] * (logits.dim() - 1))), dim=-1)


def pick(probs: torch.Tensor, ctx: DraftContext, depth: int) -> torch.Tensor:
    """Draft token at ``depth`` (1-based): argmax for greedy requests, else a keyed sample."""
    if not ctx.any_sampled():
        return probs.argmax(-1)
    u = uniform(ctx.seeds, ctx.positions + depth, DRAFT)
    return torch.where(ctx.temperatures > 0, sample_from(probs, u), probs.argmax(-1))


def own_prob_logit(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """logit of the drafter's own probability of its token: the uncalibrated confidence."""
    p = probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).clamp(1e-6, 1 - 1e-6)
    return torch.log(p) - torch.log1p(-p)


class NGramDrafter:
    """Prompt lookup: continue the longest recent suffix match (n <= max_n) in the history.

    The draft distribution at each depth is the smoothed next-token histogram of
    all earlier occurrences of the matched suffix, so its confidence is high where
    the text repeats and low where it does not.
    """

    def __init__(self, vocab_size: int, max_n: int = 4, smoothing: float = 0.5):
        self.vocab_size, self.max_n, self.smoothing = vocab_size, max_n, smoothing
        self.version = f"ngram-n{max_n}-s{smoothing}"
        self.hidden_window = 0

    def _histogram(self, history: torch.Tensor) -> torch.Tensor:
        counts = torch.full((self.vocab_size,), self.smoothing / self.vocab_size, dtype=torch.float64)
        for n in range(min(self.max_n, len(history) - 1), 0, -1):
            earlier = history.unfold(0, n, 1)[:-1]  # every n-gram that has a follower
            follow = history[n:][(earlier == history[-n:]).all(1)]
            if follow.numel():
                counts += torch.bincount(follow, minlength=self.vocab_size).double()
                break
        return counts / counts.sum()

    def propose(self, ctx: DraftContext) -> DraftOutput:
        batch = len(ctx.history)
        tokens = torch.zeros(batch, ctx.gamma, dtype=torch.long)
        probs = torch.zeros(batch, ctx.gamma, self.vocab_size, dtype=torch.float64)
        running = [torch.tensor(h, dtype=torch.long) for h in ctx.history]
        host = _cpu(ctx)
        for k in range(ctx.gamma):
            histograms = torch.stack([self._histogram(h) for h in running])
            probs[:, k] = temperature_probs(histograms.log(), host.temperatures)
            tokens[:, k] = pick(probs[:, k], host, k + 1)
            running = [torch.cat([h, t.view(1)]) for h, t in zip(running, tokens[:, k])]
        device = ctx.positions.device
        return DraftOutput(
            tokens.to(device), probs.float().to(device), own_prob_logit(probs, tokens).float().to(device)
        )


class ModelDrafter:
    """An LM drafting autoregressively over the last ``context`` tokens (no cache).

    ``noise`` adds deterministic logistic noise of that scale to its logits, keyed
    by (seed, position), so a copy of the target becomes an imperfect drafter.
    """

    def __init__(self, model: Transformer, noise: float = 0.0, context: int = 64, version: str | None = None):
        self.model, self.noise, self.context = model, noise, context
        self.version = version or f"model-noise{noise}"
        self.hidden_window = 0

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftOutput:
        """Each request's drafts from its own last ``context`` tokens: requests of one history width are
        drafted together, so what a request drafts does not depend on what else is in the batch (cutting
        every window to the shortest history in it did)."""
        widths = [min(self.context, len(h)) for h in ctx.history]
        parts, rows = [], []
        for width in sorted(set(widths)):
            index = [i for i, w in enumerate(widths) if w == width]
            at = torch.tensor(index, device=ctx.positions.device)
            part = DraftContext([ctx.history[i] for i in index], ctx.positions[at], ctx.seeds[at],
                                ctx.temperatures[at], ctx.gamma)  # fmt: skip
            parts.append(self._propose(part, width))
            rows += index
        order = torch.argsort(torch.tensor(rows, device=ctx.positions.device))
        return DraftOutput(*(torch.cat([getattr(o, f) for o in parts])[order]
                             for f in ("tokens", "probs", "confidence_logits")))  # fmt: skip

    def _propose(self, ctx: DraftContext, width: int) -> DraftOutput:
        device = ctx.positions.device
        window = torch.tensor([h[-width:] for h in ctx.history], dtype=torch.long, device=device)
        tokens, probs = [], []
        vocab = self.model.args.vocab_size
        for k in range(1, ctx.gamma + 1):
            _, logits = forward_full(self.model, window)
            logits = logits[:, -1].double()
            if self.noise:
                u = uniform(ctx.seeds, ctx.positions + k, NOISE, lanes=vocab).clamp(1e-12, 1 - 1e-12)
                logits = logits + self.noise * (u.log() - (-u).log1p())
            p = temperature_probs(logits, ctx.temperatures)
            token = pick(p, ctx, k)
            tokens.append(token)
            probs.append(p)
            window = torch.cat([window[:, 1:] if window.shape[1] >= self.context else window, token[:, None]], 1)
        tokens_t, probs_t = torch.stack(tokens, 1), torch.stack(probs, 1)
        return DraftOutput(
            tokens_t, probs_t.to(self.model.output.weight.dtype), own_prob_logit(probs_t, tokens_t).float()
        )


def _cpu(ctx: DraftContext) -> DraftContext:
    return DraftContext(
        ctx.history, ctx.positions.cpu(), ctx.seeds.cpu(), ctx.temperatures.cpu(), ctx.gamma, sampled=ctx.sampled
    )
