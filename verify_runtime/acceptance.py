"""Lossless acceptance of drafted tokens (greedy and speculative sampling).

Shapes: ``B`` requests, ``γ`` drafts. Row ``k`` of the target's strided view is
its distribution for draft ``k+1`` (row 0 follows the last committed token), so
``p`` has ``γ+1`` rows and the last is the bonus distribution after all drafts.

Per request:
- ``verified`` drafts were run through the target (γ, or the compact window);
- ``limit`` caps what may be committed (the window for ``cap_accept``/``compact``,
  γ otherwise);
- ``full`` = leading drafts accepted among the verified ones (``a*`` when the
  whole block was verified);
- ``accepted`` = ``min(full, limit)``; the token after them is a correction from
  ``norm(max(p - q, 0))`` when a draft inside the limit was rejected, else a
  bonus from ``p``. Cutting at the limit therefore commits exactly what a
  compact window of that size would, given the same uniforms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .rng import sample_from


@dataclass
class AcceptInput:
    p: torch.Tensor  # [B, γ+1, V] target probabilities (rows past `verified` unused)
    q: torch.Tensor  # [B, γ, V] draft probabilities
    drafts: torch.Tensor  # [B, γ] int64
    verified: torch.Tensor  # [B] int64 in [0, γ]
    limit: torch.Tensor  # [B] int64 in [0, verified]
    greedy: torch.Tensor  # [B] bool: temperature 0
    # Uniforms for the accept test of draft k+1 ([B, γ]) and for the token sampled
    # at row k ([B, γ+1]). None only when every request is greedy, which the
    # caller knows on the host: then nothing is drawn and nothing is sampled.
    u_accept: torch.Tensor | None = None
    u_sample: torch.Tensor | None = None


@dataclass
class AcceptResult:
    accepted: torch.Tensor  # [B] drafts committed
    full: torch.Tensor  # [B] leading drafts accepted among the verified
    next_token: torch.Tensor  # [B] correction or bonus token


def draft_accepts(x: AcceptInput) -> torch.Tensor:
    """``[B, γ]`` bool: would draft k+1 pass its own test (ignoring earlier rejections)."""
    greedy = x.drafts == x.p[:, :-1].argmax(-1)
    if x.u_accept is None:
        return greedy
    p_d = x.p[:, :-1].gather(-1, x.drafts.unsqueeze(-1)).squeeze(-1)
    q_d = x.q.gather(-1, x.drafts.unsqueeze(-1)).squeeze(-1)
    sampled = x.u_accept * q_d < p_d  # u < min(1, p/q) without dividing by q
    return torch.where(x.greedy.unsqueeze(-1), greedy, sampled)


def accept_all(x: AcceptInput) -> torch.Tensor:
    """A deliberately broken rule (every draft passes) for negative controls."""
    return torch.ones_like(x.drafts, dtype=torch.bool)


def accept(x: AcceptInput, passes: Callable[[AcceptInput], torch.Tensor] = draft_accepts) -> AcceptResult:
    gamma = x.drafts.shape[1]
    depth = torch.arange(1, gamma + 1, device=x.drafts.device)
    ok = passes(x) & (depth.unsqueeze(0) <= x.verified.unsqueeze(1))
    full = ok.long().cumprod(-1).sum(-1)
    accepted = torch.minimum(full, x.limit)
    rejected = full < x.limit

    rows = accepted.view(-1, 1, 1).expand(-1, 1, x.p.shape[-1])
    p_row = x.p.gather(1, rows).squeeze(1)
    if x.u_sample is None:
        return AcceptResult(accepted=accepted, full=full, next_token=p_row.argmax(-1))
    q_pad = torch.cat([x.q, torch.zeros_like(x.q[:, :1])], dim=1)
    q_row = q_pad.gather(1, rows).squeeze(1)
    residual = (p_row - q_row).clamp(min=0)
    # p == q exactly leaves no residual mass; rejection then had probability 0.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_row)
    dist = torch.where(rejected.unsqueeze(-1), residual, p_row)
    u = x.u_sample.gather(1, accepted.unsqueeze(1)).squeeze(1)
    sampled = sample_from(dist, u)
    next_token = torch.where(x.greedy, p_row.argmax(-1), sampled)
    return AcceptResult(accepted=accepted, full=full, next_token=next_token)


def next_accept_prob(x: AcceptInput) -> torch.Tensor:
    """``[B]``: the probability that draft ``verified + 1`` passes its test, from the target's row at
    ``verified`` (computed whenever ``verified < γ``: it is the bonus row): ``min(1, p/q)`` of a sampled
    request, 1 or 0 for a greedy one (is it the argmax?). Meaningless where ``verified == γ``; a compact row
    that used up its window reports it, so the label past the window is known in probability
    (``collectors.labels``)."""
    gamma, vocab = x.drafts.shape[1], x.p.shape[-1]
    k = x.verified.clamp(max=gamma - 1)
    draft = x.drafts.gather(1, k.unsqueeze(1))
    p_row = x.p.gather(1, k.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1)
    q_row = x.q.gather(1, k.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1)
    p_d, q_d = p_row.gather(1, draft).squeeze(1), q_row.gather(1, draft).squeeze(1)
    # A draft the drafter could not have sampled (q = 0) would pass whenever p > 0.
    sampled = torch.where(
        q_d > 0, (p_d / q_d.clamp_min(torch.finfo(q_d.dtype).tiny)).clamp(max=1.0), (p_d > 0).to(p_d.dtype)
    )
    return torch.where(x.greedy, (p_row.argmax(-1) == draft.squeeze(1)).to(p_d.dtype), sampled)
