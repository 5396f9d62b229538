import dataclasses

import pytest
import torch

from sparkgate.verify_runtime.block_drafter import DrafterArgs
from sparkgate.verify_runtime.corpus import Corpus, Document
from sparkgate.verify_runtime.model import (
    BYTE_VOCAB,
    ModelArgs,
    Transformer,
    forward_full,
)
from sparkgate.verify_runtime.training import (
    DraftObjective,
    TrainConfig,
    draft_examples,
    train_drafter,
    train_target,
)

TINY = ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=64)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    # enough documents that every split of both domains gets some
    docs = [Document("code", f"m{i}.py", (f"def f{i}(x):\n    return x + {i}\n" * 8).encode()) for i in range(60)]
    docs += [Document("prose", f"t{i}", (f"The value {i} is printed twice. " * 8).encode()) for i in range(60)]
    return Corpus(docs)


def cfg(**kw) -> TrainConfig:
    return TrainConfig(
        **{
            "steps": 4,
            "batch_size": 4,
            "seq_len": 32,
            "warmup": 1,
            "lr": 3e-3,
            "eval_batches": 1,
            "checkpoint_every": 2,
            **kw,
        }
    )


def test_target_training_is_resumable_bit_for_bit(tmp_path, corpus, monkeypatch):
    straight, report = train_target(corpus, TINY, cfg(), tmp_path / "a")
    assert report["steps"] == 4 and set(report["val_loss"]) == {"code", "prose"}

    real_batch, calls = Corpus.batch, []

    def crash_at_third_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # killed after the step-2 checkpoint
        return real_batch(self, *args, **kwargs)

    monkeypatch.setattr(Corpus, "batch", crash_at_third_step)
    with pytest.raises(KeyboardInterrupt):
        train_target(corpus, TINY, cfg(), tmp_path / "b")
    monkeypatch.setattr(Corpus, "batch", real_batch)
    assert torch.load(tmp_path / "b" / "state.pt", weights_only=True)["step"] == 2
    resumed, _ = train_target(corpus, TINY, cfg(), tmp_path / "b")
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_resuming_with_a_different_config_is_refused(tmp_path, corpus):
    train_target(corpus, TINY, cfg(steps=2), tmp_path)
    with pytest.raises(ValueError, match="different run"):
        train_target(corpus, TINY, cfg(steps=2, lr=1e-3), tmp_path)


def test_draft_examples_align_context_pending_and_targets():
    torch.manual_seed(0)
    target = Transformer(dataclasses.replace(TINY, vocab_size=BYTE_VOCAB)).eval()
    tokens = torch.randint(0, 256, (2, 20))
    objective = DraftObjective(gamma=3, anchors_per_row=5)
    ex = draft_examples(target, tokens, 4, objective, torch.Generator().manual_seed(1))
    hidden, logits = forward_full(target, tokens)
    assert ex.hidden.shape == (10, 4, 32) and ex.prev.shape == (10, 3) and ex.target_logits.shape == (10, 3, BYTE_VOCAB)
    for n in range(10):
        row = n // 5
        # recover the anchor from the target logits (depth 1 is the target's distribution at p)
        p = int((logits[row] - ex.target_logits[n, 0]).abs().sum(-1).argmin())
        assert torch.equal(ex.prev[n], tokens[row, p : p + 3])
        assert int(ex.hidden_len[n]) == min(p, 4)
        k = int(ex.hidden_len[n])
        torch.testing.assert_close(ex.hidden[n, 4 - k :], hidden[row, p - k : p])
        assert ex.hidden[n, : 4 - k].eq(0).all()


def test_tiny_drafter_loss_falls(tmp_path, corpus):
    torch.manual_seed(0)
    target, _ = train_target(corpus, TINY, cfg(steps=30, lr=1e-2), tmp_path / "t")
    args = DrafterArgs(
        target_dim=32, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, window=4, max_gamma=4, markov_rank=8
    )
    objective = DraftObjective(gamma=4, anchors_per_row=8)
    _, first = train_drafter(corpus, target, args, cfg(steps=1, lr=1e-2), objective, tmp_path / "d1")
    net, last = train_drafter(corpus, target, args, cfg(steps=40, lr=1e-2), objective, tmp_path / "d40")
    assert last["validation"]["code"]["loss"] < 0.95 * first["validation"]["code"]["loss"]
    assert last["train_loss"] < first["train_loss"]
    assert len(last["validation"]["code"]["match"]) == 4
    assert net.args.sequential and not net.training
