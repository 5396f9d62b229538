"""The calibration bins every ECE in sparkgate uses (docs/design.md §2), defined once.

15 equal-width bins on [0, 1]: ``[0, 1/15), ..., [14/15, 1]``; a value of exactly 1
goes in the last bin. ``bin_index`` is the NumPy form of the rule (collectors and
controller); ``policies.calibration`` applies the same edges to torch tensors.
"""

from __future__ import annotations

import numpy as np

N_BINS = 15
EDGES = np.arange(N_BINS + 1) / N_BINS
# Fine bins resolve equal-mass bins and AUROC: each equal-width bin is exactly FINE_PER_BIN of them.
FINE_PER_BIN = 64
FINE_BINS = N_BINS * FINE_PER_BIN
# Requests are hashed into this many groups; the bootstrap resamples groups (docs/design.md §2). 200
# groups estimate a standard error to within about 5% (1/sqrt(2 × 200)), and keep the per-bucket group
# sums and the bootstrap's products five times smaller than 1,000 did.
REQUEST_GROUPS = 200


def bin_index(p: np.ndarray) -> np.ndarray:
    """Bin of each probability: k with EDGES[k] <= p < EDGES[k+1], and the last bin for p = 1."""
    return np.minimum(np.searchsorted(EDGES, p, side="right") - 1, N_BINS - 1)
