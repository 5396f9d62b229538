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


def test_grouped_query_attention_and_arg_checks():
    model = tiny_model(seed=3)
    assert model.args.n_kv_heads < model.args.n_heads
    with pytest.raises(ValueError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        ModelArgs(dim=32, n_heads=4, n_kv_heads=3)


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
