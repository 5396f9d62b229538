"""Where a verify step's time goes, per kind of operator: ``sparkgate bench verify --profile``.

Both arms run the same steps under ``torch.profiler`` (CPU activity), and each
operator's self time is summed into a category. The profiler slows every
operator by a similar fixed cost, so read the categories as shares and as
compact/static ratios, not as absolute times; the benchmark's own timings come
from runs without it.

A category whose compact/static ratio stays well above the row ratio is cost
that does not shrink with the rows: attention reads every request's keys
however few query rows it has, and each operator call pays a dispatch cost
whatever its size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

# Operator name (as ``aten::name``) to category; anything else is "elementwise and other".
CATEGORIES = {
    "matmul": ("mm", "addmm", "bmm", "matmul", "linear"),
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math", "softmax"),
    "gather and scatter": ("index_select", "index_copy_", "index_put_", "_index_put_impl_", "index", "embedding"),
}
OTHER = "elementwise and other"


def category(op: str) -> str:
    name = op.removeprefix("aten::")
    return next((c for c, names in CATEGORIES.items() if name in names), OTHER)


def profile_steps(run: Callable[[], None], steps: int) -> dict[str, float]:
    """Per category, self CPU milliseconds per step of ``steps`` calls of ``run``, and ``op_calls`` per step."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            run()
    out = dict.fromkeys([*CATEGORIES, OTHER], 0.0)
    calls = 0
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        out[category(event.key)] += event.self_cpu_time_total / 1000.0 / steps
        calls += event.count
    return {**{k: round(v, 3) for k, v in out.items()}, "op_calls": round(calls / steps, 1)}


def compare(static: dict[str, float], compact: dict[str, float]) -> dict[str, float | None]:
    """compact / static per category (None where static spent nothing)."""
    return {k: round(compact[k] / static[k], 3) if static[k] else None for k in static}


def profiled(runner, tokens: torch.Tensor, slots: list[int], windows: list[list[int]]) -> dict:
    """Both arms of ``bench verify`` over the same ``windows`` (one list of per-request windows per step)."""
    width = tokens.shape[1]
    it = iter(windows)
    static = profile_steps(lambda: runner.verify(tokens, [width] * len(slots), slots), len(windows))
    compact = profile_steps(lambda: runner.verify(tokens, [w + 1 for w in next(it)], slots), len(windows))
    return {"static_ms": static, "compact_ms": compact, "compact_over_static": compare(static, compact)}
