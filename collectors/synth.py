"""Valid synthetic step records built column-wise, for benchmarks and load tests.

Acceptance follows the drafter's own confidences: depth k survives with
probability c_k, so a* is the length of the first run of successes. Each
request's mode is drawn uniformly from ``MODES``, and its window, accepted count,
full_accept and cap_trim follow docs/design.md §2-§3 for that mode, so every record
passes validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from sparkgate.collectors.schema import MODES, REQUEST_TYPE, SCHEMA_VERSION, WIRE_SCHEMA
from sparkgate.policies.binning import N_BINS, bin_index


def _lists(values: np.ndarray, width: np.ndarray | int, n: int, type_: pa.DataType) -> pa.ListArray:
    lengths = np.broadcast_to(width, (n,))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type_))


@dataclass(frozen=True)
class RowModel:
    """How request rows are drawn. The defaults: every mode alike, windows uniform in [0, γ], confidences
    that are the true acceptance probabilities (calibrated)."""

    mode_weights: tuple[float, ...] | None = None  # per entry of MODES
    # The window of compact and cap_accept rows (and shadow's suggestion): the depths whose S_k reaches this
    # (a survival-threshold scheduler) instead of a uniform draw.
    window_threshold: float | None = None
    # Reported confidence = true acceptance probability × this, capped at 1 (> 1: overconfident).
    confidence_scale: float = 1.0
    # Rows' conditional confidences per depth drawn from these rows ([rows, γ]) instead of being the truth
    # drawn uniformly from TRUTH_RANGE (e.g. a runtime's, controller.simulate_fit), and the truth from
    # ``reliability`` ([γ, N_BINS]: per depth and equal-width bin of the confidence, the acceptance rate a
    # runtime showed; None: the confidence itself, calibrated).
    confidence_rows: np.ndarray | None = field(default=None, compare=False, repr=False)
    reliability: np.ndarray | None = field(default=None, compare=False, repr=False)

    def draw(self, rng: np.random.Generator, n: int, gamma: int) -> tuple[np.ndarray, np.ndarray]:
        """(true conditional acceptance, reported conditional confidence), each ``[n, γ]``."""
        if self.confidence_rows is None:
            truth = rng.uniform(*TRUTH_RANGE, (n, gamma))
            return truth, np.minimum(truth * self.confidence_scale, 1.0)
        if self.confidence_rows.shape[1] != gamma:
            raise ValueError(f"confidence rows have {self.confidence_rows.shape[1]} depths, the records γ = {gamma}")
        calibrated = self.confidence_rows[rng.integers(0, len(self.confidence_rows), n)]
        truth = calibrated if self.reliability is None else self.reliability[np.arange(gamma), bin_index(calibrated)]
        return truth, np.minimum(calibrated * self.confidence_scale, 1.0)


# Rows draw each depth's true conditional acceptance from this range (without truth rows).
TRUTH_RANGE = (0.3, 1.0)


def worst_depth_ece(
    confidence_scale: float, gamma: int, rows: int = 100_000, seed: int = 0, model: RowModel = RowModel()
) -> float:
    """The worst depth's survival ECE (15 equal-width bins) of rows drawn as ``model`` draws them with
    ``confidence_scale``, against their true survival itself: the miscalibration, without the sampling
    noise of drawn labels."""
    truth, confidence = replace(model, confidence_scale=confidence_scale).draw(np.random.default_rng(seed), rows, gamma)
    survival = np.cumprod(confidence, axis=1)
    true_survival = np.cumprod(truth, axis=1)
    worst = 0.0
    for d in range(gamma):
        b = bin_index(survival[:, d])
        gap = np.bincount(b, survival[:, d] - true_survival[:, d], minlength=N_BINS)
        worst = max(worst, float(np.abs(gap).sum() / rows))
    return worst


def _requests(
    rng: np.random.Generator,
    n: int,
    gamma: int,
    batch: int,
    first_step: int,
    continuing: bool,
    model: RowModel = RowModel(),
) -> pa.StructArray:
    weights = None if model.mode_weights is None else np.asarray(model.mode_weights) / sum(model.mode_weights)
    mode = rng.integers(0, len(MODES), n) if weights is None else rng.choice(len(MODES), n, p=weights)
    truth, confidence = model.draw(rng, n, gamma)
    survival = np.cumprod(confidence, axis=1)
    survived = rng.random((n, gamma)) < truth
    full = np.where(survived.all(axis=1), gamma, np.argmin(survived, axis=1))
    static_like = np.isin(mode, [MODES.index("static"), MODES.index("shadow")])
    chosen = (
        rng.integers(0, gamma + 1, n)
        if model.window_threshold is None
        else (survival >= model.window_threshold).sum(axis=1)
    )
    window = np.where(static_like, gamma, chosen)
    accepted = np.minimum(full, window)
    censored = (mode == MODES.index("compact")) & (accepted == window) & (window < gamma)
    cap = mode == MODES.index("cap_accept")
    suggested = np.where(
        mode == MODES.index("shadow"), rng.integers(0, gamma + 1, n) if model.window_threshold is None else chosen, -1
    )
    tokens = rng.integers(0, 32000, int((accepted + 1).sum()))
    ids = np.char.add("req-", (np.arange(n) % batch if continuing else first_step * batch + np.arange(n)).astype(str))
    # Continuing requests: step s of a request starts at position s * (γ + 1), past anything it committed.
    position = (first_step + np.arange(n) // batch) * (gamma + 1)
    return pa.StructArray.from_arrays(
        [
            pa.array(ids),
            pa.array(np.asarray(MODES)[mode]),
            pa.array(np.full(n, "synthetic")),
            pa.array(np.zeros(n)),
            pa.array(suggested, mask=suggested < 0),
            pa.array(window),
            pa.array(accepted),
            pa.array(np.where(cap, full, accepted), mask=censored),
            pa.array(np.where(cap, full - accepted, 0)),
            _lists(confidence.ravel(), gamma, n, pa.float64()),
            _lists(survival.ravel(), gamma, n, pa.float64()),
            _lists(tokens, accepted + 1, n, pa.int64()),
            # Rows of their own request carry nothing for censored-label recovery to join; continuing
            # requests carry drafts and positions, so every commit runs it.
            _lists(rng.integers(0, 32000, n * gamma), gamma, n, pa.int64())
            if continuing
            else pa.nulls(n, pa.list_(pa.int64())),
            pa.array(position) if continuing else pa.nulls(n, pa.int64()),
            pa.nulls(n, pa.float64()),
        ],
        fields=list(REQUEST_TYPE),
    )


def synthetic_wire(
    steps: int,
    batch: int = 32,
    gamma: int = 7,
    replica_id: str = "replica-0",
    first_step: int = 0,
    seed: int = 0,
    ts: float = 1.75e9,
    continuing: bool = False,
    model: RowModel = RowModel(),
    cost_table_version: str | None = None,
) -> pa.Table:
    """``steps`` valid step records of ``batch`` requests each, as a ``WIRE_SCHEMA`` table; with
    ``continuing`` the same ``batch`` requests run through every step (recovery has rows to join). With
    ``cost_table_version`` the steps were served on that table, whose recorded prediction (``table_step_ms``)
    misses each step's time by a lognormal factor of spread 0.15.

    Step ids run from ``first_step``; request ids are unique within the table.
    """
    rng = np.random.default_rng(seed)
    n = steps * batch
    requests = pa.ListArray.from_arrays(
        pa.array(np.arange(steps + 1, dtype=np.int32) * batch),
        _requests(rng, n, gamma, batch, first_step, continuing, model),
    )
    verify_rows = batch * (gamma + 1)
    ms = rng.gamma(4.0, 2.0, steps)
    columns = {
        "schema_version": np.full(steps, SCHEMA_VERSION),
        "replica_id": np.full(steps, replica_id),
        "step_id": np.arange(first_step, first_step + steps),
        "ts": ts + np.arange(steps) * 0.01,
        "batch_size": np.full(steps, batch),
        "gamma": np.full(steps, gamma),
        "verify_rows": np.full(steps, verify_rows),
        "tier_rows": np.full(steps, verify_rows),
        "tier": np.full(steps, verify_rows),
        "graph_hit": np.ones(steps, bool),
        "miss_reason": pa.nulls(steps, pa.string()),
        "draft_ms": ms * 0.2,
        "schedule_ms": ms * 0.05,
        "verify_ms": ms * 0.6,
        "accept_ms": ms * 0.05,
        "step_ms": ms,
        "predicted_step_ms": ms,
        "host_syncs": np.ones(steps, np.int64),
        "phase": np.full(steps, "shadow"),
        "policy_revision": np.ones(steps, np.int64),
        "model_version": np.full(steps, "synthetic"),
        "drafter_version": np.full(steps, "synthetic"),
        "sts_version": pa.nulls(steps, pa.string()),
        "cost_table_version": pa.array([cost_table_version] * steps, pa.string()),
        "contract": pa.nulls(steps, pa.string()),
        "epoch": pa.nulls(steps, pa.int64()),
        "arm": pa.nulls(steps, pa.string()),
        "step_cpu_ms": pa.nulls(steps, pa.float64()),
        "table_step_ms": pa.nulls(steps, pa.float64())
        if cost_table_version is None
        else ms * np.exp(0.15 * rng.standard_normal(steps)),
        "requests": requests,
    }
    return pa.table(
        {k: pa.array(v) if isinstance(v, np.ndarray) else v for k, v in columns.items()}, schema=WIRE_SCHEMA
    )
