"""Fixtures and helpers every layer's tests share (one place, so there is one ``store`` and one clock)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import torch

import sparkgate.dashboards
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.policies.window import WindowDecision
from sparkgate.verify_runtime.model import ModelArgs, Transformer

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
    wire = synthetic_wire(steps, batch, 7, replica, first_step=first_step, seed=first_step, ts=ts)
    wire = with_columns(wire, phase=phase, **columns)
    result = store.ingest(from_wire(wire), "test")
    assert result.quarantined == 0
    return wire


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
