"""The fixed-shape path CUDA graphs capture, checked on CPU; the graphs themselves on CUDA."""

import pytest
import torch

from sparkgate.policies.calibration import STS
from sparkgate.policies.cost_model import AdditiveCostTable
from sparkgate.policies.window import CostAwareScheduler, FixedWindow, WindowDecision
from sparkgate.verify_runtime.cuda_graphs import StaticLayouts
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.kv_cache import KVCache
from sparkgate.verify_runtime.model import forward_packed
from sparkgate.verify_runtime.packing import gather_rows
from sparkgate.verify_runtime.verify import TargetRunner
from tests.conftest import SurvivalWindows, tiny_model
from tests.verify_runtime.reference import greedy_decode


def test_static_shapes_compute_what_the_ragged_layout_does(target):
    torch.manual_seed(4)
    cache = KVCache(target.args, 6, dtype=torch.float64)
    runner = TargetRunner(target, cache)
    slots = [cache.alloc() for _ in range(3)]
    runner.prefill([[1, 2, 3], [4], [5, 6]], slots)
    starts = [cache.lengths[s] for s in slots]
    lens, gamma, rows = [4, 1, 3], 4, 16
    tokens = torch.randint(0, 32, (3, gamma + 1))
    ragged = runner.layout(starts, lens, slots, tier_rows=rows)
    _, eager = forward_packed(target, cache, gather_rows(tokens, ragged), ragged)
    shapes = StaticLayouts(cache, gamma, max_batch=6)
    real = shapes.real(starts, lens, slots, rows)
    padded = shapes.padded(real)
    assert padded.groups[0].slots.shape == (6,) and padded.n_cells == 6 * (gamma + 1)
    _, static = forward_packed(target, cache, gather_rows(tokens, real), padded)
    n = sum(lens)
    torch.testing.assert_close(static[:n], eager[:n], rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="exceed the captured max_batch=2"):
        StaticLayouts(cache, gamma, max_batch=2).real(starts, lens, slots, rows)
    # Even a step that fills every place exactly takes the general path a graph captured.
    full = shapes.real([0] * 6, [gamma + 1] * 6, list(range(6)), 6 * (gamma + 1))
    assert full.dense and not shapes.padded(full).dense


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_tiers_reproduce_greedy_decoding():
    model = tiny_model(seed=8).float().cuda()
    records = []
    engine = Engine(
        model,
        ModelDrafter(model, noise=1.5),
        EngineConfig(gamma=4, max_batch=4),
        policy=SurvivalWindows(),
        graphs=True,
        sink=records.append,
    )
    prompts = [[1, 2, 3], [7], [9, 9, 9, 9], [4, 5]]
    for i, p in enumerate(prompts):
        engine.submit(Request(str(i), p, 16, mode=["static", "compact", "cap_accept", "shadow"][i], stop_at_eos=False))
    out = engine.run()
    for i, p in enumerate(prompts):
        assert out[str(i)] == greedy_decode(model, p, 16)
    assert all(r.graph_hit for r in records) and all(r.host_syncs >= 1 for r in records)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_schedule_graphs_decide_as_the_eager_stage_and_follow_a_policy_swap():
    model = tiny_model(seed=8).float().cuda()
    # Rows cost more past 8, so the scheduler cuts windows and they differ by request.
    table = AdditiveCostTable(
        bias_seconds=0.01, bs_probes=(1,), alpha_seconds=(0.0,), m_probes=(1, 8, 64), theta_seconds=(0.0, 0.0005, 0.03)
    )
    runs = {}
    for graphs in (False, True):
        records = []
        engine = Engine(
            model,
            ModelDrafter(model, noise=1.5),
            EngineConfig(gamma=4, max_batch=4, default_mode="compact"),
            policy=CostAwareScheduler(table, lag=1),
            calibrate=STS([1.3, 0.8, 1.1, 0.9]),
            graphs=graphs,
            sink=records.append,
        )
        for i, p in enumerate([[1, 2, 3], [7], [9, 9, 9, 9], [4, 5]]):  # retiring at different steps: batch 4..1
            engine.submit(Request(str(i), p, 40 - 12 * i, stop_at_eos=False))
        engine.run(max_steps=8)
        engine.policy = FixedWindow(2)  # a rollout swapping the policy: the captured stage must follow
        out = engine.run()
        runs[graphs] = (
            out,
            [[q.window_suggested for q in r.requests] for r in records],
            torch.tensor([q.survival for r in records for q in r.requests]),
        )
    (eager_out, eager_windows, eager_survival), (out, windows, survival) = runs[False], runs[True]
    assert out == eager_out and windows == eager_windows
    torch.testing.assert_close(survival, eager_survival)
    # Both policies ran at several batch sizes, each its own captured graph.
    assert len({len(step) for step in windows[:8]}) > 1 and len({len(step) for step in windows[8:]}) > 1
    assert len({w for step in windows[:8] for w in step}) > 1
    assert all(w == 2 for step in windows[8:] for w in step)


class HostListWindows:
    """Builds its windows from a host list every call: a copy no CUDA graph can capture."""

    def __call__(self, survival, ctx):
        return WindowDecision(torch.tensor([1] * ctx.batch_size, device=survival.device))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_schedule_stage_that_cannot_be_captured_runs_eagerly_and_says_why():
    model = tiny_model(seed=8).float().cuda()
    with pytest.warns(UserWarning, match="runs eagerly"):
        engine = Engine(
            model,
            ModelDrafter(model, noise=1.5),
            EngineConfig(gamma=4, max_batch=2, default_mode="compact"),
            policy=HostListWindows(),
            graphs=True,
        )
    assert "captur" in engine.schedule_graphs.eager_reason.lower()
    for i, p in enumerate([[1, 2, 3], [7]]):
        engine.submit(Request(str(i), p, 12, stop_at_eos=False))
    out = engine.run()
    assert out == {str(i): greedy_decode(model, p, 12) for i, p in enumerate([[1, 2, 3], [7]])}


class _Graph:
    def replay(self) -> None:
        pass


def test_alternating_two_policies_captures_each_once(monkeypatch):
    # What adaptive does every epoch: the fitted table's scheduler, then the static one's, and back.
    # The capture itself needs CUDA; its bookkeeping does not.
    from sparkgate.verify_runtime import cuda_graphs

    monkeypatch.setattr(cuda_graphs, "_capture", lambda schedule, logits, lagged: (_Graph(), (logits,), ("out",)))
    graphs = cuda_graphs.ScheduleGraphs(max_batch=2, gamma=3, device=torch.device("cpu"))
    fitted, static, third, calibrate = object(), object(), object(), object()
    logits = torch.zeros(2, 3)
    for policy in (fitted, static) * 5:
        assert graphs(None, (policy, calibrate), logits, None) == ("out",)
        assert graphs.owner[0] is policy
    assert graphs.captures == 2
    graphs(None, (third, calibrate), logits, None)  # a third owner evicts the oldest
    graphs(None, (static, calibrate), logits, None)
    assert graphs.captures == 3
    graphs(None, (fitted, calibrate), logits, None)
    assert graphs.captures == 4
