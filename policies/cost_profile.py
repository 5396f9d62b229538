"""What a profiler needs from policies: this machine's fingerprint, the
least-squares fit of the additive cost table from measured steps, and the
prediction error of a table against measurements.

The profiler itself (timing the model) lives in the runtime; everything here
is pure arithmetic on its samples.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

import torch

from sparkgate.policies.cost_model import (
    AdditiveCostTable,
    CostMeta,
    CostTable,
    CostTableError,
    interp_clamped,
    round_up_to_tier,
)


@dataclass(frozen=True)
class StepSample:
    """One measured verify step: ``batch_size`` requests packed into ``verify_rows`` rows."""

    batch_size: int
    verify_rows: int
    seconds: float


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def hardware_fingerprint(device: str | torch.device = "cpu") -> dict[str, str]:
    """What a step time depends on besides the model: OS, CPU, torch build, device.

    Core counts are left out on purpose: containers report them differently
    from run to run on the same machine class.
    """
    dev = torch.device(device)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "torch": torch.__version__,
        "device": device_name,
    }


def _check_samples(samples: Sequence[StepSample]) -> None:
    if not samples:
        raise CostTableError("samples: need at least one measured step, got []")
    for i, s in enumerate(samples):
        if s.batch_size < 1 or s.verify_rows < s.batch_size:
            raise CostTableError(
                f"samples[{i}]: needs 1 <= batch_size <= verify_rows, "
                f"got batch_size={s.batch_size}, verify_rows={s.verify_rows}"
            )
        if not (math.isfinite(s.seconds) and s.seconds > 0):
            raise CostTableError(f"samples[{i}].seconds: expected a finite number > 0, got {s.seconds!r}")


def _hat_basis(probes: tuple[int, ...], x: torch.Tensor, name: str) -> torch.Tensor:
    """[n, P] interpolation weights, so that ``basis @ values == interp_clamped(probes, values, x)``."""
    if x.max() > probes[-1]:
        raise CostTableError(
            f"{name}: a sample at {int(x.max())} lies beyond the last probe {probes[-1]}; the fit only interpolates"
        )
    xs = torch.tensor(probes, dtype=torch.float64)
    eye = torch.eye(len(probes), dtype=torch.float64)
    basis = torch.stack([interp_clamped(xs, eye[j], x) for j in range(len(probes))], dim=1)
    # A probe no sample weighs on is a free coefficient: least squares would give it any value.
    for j in (basis.sum(0) == 0).nonzero().flatten().tolist():
        hi = probes[min(j + 1, len(probes) - 1)]
        where = f"between {probes[j - 1]} and {hi}" if j else f"below {hi}"
        raise CostTableError(f"{name}: no sample lies {where}, so probe {probes[j]} is unmeasured")
    return basis


def fit_additive_table(
    samples: Sequence[StepSample],
    *,
    bs_probes: Sequence[int] | None = None,
    m_probes: Sequence[int] | None = None,
    meta: CostMeta = CostMeta(),
) -> AdditiveCostTable:
    """Least-squares ``bias + alpha(bs) + theta(M)`` with alpha, theta piecewise linear.

    Probes default to the distinct measured values. Rows are rounded up to
    ``meta.tiers`` first, exactly as prediction does. The additive split is
    only defined up to constants moved between the terms, so the fit returns
    the minimum-norm solution shifted to ``min(alpha) == min(theta) == 0``,
    which leaves every prediction unchanged and every stored time non-negative.
    Both curves are made non-decreasing (see below), so predicted step time never
    falls as the batch or the verify rows grow. ``CostTableError`` names a probe no
    sample lies near (its value would be unmeasured) or a sample beyond the last probe.
    """
    _check_samples(samples)
    bs = torch.tensor([s.batch_size for s in samples], dtype=torch.float64)
    rows = round_up_to_tier(torch.tensor([s.verify_rows for s in samples], dtype=torch.float64), meta.tiers)
    secs = torch.tensor([s.seconds for s in samples], dtype=torch.float64)
    bs_grid = tuple(bs_probes) if bs_probes is not None else tuple(sorted({int(b) for b in bs.tolist()}))
    m_grid = tuple(m_probes) if m_probes is not None else tuple(sorted({int(m) for m in rows.tolist()}))
    design = torch.cat(
        [
            torch.ones(len(samples), 1, dtype=torch.float64),
            _hat_basis(bs_grid, bs, "bs_probes"),
            _hat_basis(m_grid, rows, "m_probes"),
        ],
        dim=1,
    )
    solution = torch.linalg.lstsq(design, secs.unsqueeze(1), driver="gelsd").solution.squeeze(1)
    # A larger batch or more verify rows never make a step cheaper; noisy samples must
    # not tell the scheduler otherwise, so each curve is raised to its running maximum.
    alpha = torch.cummax(solution[1 : 1 + len(bs_grid)], 0).values
    theta = torch.cummax(solution[1 + len(bs_grid) :], 0).values
    # bias is the fit's cheapest prediction. Noisy samples can push it to zero or
    # below; no step is that cheap, so floor it at half the fastest measured step.
    bias = (solution[0] + alpha.min() + theta.min()).clamp(min=0.5 * float(secs.min()))
    return AdditiveCostTable(
        bias_seconds=float(bias),
        bs_probes=bs_grid,
        alpha_seconds=tuple((alpha - alpha.min()).tolist()),
        m_probes=m_grid,
        theta_seconds=tuple((theta - theta.min()).tolist()),
        meta=meta,
    )


def median_relative_error(table: CostTable, samples: Sequence[StepSample]) -> float:
    """Median of ``|predicted - measured| / measured`` over the samples."""
    _check_samples(samples)
    errors = []
    for s in samples:
        predicted = table.step_seconds(s.batch_size, torch.tensor([float(s.verify_rows)]))[0]
        errors.append(abs(float(predicted) - s.seconds) / s.seconds)
    return median(errors)
