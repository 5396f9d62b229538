import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkgate.policies.cost_model import AdditiveCostTable, CostMeta, StepsPerSecondTable
from sparkgate.policies.window import CostAwareScheduler, FixedWindow, WindowDecision
from sparkgate.verify_runtime.admission import positions_needed
from sparkgate.verify_runtime.drafters import ModelDrafter, NGramDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.model import EOS, forward_full
from sparkgate.verify_runtime.verify import TargetRunner
from tests.conftest import SurvivalWindows, tiny_model
from tests.verify_runtime.reference import greedy_decode

MODES = ["static", "shadow", "compact", "cap_accept"]


@pytest.fixture(scope="module")
def drafter(target):
    return ModelDrafter(target, noise=1.5)


prompts = st.lists(st.integers(0, 31), min_size=1, max_size=12)


@given(
    st.lists(st.tuples(prompts, st.sampled_from(MODES), st.integers(1, 14)), min_size=1, max_size=6),
    st.integers(1, 4),
    st.integers(1, 5),
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_mode_reproduces_greedy_decoding(target, drafter, reqs, max_batch, gamma):
    """Mixed modes in one batch, varying windows and admission: token-for-token greedy."""
    engine = Engine(target, drafter, EngineConfig(gamma=gamma, max_batch=max_batch), policy=SurvivalWindows())
    for i, (prompt, mode, n) in enumerate(reqs):
        engine.submit(Request(str(i), prompt, n, mode=mode, stop_at_eos=False))
    outputs = engine.run()
    for i, (prompt, _, n) in enumerate(reqs):
        assert outputs[str(i)] == greedy_decode(target, prompt, n)


def test_ngram_drafter_also_reproduces_greedy(target):
    prompt = [3, 4, 5, 3, 4, 5, 3, 4]
    engine = Engine(target, NGramDrafter(32), EngineConfig(gamma=4, max_batch=2), policy=SurvivalWindows())
    engine.submit(Request("a", prompt, 20, mode="compact", stop_at_eos=False))
    engine.submit(Request("b", prompt[:3], 20, mode="static", stop_at_eos=False))
    out = engine.run()
    assert out["a"] == greedy_decode(target, prompt, 20)
    assert out["b"] == greedy_decode(target, prompt[:3], 20)


def test_prefill_threads_apply_while_prefilling_only(target, drafter, monkeypatch):
    seen = []
    real_prefill = TargetRunner.prefill

    def prefill(runner, *args, **kw):
        seen.append(torch.get_num_threads())
        return real_prefill(runner, *args, **kw)

    monkeypatch.setattr("sparkgate.verify_runtime.verify.TargetRunner.prefill", prefill)
    before = torch.get_num_threads()
    wanted = before + 1
    engine = Engine(target, drafter, EngineConfig(gamma=3, max_batch=2, prefill_threads=wanted))
    for i, p in enumerate([[1, 2, 3], [4, 5], [6]]):  # the third is admitted later, by a second prefill
        engine.submit(Request(str(i), p, 6 + 4 * i, stop_at_eos=False))
    out = engine.run()
    assert seen == [wanted, wanted] and torch.get_num_threads() == before
    assert out == {str(i): greedy_decode(target, p, 6 + 4 * i) for i, p in enumerate([[1, 2, 3], [4, 5], [6]])}


def run_sampled(target, drafter, mode, seed_base=0):
    records = []
    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=3), policy=SurvivalWindows(), sink=records.append)
    for i in range(5):
        engine.submit(
            Request(f"r{i}", [i, 2 * i + 1, 7], 16, temperature=0.9, seed=seed_base + i, mode=mode, stop_at_eos=False)
        )
    return engine.run(), records


def test_cap_accept_and_compact_commit_identical_tokens(target, drafter):
    cap, cap_records = run_sampled(target, drafter, "cap_accept")
    compact, compact_records = run_sampled(target, drafter, "compact")
    assert cap == compact
    # same windows, same commits, but cap-accept verified the full block
    assert [r.verify_rows for r in cap_records] != [r.verify_rows for r in compact_records]
    cap_rows = [row for rec in cap_records for row in rec.requests]
    compact_rows = [row for rec in compact_records for row in rec.requests]
    assert [(r.window, r.accepted, r.committed_tokens) for r in cap_rows] == [
        (r.window, r.accepted, r.committed_tokens) for r in compact_rows
    ]
    # and the seeds matter: another seed base commits something else
    other, _ = run_sampled(target, drafter, "compact", seed_base=100)
    assert other != compact


def test_greedy_and_sampled_requests_share_a_batch_without_changing_each_other(target):
    """A batch with any sampled request draws uniforms for all; an all-greedy batch draws none.
    Either way greedy requests decode greedily and a sampled request commits what it commits alone.
    (The n-gram drafter drafts each request from its own history; ``ModelDrafter`` reads a window
    as wide as the batch's shortest history, so its drafts depend on the batch.)"""

    def run(reqs):
        engine = Engine(target, NGramDrafter(32), EngineConfig(gamma=4, max_batch=3), policy=SurvivalWindows())
        for r in reqs:
            engine.submit(r)
        return engine.run()

    sampled = dict(
        prompt=[5, 11, 7, 5, 11, 7, 5], max_new_tokens=24, temperature=0.9, seed=3, mode="compact", stop_at_eos=False
    )
    alone = run([Request("s", **sampled)])["s"]
    mixed = run(
        [
            Request("g0", [1, 2, 3], 16, mode="static", stop_at_eos=False),
            Request("s", **sampled),
            Request("g1", [4, 4], 16, mode="compact", stop_at_eos=False),
        ]
    )
    assert mixed["s"] == alone != greedy_decode(target, sampled["prompt"], 24)  # it did sample
    assert mixed["g0"] == greedy_decode(target, [1, 2, 3], 16) and mixed["g1"] == greedy_decode(target, [4, 4], 16)


def test_state_after_a_step_equals_replaying_committed_tokens(target, drafter):
    """Next-step logits from the cache agree with a dense forward over the committed tokens."""
    engine = Engine(target, drafter, EngineConfig(gamma=5, max_batch=4), policy=SurvivalWindows())
    for i in range(4):
        engine.submit(Request(str(i), [i + 1, 9, 2 * i], 30, mode=MODES[i], stop_at_eos=False))
    for _ in range(3):
        engine.step()
        for r in engine.active:
            last = torch.zeros(1, 2, dtype=torch.long)
            last[0, 0] = r.history[-1]
            cached = engine.runner.verify(last, [1], [r.slot]).logits[0, 0]
            _, dense = forward_full(target, torch.tensor([r.history]))
            torch.testing.assert_close(cached, dense[0, -1], rtol=0, atol=1e-5)


def test_rejected_rows_are_never_read(target, drafter):
    """Poison every cache row past the committed length: decoding is unchanged."""
    clean = Engine(target, drafter, EngineConfig(gamma=4, max_batch=2), policy=SurvivalWindows())
    poisoned = Engine(target, drafter, EngineConfig(gamma=4, max_batch=2), policy=SurvivalWindows())
    for e in (clean, poisoned):
        e.submit(Request("x", [5, 6, 7], 24, mode="compact", stop_at_eos=False))
        e.submit(Request("y", [1], 24, mode="static", stop_at_eos=False))
    while poisoned.queue or poisoned.active:
        poisoned._admit()
        for r in poisoned.active:
            n = poisoned.cache.lengths[r.slot]
            poisoned.cache.k[:, r.slot, n:] = 1e4
            poisoned.cache.v[:, r.slot, n:] = -1e4
        poisoned.step()
    assert {k: v.output for k, v in poisoned.finished.items()} == clean.run()


def test_records_carry_the_labels_of_each_mode(target, drafter):
    records = []
    gamma = 4
    engine = Engine(target, drafter, EngineConfig(gamma=gamma, max_batch=8), policy=FixedWindow(2), sink=records.append)
    for i, mode in enumerate(MODES * 2):
        engine.submit(Request(f"{mode}{i}", [i, 3, 1], 10, mode=mode, task="code", stop_at_eos=False))
    engine.run()
    assert [r.step_id for r in records] == list(range(len(records)))
    for rec in records:
        assert rec.verify_rows == sum((r.window if r.mode == "compact" else gamma) + 1 for r in rec.requests)
        assert rec.tier_rows >= rec.verify_rows and rec.graph_hit and rec.miss_reason is None
        assert rec.step_ms >= rec.verify_ms > 0
        for row in rec.requests:
            assert len(row.confidence) == len(row.survival) == gamma
            assert all(a >= b for a, b in zip(row.survival, row.survival[1:]))
            assert len(row.committed_tokens) == row.accepted + 1
            assert row.window_suggested == 2 and row.task == "code"
            if row.mode in ("static", "shadow"):
                assert row.window == gamma and row.full_accept == row.accepted and row.cap_trim == 0
            elif row.mode == "cap_accept":
                assert row.window == 2 and row.accepted == min(row.full_accept, 2)
                assert row.cap_trim == row.full_accept - row.accepted
            else:
                assert row.window == 2 and row.cap_trim == 0
                assert row.full_accept == (None if row.accepted == 2 else row.accepted)


def test_tier_misses_are_recorded(target, drafter):
    from sparkgate.verify_runtime.tiers import TierGrid

    records = []
    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=4), tiers=TierGrid((8,)), sink=records.append)
    for i in range(4):
        engine.submit(Request(str(i), [1, 2], 3, stop_at_eos=False))
    engine.step()
    rec = records[0]
    assert (rec.verify_rows, rec.tier, rec.tier_rows, rec.graph_hit, rec.miss_reason) == (
        20,
        -1,
        20,
        False,
        "over_max_tier",
    )


def test_a_step_record_is_stamped_when_the_step_finished(target, drafter):
    # Spans (collectors/tracing.py) end at ts and start step_ms before it: they must lie within the step.
    import time

    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=4))
    engine.submit(Request("q0", [1, 2, 3], 12, stop_at_eos=False, mode="static"))
    engine.step()  # prefill
    before = time.time()
    record = engine.step()
    after = time.time()
    assert before + record.step_ms / 1000 <= record.ts + 1e-3 and record.ts <= after


def test_finishes_at_eos_and_frees_the_slot():
    model = tiny_model(vocab=260, seed=5)
    ref = greedy_decode(model, [10, 11], 8)
    stop_at = ref[3]
    with torch.no_grad():  # whatever greedy would emit as `stop_at`, it now emits EOS
        model.output.weight[EOS] = model.output.weight[stop_at]
        model.output.weight[stop_at] -= 100.0 * model.output.weight[stop_at].sign()
    engine = Engine(model, NGramDrafter(260), EngineConfig(gamma=3, max_batch=1))
    engine.submit(Request("a", [10, 11], 20))
    engine.submit(Request("b", [12], 2))
    out = engine.run()
    assert out["a"] == ref[: ref.index(stop_at)] + [EOS]
    assert engine.finished["a"].finish_reason == "eos"
    assert len(out["b"]) <= 2 and engine.cache.free_slots == 1


@pytest.mark.parametrize("mode", ["static", "compact"])
@pytest.mark.parametrize("limit", [2, 3, 4])
def test_an_eos_committed_past_the_limit_in_the_same_step_is_cut_with_the_rest(mode, limit):
    model = tiny_model(vocab=260, seed=3)
    stop_at = greedy_decode(model, [10, 11], 8)[3]
    with torch.no_grad():  # greedy now emits EOS where it emitted `stop_at`
        model.output.weight[EOS] = model.output.weight[stop_at]
        model.output.weight[stop_at] -= 100.0 * model.output.weight[stop_at].sign()
    ref = greedy_decode(model, [10, 11], 8)
    assert ref.index(EOS) == 3
    records = []
    # An exact copy drafts what greedy emits, so the first step commits past the limit, EOS among the tokens.
    engine = Engine(model, ModelDrafter(model), EngineConfig(gamma=7, max_batch=1), request_sink=records.append)
    engine.submit(Request("a", [10, 11], limit, mode=mode))
    reason = "eos" if limit > 3 else "length"  # EOS is the fourth token: kept only within a limit of 4
    assert engine.run()["a"] == ref[:limit] and engine.finished["a"].finish_reason == reason
    assert (records[0].output_tokens, records[0].finish_reason) == (limit, reason)


@given(prompts, st.integers(1, 14), st.integers(1, 5), st.sampled_from(MODES), st.sampled_from([0.0, 1.0]))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_cache_of_exactly_the_positions_a_request_needs_serves_it(target, drafter, prompt, n, gamma, mode, temp):
    """The last block starts at the newest committed token (position at most prompt + n - 2, while tokens
    remain) and writes γ + 1 rows: prompt + n + γ - 1 positions. Admission counted 2 more and refused
    requests that fit."""
    need = positions_needed(len(prompt), n, gamma)
    assert need == len(prompt) + n + gamma - 1
    exact = Engine(target, drafter, EngineConfig(gamma=gamma, max_batch=1, cache_len=need), policy=SurvivalWindows())
    roomy = Engine(target, drafter, EngineConfig(gamma=gamma, max_batch=1), policy=SurvivalWindows())
    for engine in (exact, roomy):
        engine.submit(Request("r", prompt, n, mode=mode, temperature=temp, seed=3, stop_at_eos=False))
    assert exact.run() == roomy.run()


@pytest.mark.parametrize(
    "request_, message",
    [
        (Request("long", [1] * 50, 49), "'long' needs 102 positions"),
        (Request("empty", [], 5), "empty prompt"),
        (Request("zero", [1], 0), r"max_new_tokens=0"),
        # Each of these was taken, then stalled every later step or had the collector refuse the step record
        # of the requests batched with it.
        (Request("odd", [1], 3, mode="sideways"), r"'odd': unknown verify mode 'sideways'"),
        (Request("oov", [1, 32], 3), r"'oov': prompt token 32 is not in the vocabulary \[0, 32\)"),
        (Request("neg", [1, -1], 3), r"prompt token -1 is not in the vocabulary"),
        (Request("hot", [1], 3, temperature=float("nan")), r"'hot': temperature=nan must be a finite number >= 0"),
        (Request("cold", [1], 3, temperature=-1.0), r"temperature=-1.0 must be"),
        (Request("bell\x07", [1], 3), r"request_id 'bell\\x07': no control"),
        (Request("", [1], 3), r"request_id '': must not be empty"),
        (Request("good", [2], 3), r"'good': request_id is already queued or running"),
    ],
)
def test_a_request_that_cannot_be_served_is_refused_at_submit_and_the_rest_served(target, drafter, request_, message):
    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=2))
    engine.submit(Request("good", [1, 2, 3], 4, stop_at_eos=False))
    with pytest.raises(ValueError, match=message):
        engine.submit(request_)
    assert engine.run() == {"good": greedy_decode(target, [1, 2, 3], 4)}


def test_a_prefill_that_fails_leaves_its_requests_queued_and_their_slots_free(target, drafter, monkeypatch):
    """Admission had taken them from the queue and given them slots first: a failed prefill lost both."""
    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=2))
    for name in ("a", "b"):
        engine.submit(Request(name, [1, 2, 3], 4, stop_at_eos=False))
    real, calls = engine.runner.prefill, []

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: out of memory")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "prefill", once)
    free = engine.cache.free_slots
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.step()
    assert [r.request_id for r in engine.queue] == ["a", "b"] and not engine.active
    assert engine.cache.free_slots == free
    assert engine.run() == {name: greedy_decode(target, [1, 2, 3], 4) for name in ("a", "b")}


def flat_table(max_tokens=4096):
    """Verification is free: the scheduler should verify everything."""
    return StepsPerSecondTable(
        sample_batch_tokens=(1, max_tokens), sample_steps_per_sec=(100.0, 100.0), max_batch_tokens=max_tokens
    )


def test_cost_aware_compact_reproduces_greedy_and_logs_predictions(target):
    records = []
    engine = Engine(
        target,
        ModelDrafter(target, noise=1.5),
        EngineConfig(gamma=4, max_batch=3),
        policy=CostAwareScheduler(flat_table()),
        sink=records.append,
    )
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    for i, p in enumerate(prompts):
        engine.submit(Request(str(i), p, 12, mode="compact", stop_at_eos=False))
    out = engine.run()
    for i, p in enumerate(prompts):
        assert out[str(i)] == greedy_decode(target, p, 12)
    assert all(isinstance(r.predicted_step_ms, float) and r.predicted_step_ms > 0 for r in records)
    # free verification: every request verifies the whole block
    assert all(row.window == 4 for r in records for row in r.requests)


def test_steps_record_the_tables_prediction_at_the_rows_they_ran(target, drafter):
    """Cap-accept verifies the whole block whatever window the scheduler priced: the step records its table's
    prediction at the rows it ran, not the plan's price; a policy without a table records none."""
    table = AdditiveCostTable(
        bias_seconds=0.002, bs_probes=(1, 4), alpha_seconds=(0.0, 0.001), m_probes=(1, 32),
        theta_seconds=(0.0, 0.05), meta=CostMeta(hardware={}, model="m", tiers=()),
    )  # fmt: skip
    for policy, mode in ((CostAwareScheduler(table), "cap_accept"), (FixedWindow(4), "static")):
        records = []
        engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=3), policy=policy, sink=records.append)
        for i, p in enumerate([[1, 2, 3], [4], [5, 6, 7, 8, 9]]):
            engine.submit(Request(str(i), p, 8, mode=mode, stop_at_eos=False))
        engine.run()
        if isinstance(policy, FixedWindow):
            assert all(r.table_step_ms is None for r in records)
            continue
        assert all(r.table_step_ms == table.predict_step_ms(r.batch_size, r.verify_rows) for r in records)
        assert any(r.table_step_ms > r.predicted_step_ms for r in records)  # more rows ran than were priced


class RecordingLag:
    """A lagged policy that remembers what it was shown."""

    lag = 2

    def __init__(self):
        self.seen = []

    def __call__(self, survival, ctx):
        self.seen.append((survival.clone(), ctx.lagged_survival.clone()))
        return WindowDecision(torch.full((survival.shape[0],), ctx.gamma))


def test_lagged_policies_see_the_survivals_of_two_steps_ago(target):
    policy = RecordingLag()
    engine = Engine(target, ModelDrafter(target, noise=1.5), EngineConfig(gamma=3, max_batch=1), policy=policy)
    engine.submit(Request("a", [1, 2], 20, stop_at_eos=False))
    for _ in range(4):
        engine.step()
    (s0, l0), (s1, l1), (_, l2), (_, l3) = policy.seen
    assert torch.equal(l0, torch.ones_like(s0)) and torch.equal(l1, torch.ones_like(s1))
    assert torch.equal(l2, s0) and torch.equal(l3, s1)


def test_steps_carry_the_joint_contract_and_a_new_sts_file_changes_it(target, drafter):
    engine = Engine(target, drafter, EngineConfig(gamma=4, max_batch=2, sts_version="sts-1"))
    engine.submit(Request("a", [1, 2], 2, stop_at_eos=False))
    record = engine.step()
    parts = engine.contract
    assert record.contract == parts.fingerprint()
    assert (parts.target, parts.drafter, parts.gamma, parts.sts) == (
        record.model_version, record.drafter_version, 4, "sts-1"
    )  # fmt: skip
    engine.config.sts_version = "sts-2"
    assert engine.step().contract != record.contract
