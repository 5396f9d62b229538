"""Fixtures and helpers shared by more than one test file (one place, so there is one ``store`` and one clock).

Beside the store, clock and tiny models every layer uses: the SGLang ``/server_info`` payloads the
collectors' poller and ``sparkgate collect`` read, the survivals strategy of the window-policy
properties, a tiny block drafter, ``one_thread`` for modules of tiny torch models, and the runtime's
``evaluated`` drafter evaluation.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch
from hypothesis import strategies as st

import sparkgate.dashboards
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.policies.calibration import STS
from sparkgate.policies.payload import PolicyPayload
from sparkgate.policies.window import WindowDecision
from sparkgate.verify_runtime.block_drafter import BlockDrafter, DrafterArgs, DSparkNet
from sparkgate.verify_runtime.corpus import stdlib_corpus
from sparkgate.verify_runtime.drafters import NGramDrafter
from sparkgate.verify_runtime.evaluation import EvalConfig, evaluate
from sparkgate.verify_runtime.model import BYTE_VOCAB, ModelArgs, Transformer

T0 = 1.75e9
# The Streamlit script, where the installed package has it.
APP = Path(sparkgate.dashboards.__file__).with_name("app.py")


class Clock:
    """A clock a test moves by hand."""

    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "events.duckdb") as s:
        yield s


@pytest.fixture
def ingestor(store):
    return Ingestor(store, Metrics())


@pytest.fixture(scope="session")
def fixture_store(tmp_path_factory):
    """The dashboards' store with known contents (``tests/dashboards/known_store.py``)."""
    from tests.dashboards.known_store import build

    return build(tmp_path_factory.mktemp("dashboards"))


def policy_payload(phase: str, compact_fraction: float = 0.0, **changes) -> PolicyPayload:
    """A policy payload at revision 1 (γ 7, observe 0.05, static fallback) with ``changes``."""
    fields = {"revision": 1, "observe_fraction": 0.05, "fallback_window": 7, "gamma": 7, "cost_table_version": None,
              "cost_tables": {}, "sts_version": None, "switchback": None, **changes}  # fmt: skip
    return PolicyPayload(phase=phase, compact_fraction=compact_fraction, **fields)


def consistency_check(i: int, **extra) -> dict:
    """A replica's greedy-replay check of request ``req-{i}`` (a ``consistency_checks`` row)."""
    return {"received_at": 1.0, "replica_id": "r0", "request_id": f"req-{i}", "kind": "greedy_replay",
            "tokens": 10, "mismatch_at": None, "expected": None, "got": None, **extra}  # fmt: skip


def request_record(**changes) -> dict:
    """A valid request record (schema v2): 3 tokens in two commits, 400 ms to the first."""
    base = {"replica_id": "r0", "request_id": "q0", "arrival_ts": T0, "first_token_ts": T0 + 0.4,
            "finish_ts": T0 + 0.5, "finish_reason": "eos", "prompt_tokens": 12, "output_tokens": 3,
            "mode": "static", "phase": "shadow", "policy_revision": 1, "commit_offsets_ms": [400.0, 500.0],
            "commit_tokens": [2, 1], "epoch": None, "arm": None, "contract": None, "schema_version": 2}  # fmt: skip
    return {**base, **changes}


def with_columns(wire: pa.Table, **values) -> pa.Table:
    """``wire`` with step columns replaced by one value each (e.g. phase, batch_size)."""
    for name, value in values.items():
        wire = wire.set_column(
            wire.schema.get_field_index(name), name, pa.array([value] * wire.num_rows, wire.schema.field(name).type)
        )
    return wire


def ingest_synthetic(
    store: Store,
    steps: int,
    ts: float,
    phase: str = "shadow",
    replica: str = "r0",
    first_step: int = 0,
    batch: int = 32,
    **columns,
) -> pa.Table:
    """``steps`` valid synthetic steps (10 ms apart from ``ts``) stored as recorded in ``phase``."""
    wire = synthetic_steps(steps, ts, phase, replica, first_step, batch, **columns)
    ingest_wire(store, wire)
    return wire


def synthetic_steps(
    steps: int, ts: float, phase: str = "shadow", replica: str = "r0", first_step: int = 0, batch: int = 32, **columns
) -> pa.Table:
    """What ``ingest_synthetic`` stores, as a wire table (for tests that store many such runs in one batch)."""
    wire = synthetic_wire(steps, batch, 7, replica, first_step=first_step, seed=first_step, ts=ts)
    return with_columns(wire, phase=phase, **columns)


def ingest_wire(store: Store, wire: pa.Table) -> None:
    """Store a wire table as one batch; every row valid."""
    result = store.ingest(from_wire(wire), "test")
    assert result.quarantined == 0


def tiny_model(vocab: int = 32, seed: int = 0, init_std: float = 0.3, **kw) -> Transformer:
    """A small random-initialised model, float64 so packed and dense paths agree far below any argmax margin."""
    torch.manual_seed(seed)
    args = ModelArgs(
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=64,
        vocab_size=vocab,
        max_seq_len=96,
        init_std=init_std,
        **kw,
    )
    return Transformer(args).double().eval()


@pytest.fixture(scope="module")
def target() -> Transformer:
    return tiny_model()


class SurvivalWindows:
    """A deterministic window policy that still varies per request and step: the window is read off
    digits of the survival values, which depend only on the request's state."""

    def __call__(self, survival, ctx):
        digits = (survival[:, 0].double() * 1e6).long()
        return WindowDecision(digits % (ctx.gamma + 1))


# SGLang /server_info payloads, shaped as SGLang writes them (tests/collectors/sglang_stand_in.py cites the
# upstream code): fields at their default are absent keys, and num_verify_tokens is the padded graph tier.
SGLANG_GAMMA = 4


def req(rid, verify_len, correct, cap_trim=0, **extra):
    from tests.collectors.sglang_stand_in import REQ_DEFAULTS, omit_defaults

    base = {
        "rid": rid,
        "req_pool_index": 0,
        "prefix_len": 10,
        "verify_len": verify_len,
        "acc_len": correct + 1,
        "correct_drafts": correct,
        "cap_trim": cap_trim,
        "bonus_token": 7,
        "draft_tokens": [1, 2, 3, 4],
        "confidence": [0.9, 0.8, 0.7, 0.6],
        "survival": [0.9, 0.72, 0.504, 0.3024],
    }
    base.update(extra)
    return omit_defaults(base, REQ_DEFAULTS)


def record(ct, mode, reqs, graph_key=32, **extra):
    from tests.collectors.sglang_stand_in import RECORD_DEFAULTS, omit_defaults

    base = {
        "forward_ct": ct,
        "bs": len(reqs),
        "mode": mode,
        "budget": 8,
        "lag_steps": 0,
        "num_running_reqs": len(reqs),
        "num_verify_tokens": graph_key,
        "verify_tokens_local": 8,
        "verify_tokens_graph_key": graph_key,
        "predicted_step_ms": 5.0,
        "predicted_theta": 0.1,
        "step_cpu_ms": 6.0,
        "step_gpu_ms": 5.5,
        "draft_gpu_ms": 1.0,
        "target_verify_gpu_ms": 3.0,
        "reqs": reqs,
    }
    base.update(extra)
    return omit_defaults(base, RECORD_DEFAULTS)


def server_info(*ranks, mode="compact", simulate_acc_len=None, rank_key=False, components=None):
    """A /server_info reply with one ``internal_states`` element per DP rank, in rank order; ``rank_key``:
    each ``dspark_info_record`` names its ``dp_rank`` (no upstream release does: a lone rank needs none).
    ``components`` default to every one, whose fields ``record()`` fills."""
    from tests.collectors.sglang_stand_in import ALL_COMPONENTS

    return {
        "internal_states": [
            {
                "dspark_info_record": {
                    "mode": mode,
                    "gamma": SGLANG_GAMMA,
                    "verify_num_draft_tokens": SGLANG_GAMMA + 1,
                    "components": ALL_COMPONENTS if components is None else sorted(components),
                    "records": records,
                    "simulate_acc_len": simulate_acc_len,
                    **({"dp_rank": rank} if rank_key else {}),
                }
            }
            for rank, records in enumerate(ranks)
        ]
    }


R1 = record(1, "compact", [req("a", 5, 2), req("b", 3, 2, req_pool_index=1)])
R2 = record(2, "cap-accept", [req("a", 3, 1, cap_trim=0), req("c", 2, 1, cap_trim=2, req_pool_index=2)])


# Window-policy inputs: survivals as a cumulative product of confidences.
# Few distinct values so ties are common: the tie-break is what is under test.
CONFIDENCES = st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.9, 1.0])


@st.composite
def survivals(draw, max_batch=6, max_gamma=5):
    batch = draw(st.integers(1, max_batch))
    gamma = draw(st.integers(1, max_gamma))
    conf = draw(st.lists(st.lists(CONFIDENCES, min_size=gamma, max_size=gamma), min_size=batch, max_size=batch))
    return torch.cumprod(torch.tensor(conf, dtype=torch.float32), dim=1)


# A tiny block drafter (a random DSpark net) for the runtime's drafter tests, beside ``tiny_model``.
def tiny_net(sequential: bool = True, seed: int = 0) -> DSparkNet:
    torch.manual_seed(seed)
    args = DrafterArgs(
        target_dim=32,
        dim=32,
        n_heads=4,
        n_kv_heads=2,
        ffn_hidden=48,
        vocab_size=32,
        window=6,
        max_gamma=6,
        markov_rank=8,
        sequential=sequential,
        init_std=0.3,
    )
    net = DSparkNet(args).double()
    if sequential:  # training starts it at zero; a trained head is not
        torch.nn.init.normal_(net.markov_out.weight, std=0.5)
    return net


@pytest.fixture(scope="module")
def one_thread():
    """torch on one intra-op thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    # Tiny models gain nothing from threads, and on a busy machine a second
    # spinning thread makes each step many times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def evaluated():
    torch.manual_seed(0)
    target = Transformer(
        ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=64, init_std=0.3)
    ).eval()
    block = BlockDrafter(
        DSparkNet(DrafterArgs(target_dim=32, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=48, window=4, markov_rank=8))
    )
    # the n-gram drafter accepts often on a random target's repetitive output, so its
    # confidences have both outcomes to be judged against
    drafters = {"ngram": NGramDrafter(BYTE_VOCAB), "block": block}
    cfg = EvalConfig(prompts_per_domain=4, prompt_len=16, max_new_tokens=24, batch=4, latency_repeats=2, bootstrap=20)
    sts = STS([1.5] * 7)
    report, records = evaluate(target, drafters, stdlib_corpus(), cfg, sts)
    return report, records, sts
