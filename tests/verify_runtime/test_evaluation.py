import json

import pytest
import torch
from click.testing import CliRunner

from sparkgate.policies.calibration import STS
from sparkgate.verify_runtime.block_drafter import BlockDrafter, DrafterArgs, DSparkNet
from sparkgate.verify_runtime.calibrate_cli import calibrate, read_labels
from sparkgate.verify_runtime.corpus import stdlib_corpus
from sparkgate.verify_runtime.drafters import NGramDrafter
from sparkgate.verify_runtime.evaluation import Blocks, EvalConfig, acceptance, evaluate
from sparkgate.verify_runtime.model import BYTE_VOCAB, ModelArgs, Transformer


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; spare a busy machine's other core
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def evaluated():
    torch.manual_seed(0)
    target = Transformer(
        ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=64, init_std=0.3)
    ).eval()
    block = BlockDrafter(
        DSparkNet(DrafterArgs(target_dim=32, dim=32, n_heads=4, n_kv_heads=2, ffn_hidden=48, window=4, markov_rank=8))
    )
    # the n-gram drafter accepts often on a random target's repetitive output, so its
    # confidences have both outcomes to be judged against
    drafters = {"ngram": NGramDrafter(BYTE_VOCAB), "block": block}
    cfg = EvalConfig(prompts_per_domain=4, prompt_len=16, max_new_tokens=24, batch=4, latency_repeats=2, bootstrap=20)
    sts = STS([1.5] * 7)
    report, records = evaluate(target, drafters, stdlib_corpus(), cfg, sts)
    return report, records, sts


def test_report_has_acceptance_by_depth_per_domain_and_drafter(evaluated):
    report, records, _ = evaluated
    assert set(report["domains"]) == {"code", "prose"} and set(records) == {"code", "prose"}
    for section in report["domains"].values():
        for name in ("ngram", "block"):
            acc = section[name]
            assert len(acc["survival"]) == len(acc["conditional_acceptance"]) == 7
            assert all(a >= b for a, b in zip(acc["survival"], acc["survival"][1:]))
            # E[a*] = Σ_k P(a* >= k)
            assert acc["mean_accepted"] == pytest.approx(sum(acc["survival"]), abs=1e-3)
            assert acc["steps"] > 0 and acc["draft_to_verify"] > 0
        assert {"before", "after"} <= set(section["calibration"])
    assert report["domains"]["code"]["ngram"]["mean_accepted"] > 0
    assert all(
        rec.gamma == 7 and all(r.mode == "static" for r in rec.requests) for recs in records.values() for rec in recs
    )
    assert set(report["draft_latency_ms"]) == {"ngram", "block"}
    assert {"code_mean_accepted", "sequential_gain_mean_accepted", "sts_mean_ece"} <= set(report["targets"])


def test_pooled_calibration_matches_the_rows(evaluated):
    report, records, sts = evaluated
    blocks = Blocks.from_records([r for recs in records.values() for r in recs])
    assert report["pooled"]["acceptance"] == acceptance(blocks)
    calib = report["pooled"]["calibration"]
    for name in ("before", "after"):
        assert all(u >= e - 1e-9 for u, e in zip(calib[name]["ece_upper"], calib[name]["ece"]))
        assert all(0 <= b <= 1 for b in calib[name]["brier"])
    assert report["sts_version"] == sts.version


def test_calibrate_fits_from_full_block_records_only(tmp_path, evaluated):
    _, records, _ = evaluated
    lines = [rec.to_dict() for recs in records.values() for rec in recs]
    lines[0]["requests"][0]["mode"] = "compact"  # censored traffic is left out
    path = tmp_path / "records.ndjson"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    confidence, labels = read_labels([path])
    rows = sum(len(line["requests"]) for line in lines)
    assert confidence.shape == labels.shape == (rows - 1, 7)
    assert (labels.diff(dim=1) <= 0).all()

    result = CliRunner().invoke(calibrate, ["--records", str(path), "--out", str(tmp_path / "sts.json")])
    assert result.exit_code == 0, result.output
    sts = STS.load(tmp_path / "sts.json")
    assert sts.gamma == 7 and sts.num_samples == rows - 1 and json.loads(result.output)["version"] == sts.version

    lines[1]["requests"][0]["confidence"] = [0.5] * 3
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = CliRunner().invoke(calibrate, ["--records", str(path), "--out", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and "records.ndjson:2: requests[0].confidence has 3 values, gamma=7" in result.output
