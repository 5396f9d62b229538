"""One binning rule, two array libraries: the NumPy and torch forms put every value in the same bin."""

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies import calibration
from sparkgate.policies.binning import EDGES, N_BINS, bin_index

probabilities = st.lists(st.floats(0.0, 1.0, allow_nan=False) | st.sampled_from(list(EDGES)), min_size=1)


@given(probabilities)
def test_numpy_and_torch_bins_agree(values):
    p = np.array(values, dtype=np.float64)
    assert bin_index(p).tolist() == calibration.bin_index(torch.from_numpy(p)).tolist()


@given(probabilities)
def test_every_value_lands_in_the_bin_whose_edges_hold_it(values):
    index = bin_index(np.array(values))
    assert ((index >= 0) & (index < N_BINS)).all()
    for p, k in zip(values, index):
        assert EDGES[k] <= p and (p < EDGES[k + 1] or (p == 1.0 and k == N_BINS - 1))


def test_bin_edges():
    assert list(bin_index(np.array([0.0, 1 / 15, 0.5, 14 / 15, 0.9999999, 1.0]))) == [0, 1, 7, 14, 14, 14]
