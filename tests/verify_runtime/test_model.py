import pickle

import pytest
import torch

from sparkgate.verify_runtime.model import (
    ModelArgs,
    Transformer,
    forward_full,
    load_checkpoint,
    model_version,
    save_checkpoint,
)
from tests.conftest import tiny_model


def _attend_repeated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out, each K/V head repeated for the query heads it serves: [B, L, H, D]."""
    group = q.shape[-2] // k.shape[-2]
    k, v = k.repeat_interleave(group, dim=-2), v.repeat_interleave(group, dim=-2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    length = q.shape[1]
    scores = scores.masked_fill(~torch.ones(length, length, dtype=torch.bool).tril(), -torch.inf)
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def test_grouped_query_attention_and_arg_checks():
    model = tiny_model(seed=3).double()
    assert model.args.n_kv_heads < model.args.n_heads
    # Query heads share K/V heads in groups: the dense forward is the one that repeats them explicitly.
    tokens = torch.randint(0, model.args.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(9).expand_as(tokens)
    reference = model.hidden(tokens, positions, [_attend_repeated] * len(model.layers))
    torch.testing.assert_close(forward_full(model, tokens)[0], reference)
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        ModelArgs(dim=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="dim=12 / n_heads=4 = 3: a head needs an even size"):
        ModelArgs(dim=12, n_heads=4, n_kv_heads=2)


def test_checkpoint_round_trip_is_weights_only(tmp_path, target):
    path = tmp_path / "m.pt"
    save_checkpoint(target, path, extra={"val_loss": 1.5})
    loaded, extra = load_checkpoint(path)
    assert extra == {"val_loss": 1.5}
    assert loaded.args == target.args
    tokens = torch.randint(0, 32, (2, 7))
    torch.testing.assert_close(forward_full(loaded.double(), tokens)[1], forward_full(target, tokens)[1])
    assert model_version(loaded.double()) == model_version(target)
    # a pickle with arbitrary objects is refused by the weights-only loader
    torch.save({"args": object(), "model": {}}, tmp_path / "bad.pt")
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(tmp_path / "bad.pt")


def test_checkpoint_without_args_fails_clearly(tmp_path):
    torch.save({"model": {}}, tmp_path / "noargs.pt")
    with pytest.raises(ValueError, match=r"lacks \['args'\]"):
        load_checkpoint(tmp_path / "noargs.pt")


def test_default_model_is_large_enough_for_the_benchmark():
    assert Transformer(ModelArgs()).num_params >= 3_000_000
