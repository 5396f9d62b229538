"""Reading the steps each table served: errors are arithmetic on the predictions the steps recorded."""

from __future__ import annotations

import numpy as np

from sparkgate.controller.served_steps import relative_errors


def test_a_step_without_a_recorded_prediction_has_no_error():
    errors = relative_errors({"predicted": [None, 3.0, 1.0], "ms": [2.0, 2.0, 2.0]})
    assert np.isnan(errors[0]) and errors[1:].tolist() == [0.5, 0.5]
