"""The calibration gates' inputs: each gate's worst-cell figure with bounds that spend the fail side's α
over the cells it judges and the stage's looks (docs/design.md §2).

Invariant: a calibrated fleet fails any one of these gates at most α = (1 - level) / 2 over a stage's
first looks, and at most α per ``ALARM_PERIOD_S`` after them (``look_index``); the pass side is one-sided
at α from an estimate that cannot read a real gap low.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from .calibration import Calibration
from .measurement import Measurement


def drift_ece(window: Calibration, reference: Calibration, looks: int, level: float) -> Measurement:
    """The gate input of ``survival_ece_drift``: the worst depth's debiased ECE now minus the reference's
    (what shadow measured, under the same contract), bounded by both standard errors with the fail side
    spent over depths and looks as ``debiased_ece`` does. The window and the reference are disjoint label
    sets, so their errors add in quadrature.

    Each bound starts from a difference that cannot read a drift high on its side (``debiased_ece`` says
    why the debiased ECE reads a real gap low, by more the larger its noise floor): the pass side from the
    plug-in now minus the debiased reference. The fail side from the debiased difference where the window
    is the noisier set (its floor at least the reference's: with no drift, the window's shortfall is then
    the larger, so the difference reads at most zero in expectation), and otherwise from the debiased ECE
    now minus the plug-in reference."""
    now, then = window.debiased(), reference.debiased()
    depths = [d for d in now if d in then]
    if not depths:
        return Measurement(None, min(window.samples, reference.samples), why="no shadow reference at these depths")
    return bounded(
        {d: now[d] - then[d] for d in depths},
        {d: math.hypot(window.bounds[d][2], reference.bounds[d][2]) for d in depths},
        min(window.samples, reference.samples),
        looks,
        level,
        "debiased ECE now minus shadow's (pass side from the plug-in now)",
        low_from={d: now[d] - (then[d] if window.null[d] >= reference.null[d] else reference.ece[d]) for d in depths},
        high_from={d: window.ece[d] - then[d] for d in depths},
    )


# Past a stage's first looks, a calibrated fleet fails a gate at most α in each period this long.
ALARM_PERIOD_S = 86400.0


def look_index(look: int, interval_s: float, window_s: float) -> int:
    """The look whose spending a stage's ``look``-th evaluation pays (``_bounded``): ``look``, capped at K,
    the larger of ``1 + ⌈window_s / interval_s⌉`` (the first look that reads a full window) and
    ``⌈√(6/π² × ALARM_PERIOD_S / interval_s)⌉``. The caller counts the stage's evaluations (its state's
    ``evaluations``), not its age: a stage's first look spends the first share, however late its tick.

    Invariant: a calibrated fleet fails a gate at most α over the stage's first K looks (Σ 6/(π²k²) < 1)
    and at most α in any ``ALARM_PERIOD_S`` after them: each later look spends 6/(π²K²) ≤ interval_s /
    ALARM_PERIOD_S of α. So the false-alarm rate of a stage without end (adaptive) is one per unit of time,
    and the stage does not go deaf with age, as an uncapped index makes it (its k-th look asks a z that
    grows without bound, about √(4 ln k): 4.6 at the 30th look of one depth in seven, 7.0 a month in at
    one-minute intervals, against 4.6 for ever with the cap)."""
    per_period = 6 / math.pi**2 * ALARM_PERIOD_S / interval_s
    cap = max(1 + math.ceil(window_s / interval_s), math.ceil(math.sqrt(per_period)))
    return max(1, min(look, cap))


def debiased_ece(calibration: Calibration, looks: int, level: float) -> Measurement:
    """The gate input of ``survival_ece_debiased``: the worst depth's ECE minus its noise floor, with bounds
    from each depth's bootstrap standard error. The fail side is one-sided at
    α / (depths × looks spending), α = (1 - level) / 2, spending 6/(π²k²) of α at the stage's k-th look
    (``look_index``: those sum to 1 over the looks of a growing window), so a calibrated rollout fails a
    stage's first looks no more often than α whatever the depths, and each later look at a fixed rate;
    the pass side is one-sided at α, from the plug-in ECE.

    Why the pass side does not start from the debiased ECE: the noise floor is what a predictor with no
    gap in any bin shows, and a real gap g hides most of the noise, so the debiased ECE reads between
    g − floor and g. A bound above it would pass a drafter whose true ECE is the threshold most of the
    time (about 0.87 at 2,000 labels). The plug-in ECE reads at least g in expectation at every gap (each
    bin's E|ĝ| ≥ |g|), so a bound above it passes that drafter at most α, and the debiased ECE, which reads
    at most g, is the fail side's."""
    debiased = calibration.debiased()
    if not debiased:
        return Measurement(None, calibration.samples)
    se = {d: calibration.bounds[d][2] for d in debiased}
    plug_in = {d: calibration.ece[d] for d in debiased}
    what = "ECE minus its noise floor (pass side from the plug-in ECE)"
    return bounded(debiased, se, calibration.samples, looks, level, what, high_from=plug_in)


def worst_replica_debiased_ece(replicas: dict[str, Calibration], looks: int, level: float) -> Measurement:
    """The gate input of ``survival_ece_debiased_replica``: ``debiased_ece`` over every (replica, depth)
    cell, the fail side spent over all of them, so one replica's miscalibration, which the fleet's figure
    dilutes by the other replicas' traffic, is judged on that replica's labels alone. Replicas without
    labels are left out; the samples are the fewest of any depth of any replica judged."""
    value: dict[tuple[str, int], float] = {}
    se: dict[tuple[str, int], float] = {}
    plug_in: dict[tuple[str, int], float] = {}
    for replica, calibration in replicas.items():
        for d, v in calibration.debiased().items():
            value[replica, d], se[replica, d] = v, calibration.bounds[d][2]
            plug_in[replica, d] = calibration.ece[d]
    samples = min((c.samples for c in replicas.values() if c.samples), default=0)
    if not value:
        return Measurement(None, samples, why="no replica has labels in the window")
    return bounded(
        value,
        se,
        samples,
        looks,
        level,
        "ECE minus its noise floor (pass side from the plug-in ECE)",
        "(replica, depth) cells",
        high_from=plug_in,
    )


def bounded(
    value: dict,
    se: dict,
    samples: int,
    looks: int,
    level: float,
    what: str,
    cells: str = "depths",
    *,
    low_from: dict | None = None,
    high_from: dict | None = None,
) -> Measurement:
    """The worst cell's ``value`` (a depth, or a replica's depth) with bounds: the low (fail) side
    ``low_from − z × se`` one-sided at α / (cells × looks spending), the high (pass) side ``high_from + z ×
    se`` at α (see ``debiased_ece``); each defaults to ``value``. The gates read these at_most: a cell
    whose estimate is biased must be bounded from an estimate biased away from the side it decides."""
    low_from, high_from = low_from or value, high_from or value
    alpha = (1 - level) / 2
    fail_alpha = alpha * 6 / (math.pi**2 * max(looks, 1) ** 2) / len(value)
    z_fail, z_pass = NormalDist().inv_cdf(1 - fail_alpha), NormalDist().inv_cdf(1 - alpha)
    method = (
        f"{what}, worst of {len(value)} {cells}, ± bootstrap se over request groups; fail side at "
        f"{fail_alpha:.2g} per cell (look {looks}), pass side at {alpha:.3g}"
    )
    return Measurement(
        max(value.values()),
        samples,
        max(low_from[d] - z_fail * se[d] for d in value),
        max(high_from[d] + z_pass * se[d] for d in value),
        method,
    )
