"""One summary for the CLI and the benchmark: tokens over wall time and over the decode steps' own clock."""

import pytest

from sparkgate.policies.window import FixedWindow
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.summary import run_interleaved, run_timed, summarize
from tests.collectors.strategies import compact_row, step
from tests.conftest import tiny_model
from tests.verify_runtime.reference import greedy_decode


def test_summary_figures_by_hand():
    records = [
        step(1, requests=[compact_row(window=2, accepted=2), compact_row(window=3, accepted=1, request_id="r2")]),
        step(
            2, requests=[compact_row(window=4, accepted=4)], graph_hit=False, miss_reason="over_max_tier", step_ms=5.5
        ),
    ]
    summary = summarize(records, {"r1": [1, 2, 3], "r2": [4, 5]}, seconds=0.1)
    assert summary == {
        "tokens_per_s": 50.0,  # 5 delivered tokens in 0.1 s of wall time
        "decode_tokens_per_s": 500.0,  # the same 5 over 4.5 + 5.5 ms of decode steps
        "decode_share": 0.1,
        "committed_tokens": 3 + 2 + 5,
        "mean_window": 3.0,
        "mean_accepted": round(7 / 3, 3),
        "mean_verify_rows": 7.5,  # 2 * 5 and 1 * 5 rows at gamma 4
        "steps": 2,
        "tier_misses": 1,
        "stage_ms": {"draft": 1.0, "schedule": 0.1, "verify": 3.0, "accept": 0.2},
    }


def test_run_timed_records_every_step_and_returns_every_output():
    target = tiny_model()
    engine = Engine(target, ModelDrafter(target, noise=1.5), EngineConfig(gamma=3, max_batch=2), policy=FixedWindow(2))
    prompts = {"a": [1, 2, 3], "b": [4, 5], "c": [6]}
    requests = [Request(rid, p, 6, mode="compact", stop_at_eos=False) for rid, p in prompts.items()]
    records, outputs, seconds = run_timed(engine, requests)
    assert outputs == {rid: greedy_decode(target, p, 6) for rid, p in prompts.items()}
    assert records and seconds > 0
    summary = summarize(records, outputs, seconds)
    assert summary["steps"] == len(records) and summary["decode_share"] <= 1.0
    assert summary["mean_window"] <= 2.0 and summary["tokens_per_s"] == pytest.approx(18 / seconds, rel=0.01)


def test_run_interleaved_gives_each_engine_what_it_gives_alone_and_times_its_own_steps():
    target = tiny_model()
    prompts = {"a": [1, 2, 3], "b": [4, 5], "c": [6]}

    def arm(window: int, max_new: int):
        engine = Engine(
            target, ModelDrafter(target, noise=1.5), EngineConfig(gamma=3, max_batch=2), policy=FixedWindow(window)
        )
        return engine, [Request(rid, p, max_new, mode="compact", stop_at_eos=False) for rid, p in prompts.items()]

    # The second arm needs more steps: the loop keeps stepping it after the first has finished.
    timed = run_interleaved({"short": arm(1, 4), "long": arm(3, 9)})
    assert list(timed) == ["short", "long"]
    for name, max_new in (("short", 4), ("long", 9)):
        run = timed[name]
        assert run.outputs == {rid: greedy_decode(target, p, max_new) for rid, p in prompts.items()}
        assert run.records and run.seconds > 0 and run.cpu_seconds > 0
        assert {rec.requests[0].window for rec in run.records} <= {1 if name == "short" else 3}
    # Each engine's clock counts its own steps only.
    assert timed["short"].seconds * 1000 >= sum(rec.step_ms for rec in timed["short"].records) * 0.99
