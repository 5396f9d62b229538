"""What commands use when not told otherwise: shipped models where they fit, and a cost table for this machine."""

import pytest
import torch

from sparkgate.policies.cost_model import FingerprintMismatch
from sparkgate.verify_runtime import defaults
from sparkgate.verify_runtime.block_drafter import BlockDrafter
from sparkgate.verify_runtime.defaults import (
    SHIPPED_COST_TABLES,
    default_calibration,
    default_cost_table,
    default_drafter,
    default_target,
    default_target_args,
)
from sparkgate.verify_runtime.drafters import NGramDrafter
from sparkgate.verify_runtime.model import BYTE_VOCAB, ModelArgs, Transformer, model_version
from sparkgate.verify_runtime.profiler import step_version
from sparkgate.verify_runtime.shipped import read_manifest
from tests.conftest import tiny_model


def test_the_shipped_target_gets_the_shipped_drafter_and_its_sts():
    manifest = read_manifest()
    target = default_target()
    assert model_version(target) == manifest["target"]["version"]
    drafter = default_drafter(target)
    assert isinstance(drafter, BlockDrafter) and drafter.version == f"dspark-{manifest['drafter']['version']}"
    sts = default_calibration(drafter)
    assert sts is not None and sts.version == manifest["sts"]["version"]


def test_the_target_args_are_the_shape_of_the_default_target_without_building_it(tmp_path, monkeypatch):
    assert default_target_args() == default_target().args
    monkeypatch.setattr(defaults, "ASSETS", tmp_path)  # nothing shipped: the seeded random target's shape
    assert default_target_args() == ModelArgs() == default_target().args


def test_another_target_gets_the_ngram_drafter_and_raw_confidences():
    target = tiny_model(vocab=BYTE_VOCAB).float()
    drafter = default_drafter(target)
    assert isinstance(drafter, NGramDrafter) and drafter.vocab_size == BYTE_VOCAB
    assert default_calibration(drafter) is None


def test_a_cost_table_is_profiled_here_once_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(defaults, "CACHE_DIR", tmp_path)
    torch.manual_seed(0)
    target = Transformer(ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=256)).eval()
    drafter = NGramDrafter(target.args.vocab_size)
    cached = tmp_path / f"cost_table-{step_version(target, drafter).replace('+', '-')}.json"
    table, source = default_cost_table(target, drafter)
    assert source == f"profiled here ({cached})" and cached.exists()
    assert table.meta.model == step_version(target, drafter) and table.meta.hardware["device"] == "cpu"
    again, source = default_cost_table(target, drafter)
    assert source == str(cached) and again.to_json_dict() == table.to_json_dict()
    # An explicit table must fit this machine and these models: the shipped ones were measured elsewhere.
    with pytest.raises(FingerprintMismatch):
        default_cost_table(target, drafter, SHIPPED_COST_TABLES[0])


def test_an_sts_file_fitted_for_another_drafter_is_refused(tmp_path):
    from sparkgate.policies.calibration import STS
    from sparkgate.verify_runtime.defaults import default_calibration, default_drafter, default_target
    from sparkgate.verify_runtime.shipped import ASSETS, FILES

    drafter = default_drafter(default_target())
    shipped = STS.load(ASSETS / FILES["sts"])
    assert shipped.drafter == drafter.version and default_calibration(drafter) == shipped
    other = tmp_path / "sts.json"
    STS(shipped.temperatures, drafter="dspark-000000000000").save(other)
    with pytest.raises(ValueError, match="fitted for drafter dspark-000000000000, but this replica runs"):
        default_calibration(drafter, other)
    STS(shipped.temperatures).save(other)  # an SGLang file names no drafter: taken as it is
    assert default_calibration(drafter, other).temperatures == shipped.temperatures
