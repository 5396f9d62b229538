"""Counter-based randomness: a uniform depends on (seed, position, stream) only, never on the batch."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.verify_runtime.rng import ACCEPT, DRAFT, NOISE, SAMPLE, sample_from, splitmix64, uniform

MASK = (1 << 64) - 1


def splitmix64_reference(x: int) -> int:
    """The splitmix64 finaliser on unsigned Python integers."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=16))
def test_splitmix64_wraps_like_unsigned_64_bit_arithmetic(values):
    got = splitmix64(torch.tensor(values, dtype=torch.int64)).tolist()
    assert [g & MASK for g in got] == [splitmix64_reference(v & MASK) for v in values]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 10_000)), min_size=1, max_size=8),
    st.sampled_from([DRAFT, ACCEPT, SAMPLE, NOISE]),
)
def test_a_uniform_never_depends_on_the_batch_it_is_drawn_in(keys, stream):
    seeds = torch.tensor([s for s, _ in keys])
    positions = torch.tensor([p for _, p in keys])
    batch = uniform(seeds, positions, stream)
    assert batch.dtype == torch.float64 and bool(((batch >= 0) & (batch < 1)).all())
    alone = [float(uniform(torch.tensor([s]), torch.tensor([p]), stream)[0]) for s, p in keys]
    assert batch.tolist() == alone
    reversed_batch = uniform(seeds.flip(0), positions.flip(0), stream)
    assert torch.equal(reversed_batch.flip(0), batch)


def test_streams_positions_and_lanes_are_independent_draws():
    seeds, positions = torch.zeros(4000, dtype=torch.long), torch.arange(4000)
    draws = {s: uniform(seeds, positions, s) for s in (DRAFT, ACCEPT, SAMPLE, NOISE)}
    for a in draws.values():
        assert abs(float(a.mean()) - 0.5) < 0.02
        counts = torch.histc(a.float(), bins=10, min=0.0, max=1.0)
        assert bool((counts > 330).all() and (counts < 470).all())
    for a in draws.values():
        for b in draws.values():
            if a is not b:
                assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.05
    assert len(set(draws[DRAFT].tolist())) == 4000
    # A lane's value does not depend on how many lanes were asked for.
    wide = uniform(torch.tensor([7, 8]), torch.tensor([3, 3]), NOISE, lanes=6)
    assert wide.shape == (2, 6)
    assert torch.equal(uniform(torch.tensor([7, 8]), torch.tensor([3, 3]), NOISE, lanes=2), wide[:, :2])
    assert len(set(wide.flatten().tolist())) == 12


def test_inverse_cdf_sampling_follows_the_probabilities_and_skips_zero_mass():
    probs = torch.tensor([0.0, 2.0, 0.0, 1.0, 1.0])  # unnormalised: 0.5, 0.25, 0.25 on tokens 1, 3, 4
    u = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000
    picked = sample_from(probs.expand(1000, 5), u)
    assert torch.bincount(picked, minlength=5).tolist() == [0, 500, 0, 250, 250]
    assert sample_from(probs, torch.tensor(0.0, dtype=torch.float64)).item() == 1
    assert sample_from(probs, torch.tensor(1.0 - 1e-16, dtype=torch.float64)).item() == 4
