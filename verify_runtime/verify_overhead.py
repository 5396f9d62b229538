"""The part of a verify step that does not shrink with the model's width: ``sparkgate bench verify --overhead``.

A narrow twin of the target (the same layers, heads, vocabulary, cache layout
and prompt length, at width ``TWIN_DIM`` instead of the target's) runs every timed
step beside the real one. It issues the same operators, the same number of
calls and the same ragged grouping at the same row and key counts, with almost
no arithmetic, so its CPU time is the step's fixed cost: dispatch, grouping,
gathers of the packed rows, each attention call's setup. The real step's time
less the twin's is what the arithmetic costs; compact's share of that
(``compute_ratio``, paired per step) is how near compact could come to the row
ratio if the fixed cost were zero in both arms.

The twin still computes attention scores at the real row and key counts
(those do not depend on the head width), so a little row-proportional work is
counted as fixed; at decode-sized key counts it is a few percent of the twin's
step.
"""

from __future__ import annotations

import dataclasses

from .bench_verdict import interval
from .model import ModelArgs

TWIN_DIM = 16


def narrow_twin(args: ModelArgs) -> ModelArgs:
    """``args`` at width ``TWIN_DIM`` (two or more per head), the feed-forward narrowed in proportion."""
    dim = max(TWIN_DIM, 2 * args.n_heads)
    return dataclasses.replace(args, dim=dim, ffn_hidden=max(1, args.ffn_hidden * dim // args.dim))


def overhead_summary(
    static_cpu: list[float], compact_cpu: list[float], twin_static_cpu: list[float], twin_compact_cpu: list[float]
) -> dict:
    """Per arm the twin's CPU ms per step (medians), its share of the real step, and ``compute_ratio``: per
    step, (compact - twin compact) / (static - twin static), with its interval. Lists are paired by step."""
    fixed_static = [t / s for t, s in zip(twin_static_cpu, static_cpu, strict=True)]
    fixed_compact = [t / c for t, c in zip(twin_compact_cpu, compact_cpu, strict=True)]
    compute = [
        (c - tc) / (s - ts)
        for s, c, ts, tc in zip(static_cpu, compact_cpu, twin_static_cpu, twin_compact_cpu, strict=True)
        if s > ts
    ]
    return {
        "twin_dim": TWIN_DIM,
        "twin_static_ms": interval(twin_static_cpu),
        "twin_compact_ms": interval(twin_compact_cpu),
        "fixed_share_static": interval(fixed_static),
        "fixed_share_compact": interval(fixed_compact),
        "compute_ratio": interval(compute, digits=4) if compute else None,
    }
