import json

import torch
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.verify_runtime.block_drafter import DrafterArgs, DSparkNet, load_drafter
from sparkgate.verify_runtime.confidence_tuning import (
    collect_own_blocks,
    fit_confidence_head,
)
from sparkgate.verify_runtime.model import BYTE_VOCAB, save_checkpoint
from tests.conftest import tiny_model

from .test_block_drafter import tiny_net


def test_own_blocks_line_up_with_the_engine_and_the_head_fit_lowers_bce(target):
    net = tiny_net()
    prompts = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    blocks = collect_own_blocks(target, net, prompts, max_new_tokens=12, gamma=5, batch=2)
    n = len(blocks.full_accept)
    assert blocks.hidden.shape == (n, 6, 32) and blocks.prev.shape == (n, 5) and blocks.hidden_len.shape == (n,)
    assert ((blocks.full_accept >= 0) & (blocks.full_accept <= 5)).all()
    # the first block of each request starts from its last prompt token
    assert sorted(blocks.prev[:, 0].tolist()[:2]) == [3, 4]
    frozen = {k: v.clone() for k, v in net.state_dict().items() if not k.startswith("confidence_head")}
    report = fit_confidence_head(net, blocks, steps=50, lr=0.05)
    assert report["blocks"] == n and report["bce_after"] < report["bce_before"]
    assert all(torch.equal(v, net.state_dict()[k]) for k, v in frozen.items())
    assert all(p.requires_grad for p in net.parameters())


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
