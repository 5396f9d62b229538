"""The goodput sweep: open-loop arrivals through the real engine, and the sustained-rate rule."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from sparkgate.collectors.request_records import validate
from sparkgate.policies.cost_model import StepsPerSecondTable
from sparkgate.verify_runtime.bench_goodput import Sweep, open_loop, run_goodput, sustained
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request


def test_a_rate_is_sustained_only_when_it_and_every_lighter_rate_meet_the_slo():
    curve = {r: {"tpot_p99_ms": ms} for r, ms in {1.0: 10.0, 2.0: 12.0, 4.0: 30.0, 8.0: 11.0}.items()}
    assert sustained(curve, 20.0) == 2.0  # 8 req/s meets it, but 4 did not: saturation was passed
    assert sustained(curve, 5.0) == 0.0 and sustained(curve, 100.0) == 8.0


def test_open_loop_arrivals_are_stamped_when_they_arrive_and_every_request_is_recorded(target):
    engine = Engine(target, ModelDrafter(target, noise=1.5), EngineConfig(gamma=4, max_batch=4))
    requests = [Request(f"q{i}", [1, 2, 3], 6, stop_at_eos=False) for i in range(6)]
    records, cpu_s = open_loop(engine, requests, rate=200.0, seed=1)
    assert sorted(r.request_id for r in records) == [f"q{i}" for i in range(6)] and cpu_s > 0
    assert all(validate(r.to_dict()) == [] for r in records)
    arrivals = [r.arrival_ts for r in sorted(records, key=lambda r: int(r.request_id[1:]))]
    assert arrivals == sorted(arrivals) and arrivals[-1] > arrivals[0]  # a Poisson process, in order


def test_the_sweep_reports_curves_the_slo_and_the_ratio_with_its_coverage(target):
    table = StepsPerSecondTable(sample_batch_tokens=(1,), sample_steps_per_sec=(100.0,), max_batch_tokens=10_000)
    sweep = Sweep(rates=(50.0, 400.0), requests=4, max_new_tokens=6, rounds=2, max_batch=4, gamma=4)
    prompts = [SimpleNamespace(task="t", tokens=[1 + i, 2, 3]) for i in range(4)]
    out = run_goodput(target, ModelDrafter(target, noise=1.5), table, sweep, progress=False, prompts=prompts)
    assert set(out["curves"][0]) == {"static", "cost_aware"} and set(out["curves"][0]["static"]) == {"50.0", "400.0"}
    # The default SLO is 3x static's median TPOT at the lightest rate of the first round.
    assert out["tpot_slo_ms"] == round(3 * out["curves"][0]["static"]["50.0"]["tpot_p50_ms"], 3) > 0
    assert out["rounds"] == 2
    # A round whose static arm sustains no rate (a p99 over the SLO on a loaded machine) gives no ratio; the
    # interval and its coverage are over the rounds that do.
    valid = [s["cost_aware"] / s["static"] for s in out["sustained"] if s["static"]]
    if valid:
        assert out["interval_coverage"] == round(1 - 2.0 ** (1 - len(valid)), 3)
        assert out["sustained_ratio_interval"] == [min(valid), max(valid)]
        low, high = out["sustained_ratio_interval"]
        assert low <= out["sustained_ratio"] <= high
    else:
        assert out["sustained_ratio"] is None and out["interval_coverage"] is None
    # An SLO nothing misses: every round of both arms sustains the heaviest rate, whatever the machine's
    # load, so the ratio and its interval are always there to check.
    loose = run_goodput(target, ModelDrafter(target, noise=1.5), table, replace(sweep, tpot_slo_ms=1e9), progress=False,
                        prompts=prompts)  # fmt: skip
    assert loose["sustained"] == [{"static": 400.0, "cost_aware": 400.0}] * 2
    assert (loose["sustained_ratio"], loose["sustained_ratio_interval"], loose["interval_coverage"]) == (
        1.0,
        [1.0, 1.0],
        0.5,
    )
