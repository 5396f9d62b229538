import json
import math

import pytest
import torch

from sparkgate.policies.calibration import (
    STS,
    STSFormatError,
    auroc,
    batched_ece,
    bin_index,
    brier_per_depth,
    ece_per_depth,
    fit_sts,
    scale_confidence,
)


def synthetic(n=20000, gamma=5, sharpen=0.4, seed=0):
    """True conditional acceptances, labels drawn from them, and over-confident raw scores."""
    g = torch.Generator().manual_seed(seed)
    true = torch.rand(n, gamma, generator=g, dtype=torch.float64) * 0.6 + 0.35
    accept = (torch.rand(n, gamma, generator=g, dtype=torch.float64) < true).double()
    labels = accept.cumprod(1)  # y_k = 1[a* >= k]
    return scale_confidence(true, sharpen), labels


def test_bins_follow_the_design_edges():
    p = torch.tensor([0.0, 1 / 15 - 1e-9, 1 / 15, 0.5, 14 / 15, 1.0])
    assert bin_index(p).tolist() == [0, 0, 1, 7, 14, 14]
    # perfectly calibrated bins give zero ECE; a constant gap gives that gap
    pred = torch.tensor([0.25] * 4 + [0.75] * 4)
    y = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    assert float(batched_ece(pred[None], y)[0]) == pytest.approx(0.0)
    assert float(batched_ece(torch.full((1, 4), 0.9), torch.tensor([1.0, 0, 1, 0]))[0]) == pytest.approx(0.4)
    # a bootstrap weight of 2 counts a row twice
    w = torch.tensor([[2.0, 1.0]])
    assert float(batched_ece(torch.tensor([[0.5, 0.5]]), torch.tensor([1.0, 0.0]), w)[0]) == pytest.approx(1 / 6)


def test_sts_lowers_ece_of_over_confident_scores_and_preserves_order():
    raw, labels = synthetic()
    sts = fit_sts(raw, labels, dataset="synthetic")
    assert sts.gamma == 5 and sts.num_samples == 20000 and sts.dataset == "synthetic"
    assert all(t > 1 for t in sts.temperatures)  # over-confident scores get softened
    assert max(sts.ece_after) < 0.015 and min(sts.ece_before) > 0.05
    assert ece_per_depth(sts(raw), labels) == pytest.approx(sts.ece_after)
    calibrated = sts.calibrated(raw)
    for k in range(5):
        order = raw[:, k].argsort()
        assert (calibrated[order, k].diff() >= 0).all()  # same order at every depth
    survival = sts(raw)
    assert (survival.diff(dim=1) <= 0).all() and ((survival > 0) & (survival < 1)).all()


def test_fit_is_left_to_right_with_earlier_depths_frozen():
    raw, labels = synthetic(gamma=4, seed=1)
    full = fit_sts(raw, labels)
    prefix = fit_sts(raw[:, :2], labels[:, :2])
    assert full.temperatures[:2] == prefix.temperatures
    # a depth that is already calibrated keeps T = 1
    true, labels = synthetic(sharpen=1.0, gamma=1, n=5000, seed=2)
    assert fit_sts(true, labels).temperatures[0] == pytest.approx(1.0, rel=0.2)


@pytest.mark.parametrize("spread", ["uniform", "beta22"])
def test_calibrated_depths_keep_their_resolution(spread):
    # Binned ECE alone is least for a huge temperature, which squeezes every confidence into the bin around
    # 0.5; a proper scoring rule is least at T = 1 when the confidences are already right.
    g = torch.Generator().manual_seed(3)
    if spread == "uniform":
        true = torch.rand(20000, 4, generator=g, dtype=torch.float64) * 0.8 + 0.1
    else:
        torch.manual_seed(3)
        true = torch.distributions.Beta(2.0, 2.0).sample((20000, 4)).double()
    labels = (torch.rand(true.shape, generator=g, dtype=torch.float64) < true).double().cumprod(1)
    sts = fit_sts(true, labels)
    assert sts.temperatures == pytest.approx([1.0] * 4, rel=0.1)
    for fitted, raw in zip(brier_per_depth(sts(true), labels), brier_per_depth(true.cumprod(1), labels)):
        assert fitted <= raw * 1.001


def test_observed_mask_excludes_censored_rows():
    raw, labels = synthetic(gamma=3)
    observed = torch.ones_like(labels, dtype=torch.bool)
    observed[:100, 2] = False
    garbage = labels.clone()
    garbage[:100, 2] = 1 - garbage[:100, 2]  # unobserved labels must not matter
    assert fit_sts(raw, garbage, observed).temperatures == fit_sts(raw, labels, observed).temperatures
    observed[:, 1] = False
    with pytest.raises(ValueError, match=r"no observed labels at depth\(s\) \[2\]"):
        fit_sts(raw, labels, observed)


def test_json_round_trip_in_sglang_layout(tmp_path):
    raw, labels = synthetic(gamma=3, n=3000)
    sts = fit_sts(raw, labels, dataset="calib")
    sts.save(tmp_path / "sts.json")
    data = json.loads((tmp_path / "sts.json").read_text())
    assert set(data) == {"temperatures", "dataset", "num_samples", "ece_before", "ece_after"}
    loaded = STS.load(tmp_path / "sts.json")
    assert loaded == sts and loaded.version == sts.version
    torch.testing.assert_close(loaded(raw), sts(raw))
    # SGLang files may carry only temperatures
    assert STS.from_dict({"temperatures": [1, 2.5]}).temperatures == [1.0, 2.5]
    # sparkgate's one addition, written only when known: the drafter the temperatures were fitted for
    bound = fit_sts(raw, labels, dataset="calib", drafter="dspark-1234")
    assert set(bound.to_dict()) == {"temperatures", "dataset", "num_samples", "ece_before", "ece_after", "drafter"}
    assert STS.from_dict(bound.to_dict()) == bound


@pytest.mark.parametrize(
    "data, message",
    [
        ({"temperatures": [1.0, 0.0]}, r"temperatures\[1\]=0.0: must be a finite number > 0"),
        ({"temperatures": [1.0, -2]}, r"temperatures\[1\]=-2"),
        ({"temperatures": [1.0, math.nan]}, r"temperatures\[1\]=nan"),
        ({"temperatures": []}, r"temperatures=\[\]: expected a non-empty list"),
        ({"temperatures": "1.0"}, r"temperatures='1.0'"),
        ({"temperatures": [1.0, 1.0], "ece_after": [0.1]}, r"ece_after=\[0.1\]: expected a list of 2 values"),
        ({"temperatures": [1.0], "ece_before": [1.5]}, r"ece_before\[0\]=1.5: must be a number in \[0, 1\]"),
        ({"temperatures": [1.0], "num_samples": -1}, r"num_samples=-1"),
        ({"temperatures": [1.0], "dataset": 3}, r"dataset=3"),
        ([1.0], r"<root>='list': expected a JSON object"),
    ],
)
def test_malformed_files_are_rejected_naming_the_field(tmp_path, data, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(STSFormatError, match=message) as err:
        STS.load(path)
    assert str(path) in str(err.value)


def test_a_file_giving_a_key_twice_is_rejected_naming_it(tmp_path):
    path = tmp_path / "twice.json"
    path.write_text('{"temperatures": [1.0], "temperatures": [2.0]}')
    with pytest.raises(STSFormatError, match="not JSON .*key 'temperatures' appears more than once"):
        STS.load(path)


def test_applying_to_the_wrong_block_size_fails_clearly():
    with pytest.raises(ValueError, match="confidence has 3 depths, this STS has gamma=2"):
        STS([1.0, 1.0])(torch.rand(4, 3))


def test_auroc():
    assert auroc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0
    assert auroc([0.9, 0.8, 0.2, 0.1], [0, 0, 1, 1]) == 0.0
    assert auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert auroc([0.3, 0.4], [1, 1]) is None
