import dataclasses
import random
import re

import pytest
import torch

from sparkgate.policies.cost_model import (
    AdditiveCostTable,
    CostMeta,
    CostTableError,
    parse_cost_table,
)
from sparkgate.policies.cost_profile import (
    StepSample,
    fit_additive_table,
    hardware_fingerprint,
    median_relative_error,
)

TRUE = AdditiveCostTable(
    bias_seconds=0.003,
    bs_probes=(1, 8, 32),
    alpha_seconds=(0.0, 0.0004, 0.002),
    m_probes=(1, 16, 64, 256),
    theta_seconds=(0.0, 0.0001, 0.001, 0.006),
)


def grid_samples(table, noise=0.0, seed=0):
    rng = random.Random(seed)
    samples = []
    for bs in (1, 8, 32):
        for frac in (0.0, 0.25, 0.5, 1.0):
            rows = bs + round(frac * bs * 7)
            secs = float(table.step_seconds(bs, torch.tensor([float(rows)]))[0])
            samples.append(StepSample(bs, rows, secs * (1 + rng.uniform(-noise, noise))))
    return samples


def test_fit_recovers_an_exactly_additive_cost():
    samples = grid_samples(TRUE)
    fitted = fit_additive_table(samples, bs_probes=TRUE.bs_probes, m_probes=TRUE.m_probes)
    assert median_relative_error(fitted, samples) < 1e-9
    assert min(fitted.alpha_seconds) == 0.0 and min(fitted.theta_seconds) == 0.0
    assert fitted.bias_seconds > 0


def test_fit_of_noisy_samples_predicts_within_the_noise_and_round_trips():
    samples = grid_samples(TRUE, noise=0.05)
    fitted = fit_additive_table(samples, meta=CostMeta(version="fit-1"))
    assert median_relative_error(fitted, samples) < 0.05
    assert parse_cost_table(fitted.to_json_dict()) == fitted


def test_fit_never_predicts_a_cheaper_step_for_more_rows_or_a_larger_batch():
    # Noise made 24 rows measure faster than 16, and batch 8 faster than batch 1.
    samples = [
        StepSample(1, 1, 0.004),
        StepSample(1, 8, 0.0045),
        StepSample(8, 8, 0.0035),
        StepSample(8, 16, 0.006),
        StepSample(8, 24, 0.005),
        StepSample(8, 64, 0.009),
    ]
    fitted = fit_additive_table(samples)
    assert list(fitted.theta_seconds) == sorted(fitted.theta_seconds)
    assert list(fitted.alpha_seconds) == sorted(fitted.alpha_seconds)
    for bs in (1, 8):
        times = fitted.step_seconds(bs, torch.arange(1.0, 65.0))
        assert (times[1:] >= times[:-1]).all()


def test_fit_rounds_rows_to_tiers_like_prediction():
    meta = CostMeta(tiers=(16, 64, 256))
    tiered = dataclasses.replace(TRUE, meta=meta)
    samples = grid_samples(tiered)
    fitted = fit_additive_table(samples, meta=meta)
    assert fitted.m_probes == (16, 64, 256)  # the distinct tier-rounded row counts
    assert median_relative_error(fitted, samples) < 1e-9


@pytest.mark.parametrize(
    "sample, field",
    [
        (StepSample(0, 4, 0.01), "samples[0]: needs 1 <= batch_size"),
        (StepSample(4, 2, 0.01), "samples[0]: needs 1 <= batch_size"),
        (StepSample(4, 8, float("nan")), "samples[0].seconds"),
    ],
)
def test_bad_samples_are_rejected(sample, field):
    with pytest.raises(CostTableError, match=re.escape(field)):
        fit_additive_table([sample])


def test_fit_refuses_to_extrapolate_beyond_given_probes():
    with pytest.raises(CostTableError, match="m_probes"):
        fit_additive_table(grid_samples(TRUE), m_probes=(1, 16))


def test_fit_refuses_a_probe_no_sample_lies_near():
    # Samples at rows 8 and 64 say nothing of 16 or 32: least squares gave those probes whatever value the
    # constant's split left (24% low at 32 rows on a straight line).
    samples = [StepSample(b, r, 0.005 + 0.0001 * r) for b in (1, 2, 4) for r in (8, 64)]
    with pytest.raises(CostTableError, match=r"^m_probes: no sample lies between 8 and 32, so probe 16 is unmeasured"):
        fit_additive_table(samples, bs_probes=(1, 2, 4), m_probes=(8, 16, 32, 64))
    with pytest.raises(CostTableError, match=r"^bs_probes: no sample lies between 4 and 8, so probe 8 is unmeasured"):
        fit_additive_table(samples, bs_probes=(1, 4, 8), m_probes=(8, 64))


def test_hardware_fingerprint_is_stable_and_names_the_device():
    fp = hardware_fingerprint()
    assert fp == hardware_fingerprint("cpu")
    assert set(fp) == {"system", "machine", "cpu", "torch", "device"}
    assert fp["device"] == "cpu" and fp["torch"] == torch.__version__
