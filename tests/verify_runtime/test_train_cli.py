"""``sparkgate train``: confidence refits the variant it was given, its head only; every stage refuses bad
input before it trains."""

import json

import pytest
import torch
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.verify_runtime.block_drafter import DrafterArgs, DSparkNet, load_drafter
from sparkgate.verify_runtime.model import BYTE_VOCAB, save_checkpoint
from sparkgate.verify_runtime.shipped import ASSETS, FILES
from tests.conftest import tiny_model
from tests.verify_runtime.refusals import refused


def test_train_confidence_refits_the_variant_it_was_given(tmp_path):
    """The command keeps a pure-parallel drafter the ablation it is (its own file name, no Markov
    head) and refits only its head, on byte prompts of the serving mix."""
    target = tiny_model(vocab=BYTE_VOCAB).float()
    save_checkpoint(target, tmp_path / "target.pt")
    torch.manual_seed(0)
    net = DSparkNet(
        DrafterArgs(
            target_dim=32, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=48, window=6, markov_rank=8, sequential=False
        )
    )
    save_checkpoint(net, tmp_path / "parallel.pt", extra={"steps": 3})
    out = CliRunner().invoke(
        main,
        [
            "train",
            "confidence",
            "--out",
            str(tmp_path / "run"),
            "--target",
            str(tmp_path / "target.pt"),
            "--drafter",
            str(tmp_path / "parallel.pt"),
            "--prompts",
            "6",
            "--prompt-len",
            "12",
            "--max-new-tokens",
            "10",
            "--steps",
            "20",
        ],
    )
    assert out.exit_code == 0, out.output
    report = json.loads(out.output.strip().splitlines()[-1])
    assert report["steps"] == 3 and report["confidence_tuning"]["bce_after"] < report["confidence_tuning"]["bce_before"]
    refit, _ = load_drafter(tmp_path / "run" / "drafter_parallel.pt")
    assert not refit.args.sequential and not (tmp_path / "run" / "drafter.pt").exists()
    before = {k: v.half().float() for k, v in net.state_dict().items()}
    for name, value in refit.state_dict().items():
        assert torch.equal(value, before[name]) == (not name.startswith("confidence_head")), name


TINY = ["--steps", "1", "--batch-size", "1", "--seq-len", "16", "--dim", "16", "--heads", "2", "--kv-heads", "1",
        "--ffn", "16", "--layers", "1"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--dim", "10", "--heads", "3"], ["--dim 10 --heads 3 --kv-heads 1", "not divisible by n_heads=3"]),
        (["--heads", "8", "--kv-heads", "3"], ["--heads 8 --kv-heads 3", "not divisible by n_kv_heads=3"]),
        (["--dim", "24", "--heads", "8"], ["--dim 24 --heads 8", "a head needs an even size"]),
        (["--kv-heads", "0"], ["'--kv-heads'", "0 is not in the range x>=1"]),
        (["--seq-len", "600"], ["'--seq-len'", "601 positions, but the target holds 512"]),
        (["--lr", "0"], ["'--lr'", "0.0 is not in the range x>0"]),
        (["--prose-fraction", "2"], ["'--prose-fraction'", "2.0 is not in the range 0<=x<=1"]),
        (["--threads", "-1"], ["'--threads'", "-1 is not in the range x>=0"]),
    ],
)
def test_train_target_refuses_a_bad_shape_or_value_before_training(tmp_path, args, named):
    output = refused(["train", "target", "--out", str(tmp_path / "run"), *TINY, *args])
    assert all(text in output for text in named) and not (tmp_path / "run").exists()


def test_a_run_directory_no_training_can_use_is_refused_before_any_step(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    output = refused(["train", "target", "--out", str(tmp_path / "file" / "run"), *TINY])
    assert "'--out'" in output and f"{tmp_path / 'file'} is not a directory" in output


def test_a_run_directory_of_another_run_is_refused_before_any_step(tmp_path):
    run = tmp_path / "run"
    assert CliRunner().invoke(main, ["train", "target", "--out", str(run), *TINY]).exit_code == 0
    state = (run / "state.pt").read_bytes()
    output = refused(["train", "target", "--out", str(run), *TINY, "--steps", "2"], exit_code=1)
    assert "state.pt was written by a different run" in output and (run / "state.pt").read_bytes() == state
    (run / "state.pt").write_bytes(state[: len(state) // 2])  # a run killed while it saved, say
    output = refused(["train", "target", "--out", str(run), *TINY], exit_code=1)
    assert f"{run / 'state.pt'} cannot be read (" in output and "use another run directory" in output


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--seq-len", "7"], "--seq-len", "7 is not longer than --gamma 7"),
        (["--seq-len", "600"], "--seq-len", "--seq-len 600: 600 positions, but the target holds 512"),
        (["--depth-decay", "0"], "--depth-decay", "0.0 is not in the range 0<x<=1"),
        (["--target", "GARBAGE"], "--target", "is not a target checkpoint"),
        (["--target", str(ASSETS / FILES["drafter"])], "--target", "unexpected keyword argument 'target_dim'"),
    ],
)
def test_train_drafter_refuses_bad_input_before_training(tmp_path, args, option, named):
    (tmp_path / "garbage.pt").write_text("not a checkpoint")
    args = [str(tmp_path / "garbage.pt") if a == "GARBAGE" else a for a in args]
    output = refused(["train", "drafter", "--out", str(tmp_path / "run"), "--steps", "1", "--seq-len", "16", *args])
    assert f"'{option}'" in output and named in output and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--gamma", "9"], "--gamma", "9 is beyond the drafter's max_gamma"),
        (["--max-new-tokens", "600"], "--max-new-tokens", "--max-new-tokens 600 and --gamma 7: 614 positions"),
        (["--prompts", "400000"], "--prompts", "too few for 400000 prompts of length 8"),
        (["--drafter", str(ASSETS / FILES["target"])], "--drafter", "is not a drafter checkpoint"),
        (["--steps", "0"], "--steps", "0 is not in the range x>=1"),
    ],
)
def test_train_confidence_refuses_bad_input_before_collecting_blocks(tmp_path, args, option, named):
    drafter = ["--drafter", str(ASSETS / FILES["drafter"])]
    output = refused(["train", "confidence", "--out", str(tmp_path / "run"), *drafter, "--prompt-len", "8", *args])
    assert f"'{option}'" in output and named in output and not (tmp_path / "run").exists()
