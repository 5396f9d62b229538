import pytest
import torch

from sparkgate.verify_runtime.block_drafter import (
    BlockDrafter,
    DrafterArgs,
    draft_stats,
    load_drafter,
)
from sparkgate.verify_runtime.drafters import DraftContext
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.model import forward_full, model_version, save_checkpoint
from tests.conftest import tiny_net
from tests.verify_runtime.reference import greedy_decode


def context(target, histories, gamma=5, temperature=0.0, window=6) -> DraftContext:
    hidden = torch.zeros(len(histories), window, target.args.dim, dtype=torch.float64)
    lengths = []
    for i, h in enumerate(histories):
        states, _ = forward_full(target, torch.tensor([h[:-1]])) if len(h) > 1 else (torch.zeros(1, 0, 32), None)
        n = min(window, states.shape[1])
        if n:
            hidden[i, window - n :] = states[0, -n:]
        lengths.append(n)
    b = len(histories)
    return DraftContext(
        histories,
        torch.tensor([len(h) - 1 for h in histories]),
        torch.arange(b) + 11,
        torch.full((b,), temperature),
        gamma,
        hidden,
        torch.tensor(lengths),
    )


def test_outputs_have_the_interface_shapes_and_ranges(target):
    drafter = BlockDrafter(tiny_net())
    assert drafter.hidden_window == 6 and drafter.version.startswith("dspark-")
    for temperature in (0.0, 0.8):
        out = drafter.propose(context(target, [[1, 2, 3, 4], [5], list(range(12))], temperature=temperature))
        assert out.tokens.shape == (3, 5) and out.tokens.dtype == torch.long
        assert out.probs.shape == (3, 5, 32) and out.confidence_logits.shape == (3, 5)
        torch.testing.assert_close(out.probs.sum(-1), torch.ones(3, 5, dtype=out.probs.dtype))
        conf = torch.sigmoid(out.confidence_logits)
        assert ((conf > 0) & (conf < 1)).all()
        # each draft token is possible under the distribution it was drawn from
        assert (out.probs.gather(-1, out.tokens[..., None]) > 0).all()
        if temperature == 0.0:
            assert torch.equal(out.tokens, out.probs.argmax(-1))


def test_drafts_are_deterministic_per_seed_and_position(target):
    drafter = BlockDrafter(tiny_net())
    ctx = context(target, [[1, 2, 3], [4, 5, 6, 7]], temperature=1.0)
    a, b = drafter.propose(ctx), drafter.propose(ctx)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.probs, b.probs)
    # a request's drafts do not depend on what else is in the batch
    alone = context(target, [[4, 5, 6, 7]], temperature=1.0)
    alone.seeds = ctx.seeds[1:]
    assert torch.equal(drafter.propose(alone).tokens[0], a.tokens[1])


def test_sequential_head_matches_the_teacher_forced_training_pass(target):
    """The drafting loop and the training forward compute the same logits when the
    training pass is fed the drafted tokens, so what was trained is what drafts."""
    net = tiny_net()
    ctx = context(target, [[3, 1, 4, 1, 5], [9, 2]])
    out = BlockDrafter(net).propose(ctx)
    pending = torch.tensor([[5], [2]])
    prev = torch.cat([pending, out.tokens[:, :-1]], 1)
    logits, confidence = net(ctx.hidden, ctx.hidden_len, prev)
    torch.testing.assert_close(torch.softmax(logits.float(), -1), out.probs)
    torch.testing.assert_close(confidence.float(), out.confidence_logits)
    # without the sequential head the block is the backbone's alone
    parallel = BlockDrafter(net, sequential=False).propose(ctx)
    base, _ = net(ctx.hidden, ctx.hidden_len, prev, sequential=False)
    assert torch.equal(parallel.tokens, base.argmax(-1))
    assert not torch.equal(parallel.tokens, out.tokens)


def test_draft_stats_describe_how_sure_the_drafter_was():
    vocab = 32
    uniform = torch.zeros(vocab)
    peaked = torch.full((vocab,), -20.0).index_fill_(0, torch.tensor([7]), 20.0)
    two_way = torch.full((vocab,), -50.0).index_fill_(0, torch.tensor([3, 9]), 0.0)  # a coin flip between two
    stats = draft_stats(torch.stack([uniform, peaked, two_way]).requires_grad_())
    assert stats.shape == (3, 3) and not stats.requires_grad
    logit_top, entropy, margin = stats.T
    torch.testing.assert_close(
        entropy, torch.tensor([torch.log(torch.tensor(32.0)), 0.0, torch.log(torch.tensor(2.0))]), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(margin, torch.tensor([0.0, 1.0, 0.0]), atol=1e-4, rtol=0)
    assert logit_top[1] > 13 and abs(logit_top[2]) < 1e-4 and logit_top[0] < -3  # p_top 1, 1/2, 1/32


def test_confidence_reads_the_distribution_each_depth_was_drafted_from():
    """Same representation and previous token, a sharper draft distribution: another confidence."""
    net = tiny_net()
    h = torch.randn(2, 5, 32, dtype=torch.float64)
    prev = torch.randint(0, 32, (2, 5))
    flat = torch.zeros(2, 5, 32, dtype=torch.float64)
    sharp = flat.clone()
    sharp[..., 4] = 30.0
    assert not torch.allclose(net.confidence(h, prev, flat), net.confidence(h, prev, sharp))


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_engine_with_block_drafter_reproduces_target_greedy(target, mode):
    from tests.conftest import SurvivalWindows

    engine = Engine(target, BlockDrafter(tiny_net()), EngineConfig(gamma=5, max_batch=3), policy=SurvivalWindows())
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10, 11, 12, 13]]
    for i, p in enumerate(prompts):
        engine.submit(Request(str(i), p, 14, mode=mode, stop_at_eos=False))
    out = engine.run()
    for i, p in enumerate(prompts):
        assert out[str(i)] == greedy_decode(target, p, 14)


def test_checkpoint_round_trip_and_bad_input(tmp_path, target):
    net = tiny_net()
    save_checkpoint(net, tmp_path / "d.pt", extra={"note": 1})
    loaded, extra = load_drafter(tmp_path / "d.pt")
    assert extra == {"note": 1} and loaded.args == net.args
    assert model_version(loaded.double()) == model_version(net)
    drafter = BlockDrafter(net)
    with pytest.raises(ValueError, match="gamma=7 is outside"):
        drafter.propose(context(target, [[1, 2]], gamma=7))
    ctx = context(target, [[1, 2]])
    ctx.hidden = None
    with pytest.raises(ValueError, match="needs the target hidden states"):
        drafter.propose(ctx)
    with pytest.raises(ValueError, match="DrafterArgs.markov_rank must be >= 1"):
        DrafterArgs(markov_rank=0)
