"""Cost tables: what one verify step costs on this hardware for this model.

Both SGLang JSON layouts are read and written unchanged:

- 1-D steps-per-second table, indexed by verify rows (SGLang's "batch tokens":
  requests + drafts verified)::

      {"sample_batch_tokens": [...], "sample_steps_per_sec": [...], "max_batch_tokens": N}

- additive table, ``T(bs, M) = bias + alpha(bs) + theta(M)`` with ``M`` verify rows::

      {"bias_seconds": b, "bs_probes": [...], "alpha_seconds": [...],
       "m_probes": [...], "theta_seconds": [...]}

sparkgate adds an optional ``meta`` object (``CostMeta``): hardware and model
fingerprints, the graph tier grid, ``created_at`` and ``version``.

Prediction reads a table exactly as SGLang's DSpark scheduler does
(``speculative/dspark_components/dspark_sps_table.py`` and ``dspark_scheduler.py``
@ 692c5f7d532f129424b57961c262bbd253b411dc), so the windows sparkgate suggests
from a table are the ones a server loading the same file picks:

- the 1-D table is a floor step: the steps per second of the largest probe
  ``<=`` the rows (the first probe's below it, the last probe's above it);
- the additive table interpolates ``alpha`` at the batch size and ``theta`` at the
  rows linearly between probes, clamped to the end values outside them: rows
  past the last probe cost what the last probe does. The profiler probes up to
  ``max_batch x (gamma + 1)`` rows, so its tables never reach the clamp;
- tier-aware: verify rows are rounded up to the smallest tier in ``meta.tiers``
  that holds them, so cost steps at tier boundaries; above the largest tier the
  step runs eager at its raw row count.
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparkgate.policies import json_text

# Re-exported: callers catch them from here; they live apart so that storing a table needs no torch.
from sparkgate.policies.cost_errors import CostTableError as CostTableError
from sparkgate.policies.cost_errors import FingerprintMismatch as FingerprintMismatch
from sparkgate.policies.outputs import written_whole

SPS_KEYS = ("sample_batch_tokens", "sample_steps_per_sec", "max_batch_tokens")
ADDITIVE_KEYS = ("bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds")
META_KEYS = ("hardware", "model", "tiers", "created_at", "version")


@dataclass(frozen=True)
class CostMeta:
    """Provenance of a table. ``tiers`` is strictly increasing (empty: no graphs)."""

    hardware: dict[str, str] | None = None
    model: str | None = None
    tiers: tuple[int, ...] = ()
    created_at: str | None = None
    version: str | None = None

    def __post_init__(self) -> None:
        _check_probes("meta.tiers", self.tiers, allow_empty=True)


def _check_probes(name: str, probes: tuple[int, ...], *, allow_empty: bool = False) -> None:
    if not probes and not allow_empty:
        raise CostTableError(f"{name}: needs at least one probe, got []")
    for i, p in enumerate(probes):
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise CostTableError(f"{name}[{i}]: expected an integer >= 1, got {p!r}")
    for i in range(1, len(probes)):
        if probes[i] <= probes[i - 1]:
            raise CostTableError(f"{name}: must be strictly increasing, got {list(probes)}")


def _check_seconds(
    name: str, values: tuple[float, ...], probes_name: str, n_probes: int, *, positive: bool = False
) -> None:
    if len(values) != n_probes:
        raise CostTableError(f"{name}: has {len(values)} values but {probes_name} has {n_probes}")
    for i, v in enumerate(values):
        _check_number(f"{name}[{i}]", v, positive=positive)


def _check_number(name: str, v: Any, *, positive: bool = False) -> None:
    ok_type = isinstance(v, (int, float)) and not isinstance(v, bool)
    if not ok_type or not math.isfinite(v) or v < 0 or (positive and v == 0):
        want = "a finite number > 0" if positive else "a finite number >= 0"
        raise CostTableError(f"{name}: expected {want}, got {v!r}")


def interp_clamped(xs: torch.Tensor, ys: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear through (xs, ys), ys[0] below xs[0] and ys[-1] beyond xs[-1]."""
    if xs.numel() == 1:
        return ys[0].expand(x.shape).clone()
    hi = torch.bucketize(x, xs, right=True).clamp(1, xs.numel() - 1)
    lo = hi - 1
    frac = ((x - xs[lo]) / (xs[hi] - xs[lo])).clamp(0.0, 1.0)
    return ys[lo] + frac * (ys[hi] - ys[lo])


def floor_step(xs: torch.Tensor, ys: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """ys at the largest xs <= x; ys[0] below xs[0] (SGLang's ``bucketize(right=True) - 1``, clamped)."""
    return ys[(torch.bucketize(x, xs, right=True) - 1).clamp(0, xs.numel() - 1)]


def round_up_to_tier(rows: torch.Tensor, tiers: tuple[int, ...]) -> torch.Tensor:
    """Rows the graph actually runs: the smallest tier >= rows, or rows itself when eager."""
    if not tiers:
        return rows
    grid = torch.tensor(tiers, dtype=rows.dtype)
    idx = torch.bucketize(rows, grid)
    return torch.where(idx < len(tiers), grid[idx.clamp(max=len(tiers) - 1)], rows)


class _Predictor(ABC):
    """Scalar and vector predictions shared by both layouts (each layout gives ``_seconds``)."""

    meta: CostMeta

    def step_seconds(self, batch_size: int, verify_rows: torch.Tensor) -> torch.Tensor:
        """Predicted seconds per step, float64 on CPU, shaped like ``verify_rows``."""
        rows = round_up_to_tier(verify_rows.to(torch.float64), self.meta.tiers)
        return self._seconds(float(batch_size), rows)

    def predict_step_ms(self, batch_size: int, verify_rows: int) -> float:
        rows = torch.tensor([verify_rows], dtype=torch.float64)
        return float(self.step_seconds(batch_size, rows)[0]) * 1000.0

    def steps_per_sec(self, batch_size: int, verify_rows: int) -> float:
        return 1000.0 / self.predict_step_ms(batch_size, verify_rows)

    @abstractmethod
    def _seconds(self, batch_size: float, rows: torch.Tensor) -> torch.Tensor:
        """Seconds per step at tier-rounded ``rows`` (float64)."""


@dataclass(frozen=True)
class StepsPerSecondTable(_Predictor):
    """SGLang's 1-D table: steps per second against verify rows (batch tokens)."""

    sample_batch_tokens: tuple[int, ...]
    sample_steps_per_sec: tuple[float, ...]
    max_batch_tokens: int
    meta: CostMeta = field(default_factory=CostMeta)

    def __post_init__(self) -> None:
        _check_probes("sample_batch_tokens", self.sample_batch_tokens)
        _check_seconds(
            "sample_steps_per_sec",
            self.sample_steps_per_sec,
            "sample_batch_tokens",
            len(self.sample_batch_tokens),
            positive=True,
        )
        if (
            isinstance(self.max_batch_tokens, bool)
            or not isinstance(self.max_batch_tokens, int)
            or self.max_batch_tokens < self.sample_batch_tokens[-1]
        ):
            raise CostTableError(
                f"max_batch_tokens: expected an integer >= the largest probe "
                f"{self.sample_batch_tokens[-1]}, got {self.max_batch_tokens!r}"
            )

    @property
    def max_verify_rows(self) -> int | None:
        """Rows the server admits in one step; the scheduler never plans beyond it."""
        return self.max_batch_tokens

    def _seconds(self, batch_size: float, rows: torch.Tensor) -> torch.Tensor:
        xs = torch.tensor(self.sample_batch_tokens, dtype=torch.float64)
        secs = 1.0 / torch.tensor(self.sample_steps_per_sec, dtype=torch.float64)
        return floor_step(xs, secs, rows)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "sample_batch_tokens": list(self.sample_batch_tokens),
            "sample_steps_per_sec": list(self.sample_steps_per_sec),
            "max_batch_tokens": self.max_batch_tokens,
            **_meta_json(self.meta),
        }


@dataclass(frozen=True)
class AdditiveCostTable(_Predictor):
    """SGLang's additive table: ``T(bs, M) = bias + alpha(bs) + theta(M)`` seconds."""

    bias_seconds: float
    bs_probes: tuple[int, ...]
    alpha_seconds: tuple[float, ...]
    m_probes: tuple[int, ...]
    theta_seconds: tuple[float, ...]
    meta: CostMeta = field(default_factory=CostMeta)

    def __post_init__(self) -> None:
        # SGLang's loader (speculative/dspark_components/dspark_sps_table.py) refuses bias_seconds <= 0, so a
        # table sparkgate accepts is one SGLang loads too.
        _check_number("bias_seconds", self.bias_seconds, positive=True)
        _check_probes("bs_probes", self.bs_probes)
        _check_seconds("alpha_seconds", self.alpha_seconds, "bs_probes", len(self.bs_probes))
        _check_probes("m_probes", self.m_probes)
        _check_seconds("theta_seconds", self.theta_seconds, "m_probes", len(self.m_probes))

    @property
    def max_verify_rows(self) -> int | None:
        return None

    def _seconds(self, batch_size: float, rows: torch.Tensor) -> torch.Tensor:
        f64 = torch.float64
        alpha = interp_clamped(
            torch.tensor(self.bs_probes, dtype=f64),
            torch.tensor(self.alpha_seconds, dtype=f64),
            torch.tensor([batch_size], dtype=f64),
        )
        theta = interp_clamped(
            torch.tensor(self.m_probes, dtype=f64), torch.tensor(self.theta_seconds, dtype=f64), rows
        )
        return self.bias_seconds + alpha + theta

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "bias_seconds": self.bias_seconds,
            "bs_probes": list(self.bs_probes),
            "alpha_seconds": list(self.alpha_seconds),
            "m_probes": list(self.m_probes),
            "theta_seconds": list(self.theta_seconds),
            **_meta_json(self.meta),
        }


CostTable = StepsPerSecondTable | AdditiveCostTable


def _meta_json(meta: CostMeta) -> dict[str, Any]:
    if meta == CostMeta():
        return {}  # a table without provenance stays byte-compatible with SGLang's layout
    return {
        "meta": {
            "hardware": meta.hardware,
            "model": meta.model,
            "tiers": list(meta.tiers),
            "created_at": meta.created_at,
            "version": meta.version,
        }
    }


def _require(obj: Mapping[str, Any], key: str, where: str = "") -> Any:
    if key not in obj:
        raise CostTableError(f"{where}{key}: missing")
    return obj[key]


def _as_list(name: str, value: Any) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise CostTableError(f"{name}: expected a list, got {value!r}")
    return tuple(value)


def _parse_meta(raw: Any) -> CostMeta:
    if raw is None:
        return CostMeta()
    if not isinstance(raw, dict):
        raise CostTableError(f"meta: expected an object, got {raw!r}")
    unknown = sorted(set(raw) - set(META_KEYS))
    if unknown:
        raise CostTableError(f"meta.{unknown[0]}: unknown key (known: {', '.join(META_KEYS)})")
    hardware = raw.get("hardware")
    if hardware is not None and (
        not isinstance(hardware, dict) or not all(isinstance(v, str) for v in hardware.values())
    ):
        raise CostTableError(f"meta.hardware: expected an object of strings, got {hardware!r}")
    for key in ("model", "created_at", "version"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise CostTableError(f"meta.{key}: expected a string, got {raw[key]!r}")
    return CostMeta(
        hardware=hardware,
        model=raw.get("model"),
        tiers=_as_list("meta.tiers", raw.get("tiers", [])),
        created_at=raw.get("created_at"),
        version=raw.get("version"),
    )


def parse_cost_table(obj: Mapping[str, Any]) -> CostTable:
    """Build a validated table from the decoded JSON of either layout."""
    if not isinstance(obj, dict):
        raise CostTableError(f"cost table: expected a JSON object, got {type(obj).__name__}")
    is_sps, is_add = "sample_batch_tokens" in obj, "bias_seconds" in obj
    if is_sps == is_add:
        raise CostTableError(
            "cost table: expected exactly one layout, keyed by 'sample_batch_tokens' (1-D) or 'bias_seconds' (additive)"
        )
    keys = SPS_KEYS if is_sps else ADDITIVE_KEYS
    unknown = sorted(set(obj) - set(keys) - {"meta"})
    if unknown:
        raise CostTableError(f"{unknown[0]}: unknown key (known: {', '.join(keys)}, meta)")
    meta = _parse_meta(obj.get("meta"))
    if is_sps:
        return StepsPerSecondTable(
            sample_batch_tokens=_as_list("sample_batch_tokens", _require(obj, "sample_batch_tokens")),
            sample_steps_per_sec=_as_list("sample_steps_per_sec", _require(obj, "sample_steps_per_sec")),
            max_batch_tokens=_require(obj, "max_batch_tokens"),
            meta=meta,
        )
    return AdditiveCostTable(
        bias_seconds=_require(obj, "bias_seconds"),
        bs_probes=_as_list("bs_probes", _require(obj, "bs_probes")),
        alpha_seconds=_as_list("alpha_seconds", _require(obj, "alpha_seconds")),
        m_probes=_as_list("m_probes", _require(obj, "m_probes")),
        theta_seconds=_as_list("theta_seconds", _require(obj, "theta_seconds")),
        meta=meta,
    )


def check_fingerprint(
    table: CostTable, *, hardware: Mapping[str, str] | None = None, model: str | None = None, force: bool = False
) -> None:
    """Refuse a table measured elsewhere. Only the fingerprints given are checked.

    A table with no fingerprint for a checked field is refused too: nothing
    says it was measured here. ``force=True`` skips every check.
    """
    if force:
        return
    if hardware is not None:
        theirs = table.meta.hardware
        if theirs is None:
            raise FingerprintMismatch(
                "meta.hardware: missing, cannot tell where the table was measured (force to use it anyway)"
            )
        for key in sorted(set(theirs) | set(hardware)):
            if theirs.get(key) != hardware.get(key):
                raise FingerprintMismatch(
                    f"meta.hardware.{key}: table has {theirs.get(key)!r}, "
                    f"this machine has {hardware.get(key)!r} "
                    "(force to use it anyway)"
                )
    if model is not None and table.meta.model != model:
        raise FingerprintMismatch(
            f"meta.model: table has {table.meta.model!r}, running model is {model!r} (force to use it anyway)"
        )


def load_cost_table(
    path: str | Path, *, hardware: Mapping[str, str] | None = None, model: str | None = None, force: bool = False
) -> CostTable:
    """Read, validate and fingerprint-check a table file."""
    try:
        obj = json_text.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CostTableError(f"{path}: not valid JSON ({exc})") from exc
    table = parse_cost_table(obj)
    check_fingerprint(table, hardware=hardware, model=model, force=force)
    return table


def save_cost_table(table: CostTable, path: str | Path) -> None:
    """Writes ``path`` whole or leaves what it held (callers such as the profiled-table cache do not wrap it)."""
    with written_whole(path) as partial:
        partial.write_text(json.dumps(table.to_json_dict(), indent=2) + "\n", encoding="utf-8")
