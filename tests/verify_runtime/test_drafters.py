"""Drafters: greedy rows take the argmax without the keyed sampler; the n-gram drafter continues what
repeats; a noiseless model drafter drafts the model's own greedy continuation."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.verify_runtime.drafters import DraftContext, ModelDrafter, NGramDrafter
from tests.conftest import tiny_model
from tests.verify_runtime.reference import greedy_decode

VOCAB = 8


def test_greedy_drafts_skip_the_sampler_and_pick_the_same():
    from sparkgate.verify_runtime.drafters import DraftContext, pick

    probs = torch.softmax(torch.randn(4, VOCAB), -1)
    ctx = DraftContext([[1]] * 4, torch.arange(4), torch.arange(4), torch.zeros(4), 3)
    assert torch.equal(pick(probs, ctx, 1), probs.argmax(-1))
    ctx.temperatures = torch.tensor([0.0, 1.0, 0.0, 1.0])  # sampled rows draw, greedy rows still take the argmax
    mixed = pick(probs, ctx, 1)
    assert torch.equal(mixed[[0, 2]], probs.argmax(-1)[[0, 2]])


def greedy_context(histories: list[list[int]], gamma: int) -> DraftContext:
    batch = len(histories)
    positions = torch.tensor([len(h) - 1 for h in histories])
    return DraftContext(histories, positions, torch.arange(batch), torch.zeros(batch), gamma)


def test_ngram_lookup_continues_the_repeated_pattern_and_is_surest_there():
    drafter = NGramDrafter(VOCAB)
    out = drafter.propose(greedy_context([[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 4]], gamma=3))
    assert out.tokens.shape == (2, 3) and out.probs.shape == (2, 3, VOCAB)
    assert out.tokens[0].tolist() == [3, 1, 2]
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(2, 3))
    # The confidence is the logit of the drafter's own probability of its token.
    own = out.probs.gather(-1, out.tokens.unsqueeze(-1)).squeeze(-1).double()
    torch.testing.assert_close(out.confidence_logits.double(), (own / (1 - own)).log(), rtol=1e-4, atol=1e-4)
    assert bool((out.confidence_logits[0] > out.confidence_logits[1]).all())  # repeats are surer than noise
    again = drafter.propose(greedy_context([[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 4]], gamma=3))
    assert torch.equal(again.tokens, out.tokens) and torch.equal(again.probs, out.probs)


def test_a_noiseless_model_drafter_proposes_the_greedy_continuation():
    target = tiny_model(vocab=32)
    histories = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]  # within its context: the whole history
    out = ModelDrafter(target).propose(greedy_context(histories, gamma=4))
    assert [out.tokens[b].tolist() for b in range(2)] == [greedy_decode(target, h, 4) for h in histories]
    torch.testing.assert_close(out.probs.double().sum(-1), torch.ones(2, 4, dtype=torch.float64))
    noisy = ModelDrafter(target, noise=3.0).propose(greedy_context(histories, gamma=4))
    assert torch.equal(noisy.tokens, ModelDrafter(target, noise=3.0).propose(greedy_context(histories, 4)).tokens)
    assert not torch.equal(noisy.probs, out.probs)


@given(st.lists(st.lists(st.integers(0, 31), min_size=1, max_size=12), min_size=2, max_size=5),
       st.sampled_from([0.0, 1.0]))  # fmt: skip
@settings(max_examples=25, deadline=None)
def test_what_a_model_drafter_drafts_for_a_request_does_not_depend_on_its_batch(histories, temperature):
    """Every window was cut to the batch's shortest history: the same request drafted otherwise beside a
    short one (and, sampled, committed other tokens)."""
    drafter = ModelDrafter(tiny_model(vocab=32), noise=1.5, context=6)  # histories longer and shorter than it

    def ctx(hs: list[list[int]], seeds: list[int]) -> DraftContext:
        n = len(hs)
        return DraftContext(hs, torch.tensor([len(h) - 1 for h in hs]), torch.tensor(seeds),
                            torch.full((n,), temperature), 3)  # fmt: skip

    together = drafter.propose(ctx(histories, list(range(len(histories)))))
    for i, history in enumerate(histories):
        alone = drafter.propose(ctx([history], [i]))
        assert torch.equal(together.tokens[i], alone.tokens[0])
        torch.testing.assert_close(together.probs[i], alone.probs[0])
        torch.testing.assert_close(together.confidence_logits[i], alone.confidence_logits[0])
