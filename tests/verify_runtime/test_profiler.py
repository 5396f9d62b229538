"""The profiler: even windows at a budget, whole decode steps timed into a fitted table, forced windows."""

import math

import pytest

from sparkgate.verify_runtime.drafters import NGramDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.model import model_version
from sparkgate.verify_runtime.profiler import (
    ForcedWindows,
    even_windows,
    profile_model,
    step_version,
)
from tests.conftest import tiny_model


def test_even_windows_spread_the_budget():
    assert even_windows(4, 7, 10) == [3, 3, 2, 2]
    assert sum(even_windows(5, 3, 15)) == 15
    with pytest.raises(ValueError, match="budget 29 outside"):
        even_windows(4, 7, 29)


def test_profile_times_whole_decode_steps_and_fits_a_table():
    model = tiny_model(seed=2).float()
    drafter = NGramDrafter(model.args.vocab_size)
    result = profile_model(
        model, drafter, batches=(1, 4), fractions=(0.0, 0.5, 1.0), gamma=3, repeats=2, context=12, progress=False
    )
    assert len(result.samples) == 6
    # The table is for this target with this drafter: both set the step time.
    assert result.table.meta.model == step_version(model, drafter) == f"{model_version(model)}+{drafter.version}"
    assert result.table.meta.hardware["device"] == "cpu"
    assert [(s.batch_size, s.verify_rows) for s in result.samples] == [(1, 1), (1, 3), (1, 4), (4, 4), (4, 10), (4, 16)]
    assert all(s.seconds > 0 for s in result.samples)
    assert math.isfinite(result.median_rel_error) and result.median_rel_error >= 0


def test_forced_windows_drive_the_engine_at_the_profiled_budget():
    model = tiny_model(seed=2).float()
    records = []
    engine = Engine(
        model,
        NGramDrafter(model.args.vocab_size),
        EngineConfig(gamma=3, max_batch=3, default_mode="compact"),
        policy=ForcedWindows([0, 2, 3]),
        sink=records.append,
    )
    for i in range(3):
        engine.submit(Request(f"r{i}", [1, 2, 3, 4], 8, seed=i, stop_at_eos=False))
    engine.step()
    assert [r.window for r in records[0].requests] == [0, 2, 3] and records[0].verify_rows == 1 + 3 + 4
