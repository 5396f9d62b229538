"""``sparkgate bench controller``: the gate-evaluation and fleet-merge benchmark runs end to end."""

from __future__ import annotations

from sparkgate.controller.bench import run


def test_benchmark_smoke():
    result = run(labels=20_000, replicas=5, repeats=1)
    assert result["labels"] == 89 * 7 * 32 and result["merge_replicas"] == 5
    assert {"eval_ms", "merge_ms", "merge_fold_ms", "load_avg_1m"} <= result.keys()
