"""The shipped checkpoints and STS file: present, described, small, loadable, usable."""

import pytest
import torch

from sparkgate.verify_runtime.drafters import DraftContext
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.model import model_version
from sparkgate.verify_runtime.shipped import ASSETS, FILES, load_shipped, read_manifest
from tests.verify_runtime.reference import greedy_decode


@pytest.fixture(scope="module")
def manifest() -> dict:
    return read_manifest()


def test_manifest_describes_every_shipped_file(manifest):
    assert set(FILES) | {"corpus"} <= set(manifest)
    for key, name in FILES.items():
        assert manifest[key]["file"] == name and (ASSETS / name).exists()
    models = ("target", "drafter", "drafter_parallel")
    for key in models:
        assert manifest[key]["bytes"] == (ASSETS / FILES[key]).stat().st_size
    assert sum(manifest[key]["bytes"] for key in models) <= 15 * 2**20
    assert 3_000_000 <= manifest["target"]["params"] <= 6_000_000
    corpus_hash = manifest["corpus"]["content_hash"]
    assert all(manifest[key]["corpus_hash"] == corpus_hash for key in models)
    assert manifest["drafter"]["target_version"] == manifest["target"]["version"]
    assert manifest["drafter_parallel"]["target_version"] == manifest["target"]["version"]
    assert not manifest["drafter_parallel"]["args"]["sequential"] and manifest["drafter"]["args"]["sequential"]
    assert "calibration" in manifest["sts"]["dataset"]


def test_shipped_models_load_and_generate(manifest):
    target, drafter, sts = load_shipped()
    assert model_version(target) == manifest["target"]["version"]
    assert drafter.version == f"dspark-{manifest['drafter']['version']}"
    assert sts is not None and sts.gamma == 7 and sts.version == manifest["sts"]["version"]
    records = []
    engine = Engine(target, drafter, EngineConfig(gamma=7, max_batch=2), calibrate=sts, sink=records.append)
    prompts = [list(b"import os\n\ndef main():\n    "), list(b"The for statement is used to")]
    for i, prompt in enumerate(prompts):
        engine.submit(Request(str(i), prompt, 24, stop_at_eos=False))
    out = engine.run()
    for i, prompt in enumerate(prompts):
        assert out[str(i)] == greedy_decode(target, prompt, 24)
    rows = [row for rec in records for row in rec.requests]
    assert sum(row.accepted for row in rows) > 0  # the trained drafter gets drafts accepted
    for row in rows:  # a sure draft may round to 1.0 in float32; STS clamps it before taking logits
        assert all(0 <= c <= 1 for c in row.confidence)
        assert all(a >= b for a, b in zip(row.survival, row.survival[1:]))
    confidences = [c for row in rows for c in row.confidence]
    assert min(confidences) < 0.5 < max(confidences)  # the head tells sure drafts from unsure ones


def test_parallel_ablation_is_shipped_too():
    target, drafter, _ = load_shipped("drafter_parallel")
    assert not drafter.net.args.sequential and drafter.version.endswith("-parallel")
    with pytest.raises(ValueError, match="variant must be one of"):
        load_shipped("eagle")
    hidden = torch.zeros(1, drafter.hidden_window, target.args.dim)
    ctx = DraftContext(
        [[65, 66]], torch.tensor([1]), torch.tensor([0]), torch.tensor([0.0]), 7, hidden, torch.tensor([0])
    )
    assert drafter.propose(ctx).tokens.shape == (1, 7)


def test_shipped_cost_tables_were_measured_for_the_shipped_models():
    from sparkgate.policies.cost_model import load_cost_table
    from sparkgate.verify_runtime.defaults import SHIPPED_COST_TABLES, default_drafter
    from sparkgate.verify_runtime.profiler import step_version

    target = load_shipped("drafter").target
    shipped = step_version(target, default_drafter(target))
    for path in SHIPPED_COST_TABLES:
        table = load_cost_table(path, force=True)  # parses and validates; measured on other hardware
        assert table.meta.model == shipped, path.name
        assert path.with_suffix(".png").exists()
