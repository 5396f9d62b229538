import torch

from sparkgate.verify_runtime.confidence_tuning import (
    collect_own_blocks,
    fit_confidence_head,
)
from tests.conftest import tiny_net


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
