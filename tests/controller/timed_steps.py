"""Stored steps timed by a known cost table: what the adaptive tests fit, gate and report on."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import torch

from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_wire
from sparkgate.policies.cost_fit import StepTimes, predict_ms
from sparkgate.policies.cost_model import AdditiveCostTable, CostMeta

STATIC = AdditiveCostTable(
    bias_seconds=0.004,
    bs_probes=(1, 4, 16),
    alpha_seconds=(0.0, 0.002, 0.006),
    m_probes=(8, 32, 128),
    theta_seconds=(0.0, 0.004, 0.016),
    meta=CostMeta(hardware={"cpu": "test"}, model="m", tiers=(), version="static-a"),
)
BATCHES = (1, 2, 4, 8, 16)


def scaled(table: AdditiveCostTable, factor: float, version: str | None = None) -> AdditiveCostTable:
    """``table`` with every cost multiplied by ``factor`` (what a load shift does to a step)."""
    return dataclasses.replace(
        table,
        bias_seconds=table.bias_seconds * factor,
        alpha_seconds=tuple(a * factor for a in table.alpha_seconds),
        theta_seconds=tuple(t * factor for t in table.theta_seconds),
        meta=dataclasses.replace(table.meta, version=version or table.meta.version),
    )


def _set(wire: pa.Table, name: str, values) -> pa.Table:
    field = wire.schema.field(name)
    return wire.set_column(wire.schema.get_field_index(name), name, pa.array(values, field.type))


def ingest_timed(
    store,
    served: AdditiveCostTable,
    truth: AdditiveCostTable,
    ts: float,
    steps_per_batch: int = 40,
    *,
    replica: str = "r0",
    first_step: int = 0,
    phase: str = "adaptive",
    arm: str | None = "treatment",
    epoch: int | None = 0,
    noise: float = 0.05,
    seed: int = 0,
    gamma: int = 7,
) -> int:
    """Steps at every batch size of ``BATCHES`` served on ``served`` (its version and prediction) and timed
    by ``truth`` with lognormal noise, in wall and CPU time; returns the next free step id."""
    rng = np.random.default_rng(seed)
    step = first_step
    for i, batch in enumerate(BATCHES):
        n = steps_per_batch
        wire = synthetic_wire(n, batch, gamma, replica, first_step=step, seed=seed + i, ts=ts + i * n * 0.01)
        rows = torch.full((n,), batch * (gamma + 1))
        sizes = torch.full((n,), batch)
        ones = StepTimes(sizes, rows, torch.ones(n))
        ms = (predict_ms(truth, ones) * torch.from_numpy(np.exp(noise * rng.standard_normal(n)))).numpy()
        columns = {
            "step_ms": ms,
            "step_cpu_ms": ms,
            "predicted_step_ms": predict_ms(served, ones).numpy(),
            "table_step_ms": predict_ms(served, ones).numpy(),
            "cost_table_version": [served.meta.version] * n,
            "phase": [phase] * n,
            "arm": [arm] * n,
            "epoch": [epoch] * n,
        }
        for name, values in columns.items():
            wire = _set(wire, name, values)
        result = store.ingest(from_wire(wire), "test")
        assert result.quarantined == 0, result
        step += n
    return step
