"""Calibration of compact traffic itself, once recovery has settled its censored labels (docs/design.md §2).

The gated ECE reads the full-block modes, whose labels cost full verification (``observe_fraction``).
Compact rows of greedy requests get their censored labels back from the tokens the requests commit next
(``collectors.recovery``), so their ECE measures the served traffic at no verify cost. What stays
censored (requests that finished before their tail resolved) is not missing at random: a gate on it is
inconclusive while more than ``MAX_CENSORED_SHARE`` of some depth's labels are still censored.

Sampled requests leave depth ``w + 1`` estimated: P(y = 1) is known, y is not. With ``use_estimated``
those labels enter as soft outcomes (their probability in place of y), which keeps a bin's expected
frequency unbiased but is not an observation: they count towards the censored share otherwise.
"""

from __future__ import annotations

import numpy as np

from sparkgate.collectors.aggregate import CalibrationStats

from .measurement import Measurement

MAX_CENSORED_SHARE = 0.05


def compact_ece(
    stats: CalibrationStats, counts: dict[str, dict[int, int]], estimated: np.ndarray | None
) -> Measurement:
    """The worst depth's survival ECE of compact traffic over observed and recovered labels (and estimated
    ones as soft outcomes when ``estimated`` is given); samples: the fewest labels of any depth."""
    compact = stats.select(("compact",))
    n, sum_p, sum_y = (a[0].astype(float) for a in (compact.count, compact.sum_p, compact.sum_y))
    unknown = {d: counts["censored"].get(d, 0) for d in range(len(n))}
    if estimated is not None:
        depths = min(len(n), len(estimated))
        n[:depths] += estimated[:depths, :, 0]
        sum_p[:depths] += estimated[:depths, :, 1]
        sum_y[:depths] += estimated[:depths, :, 2]
    else:
        unknown = {d: c + counts["estimated"].get(d, 0) for d, c in unknown.items()}
    labels = n.sum(axis=1)
    # A depth whose labels are all still censored is seen too: wholly censored is the share at its worst.
    depths_seen = [d for d in range(1, len(labels)) if labels[d] or unknown[d]]
    if not depths_seen:
        return Measurement(None, 0)
    share = {d: unknown[d] / (labels[d] + unknown[d]) for d in depths_seen}
    worst_share = max(share, key=share.__getitem__)
    samples = int(min(labels[d] for d in depths_seen))
    if share[worst_share] > MAX_CENSORED_SHARE:
        why = (
            f"{share[worst_share]:.1%} of depth {worst_share}'s compact labels are still censored "
            f"(> {MAX_CENSORED_SHARE:.0%}): the rest would be a biased sample"
        )
        return Measurement(None, samples, why=why)
    ece = {d: float(np.abs(sum_p[d] - sum_y[d]).sum() / labels[d]) for d in depths_seen}
    return Measurement(max(ece.values()), samples)
