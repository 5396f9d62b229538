"""Losslessness of speculative sampling, checked against the exact target distribution."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from sparkgate.policies.window import FixedWindow
from sparkgate.verify_runtime.acceptance import accept_all
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.model import forward_full
from tests.conftest import tiny_model

VOCAB, PROMPT, N = 8, [1, 5, 2], 3000


def exact_first_two(model, temperature: float) -> torch.Tensor:
    """P(t1, t2 | prompt) as an [8, 8] table."""
    with torch.inference_mode():
        p1 = torch.softmax(forward_full(model, torch.tensor([PROMPT]))[1][0, -1] / temperature, -1)
        seqs = torch.tensor([PROMPT + [t] for t in range(VOCAB)])
        p2 = torch.softmax(forward_full(model, seqs)[1][:, -1] / temperature, -1)
    return p1[:, None] * p2


def sampled_first_two(model, drafter, mode, window, temperature, passes=None) -> torch.Tensor:
    kwargs = {} if passes is None else {"passes": passes}
    engine = Engine(
        model, drafter, EngineConfig(gamma=3, max_batch=N, cache_len=16), policy=FixedWindow(window), **kwargs
    )
    for seed in range(N):
        engine.submit(Request(str(seed), PROMPT, 2, temperature=temperature, seed=seed, mode=mode, stop_at_eos=False))
    counts = torch.zeros(VOCAB, VOCAB)
    for out in engine.run().values():
        counts[out[0], out[1]] += 1
    return counts


def gof_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square; cells expecting fewer than 5 are pooled into one."""
    expected = probs.flatten().double() * counts.sum()
    observed = counts.flatten().double()
    small = expected < 5
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    obs = torch.cat([observed[~small], observed[small].sum().view(1)])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum().item()
    return float(chi2.sf(stat, int(keep.sum()) - 1))


@pytest.fixture(scope="module")
def pair():
    target = tiny_model(vocab=VOCAB, seed=11, init_std=0.6)
    draft_model = tiny_model(vocab=VOCAB, seed=12, init_std=0.6)
    return target, ModelDrafter(draft_model)


@pytest.mark.parametrize(
    "mode,window", [("static", 3), ("shadow", 1), ("compact", 1), ("compact", 2), ("cap_accept", 1)]
)
def test_every_mode_samples_the_target_distribution(pair, mode, window):
    target, drafter = pair
    probs = exact_first_two(target, temperature=1.0)
    counts = sampled_first_two(target, drafter, mode, window, temperature=1.0)
    assert gof_pvalue(counts, probs) > 1e-3


def test_the_goodness_of_fit_test_rejects_a_broken_rule(pair):
    """Negative control: accepting every draft samples the drafter, and the test sees it."""
    target, drafter = pair
    probs = exact_first_two(target, temperature=1.0)
    counts = sampled_first_two(target, drafter, "static", 3, temperature=1.0, passes=accept_all)
    assert gof_pvalue(counts, probs) < 1e-6


def test_drafter_distribution_differs_from_target(pair):
    """The control only has power if q and p differ: check they do."""
    target, drafter = pair
    with torch.inference_mode():
        p = torch.softmax(forward_full(target, torch.tensor([PROMPT]))[1][0, -1], -1)
        q = torch.softmax(forward_full(drafter.model, torch.tensor([PROMPT]))[1][0, -1], -1)
    assert 0.5 * (p - q).abs().sum() > 0.1


def test_greedy_acceptance_rule():
    from sparkgate.verify_runtime.acceptance import AcceptInput, accept

    p = torch.zeros(1, 4, 5)
    for row, tok in enumerate([2, 3, 1, 4]):
        p[0, row, tok] = 1.0
    drafts = torch.tensor([[2, 3, 0]])  # third draft is wrong
    x = AcceptInput(
        p=p,
        q=torch.full((1, 3, 5), 0.2),
        drafts=drafts,
        verified=torch.tensor([3]),
        limit=torch.tensor([3]),
        greedy=torch.tensor([True]),
        u_accept=torch.zeros(1, 3),
        u_sample=torch.zeros(1, 4),
    )
    out = accept(x)
    assert (out.accepted.item(), out.full.item(), out.next_token.item()) == (2, 2, 1)
    # a commit limit of 1 keeps one draft and takes the bonus after it
    x.limit = torch.tensor([1])
    out = accept(x)
    assert (out.accepted.item(), out.full.item(), out.next_token.item()) == (1, 2, 3)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 6), gamma=st.integers(1, 5))
def test_greedy_batches_skip_the_sampler_and_commit_the_same(seed, batch, gamma):
    """Without uniforms (an all-greedy batch) acceptance equals the full rule given any uniforms."""
    from sparkgate.verify_runtime.acceptance import AcceptInput, accept

    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, gamma + 1, VOCAB, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(batch, gamma, VOCAB, generator=g) * 3, -1)
    # Drafts that often match the target's argmax, so accepted lengths vary.
    drafts = torch.where(
        torch.rand(batch, gamma, generator=g) < 0.7,
        p[:, :-1].argmax(-1),
        torch.randint(0, VOCAB, (batch, gamma), generator=g),
    )
    verified = torch.randint(0, gamma + 1, (batch,), generator=g)
    limit = torch.minimum(verified, torch.randint(0, gamma + 1, (batch,), generator=g))
    common = dict(p=p, q=q, drafts=drafts, verified=verified, limit=limit, greedy=torch.ones(batch, dtype=torch.bool))
    full = accept(
        AcceptInput(
            **common, u_accept=torch.rand(batch, gamma, generator=g), u_sample=torch.rand(batch, gamma + 1, generator=g)
        )
    )
    fast = accept(AcceptInput(**common))
    for name in ("accepted", "full", "next_token"):
        assert torch.equal(getattr(full, name), getattr(fast, name)), name
