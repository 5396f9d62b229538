"""``sparkgate train confidence``: the variant it was given refitted, its head only."""

import json

import torch
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.verify_runtime.block_drafter import DrafterArgs, DSparkNet, load_drafter
from sparkgate.verify_runtime.model import BYTE_VOCAB, save_checkpoint
from tests.conftest import tiny_model


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
