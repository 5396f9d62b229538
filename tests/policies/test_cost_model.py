import json
import math
import re

import pytest
import torch

from sparkgate.policies.cost_model import (
    AdditiveCostTable,
    CostMeta,
    CostTableError,
    FingerprintMismatch,
    StepsPerSecondTable,
    check_fingerprint,
    load_cost_table,
    parse_cost_table,
    round_up_to_tier,
    save_cost_table,
)

SGLANG_SPS = {
    "sample_batch_tokens": [8, 16, 32, 64],
    "sample_steps_per_sec": [1000.0, 950.0, 500.0, 480.0],
    "max_batch_tokens": 128,
}
SGLANG_ADDITIVE = {
    "bias_seconds": 0.002,
    "bs_probes": [1, 64],
    "alpha_seconds": [0.0, 0.001],
    "m_probes": [1, 64, 512],
    "theta_seconds": [0.0, 0.0005, 0.004],
}
HW = {"system": "Linux", "machine": "x86_64", "cpu": "Test CPU", "torch": "2.13.0", "device": "cpu"}


def write(tmp_path, obj, name="table.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_sglang_sps_table_is_read_as_a_floor_step_as_sglang_reads_it():
    """SGLang looks the 1-D table up with ``bucketize(batch_tokens, probes, right=True) - 1`` clamped to the
    probes (``speculative/dspark_components/dspark_scheduler.py`` @ 692c5f7d532f129424b57961c262bbd253b411dc):
    no interpolation between probes, the first value below them, the last above."""
    table = parse_cost_table(SGLANG_SPS)
    assert isinstance(table, StepsPerSecondTable)
    assert table.predict_step_ms(4, 8) == pytest.approx(1.0)
    assert table.predict_step_ms(4, 12) == pytest.approx(1.0)  # between 8 and 16: the value at 8
    assert table.predict_step_ms(4, 16) == pytest.approx(1000 / 950)
    assert table.predict_step_ms(4, 1) == pytest.approx(1.0)  # the first value below the first probe
    assert table.predict_step_ms(4, 96) == pytest.approx(1000 / 480)  # the last value above the last
    assert table.steps_per_sec(4, 64) == pytest.approx(480.0)


def test_sglang_additive_table_parses_and_adds_terms():
    table = parse_cost_table(SGLANG_ADDITIVE)
    assert isinstance(table, AdditiveCostTable)
    # bs 32 is 31/63 of the way along alpha; 288 rows are halfway along theta's last segment.
    assert table.predict_step_ms(32, 288) == pytest.approx((0.002 + 0.001 * 31 / 63 + 0.00225) * 1000)
    rows = torch.tensor([64.0, 512.0])
    assert table.step_seconds(1, rows).tolist() == pytest.approx([0.0025, 0.006])


def test_sglang_additive_table_is_clamped_at_both_ends_as_sglang_reads_it():
    """SGLang's ``_interp_clamped`` returns the end values outside the probes, for alpha at the batch size and
    theta at the rows (``dspark_sps_table.py`` @ 692c5f7d532f129424b57961c262bbd253b411dc)."""
    table = parse_cost_table(SGLANG_ADDITIVE)
    assert table.predict_step_ms(64, 512) == pytest.approx((0.002 + 0.001 + 0.004) * 1000)
    assert table.predict_step_ms(200, 2048) == pytest.approx((0.002 + 0.001 + 0.004) * 1000)  # both clamped


def test_prediction_steps_at_tier_boundaries_and_runs_eager_above_the_largest():
    table = parse_cost_table({**SGLANG_ADDITIVE, "meta": {"tiers": [16, 32, 64]}})
    costs = [table.predict_step_ms(8, rows) for rows in range(9, 17)]
    assert max(costs) == min(costs)  # every row count up to 16 runs the 16-row graph
    assert table.predict_step_ms(8, 17) > table.predict_step_ms(8, 16)
    assert table.predict_step_ms(8, 17) == table.predict_step_ms(8, 32)
    assert table.predict_step_ms(8, 65) < table.predict_step_ms(8, 66)  # eager: raw rows


def test_round_up_to_tier():
    rows = torch.tensor([1.0, 8.0, 9.0, 64.0, 65.0])
    assert round_up_to_tier(rows, (8, 16, 64)).tolist() == [8.0, 8.0, 16.0, 64.0, 65.0]
    assert round_up_to_tier(rows, ()).tolist() == rows.tolist()


@pytest.mark.parametrize("table", [SGLANG_SPS, SGLANG_ADDITIVE])
def test_round_trip_without_meta_keeps_sglang_keys(tmp_path, table):
    path = tmp_path / "t.json"
    save_cost_table(parse_cost_table(table), path)
    assert set(json.loads(path.read_text())) == set(table)
    assert parse_cost_table(json.loads(path.read_text())) == parse_cost_table(table)


def test_round_trip_with_meta(tmp_path):
    meta = {
        "hardware": HW,
        "model": "tiny-v1",
        "tiers": [8, 16],
        "created_at": "2025-01-01T00:00:00Z",
        "version": "cost-3",
    }
    path = write(tmp_path, {**SGLANG_ADDITIVE, "meta": meta})
    table = load_cost_table(path, hardware=HW, model="tiny-v1")
    assert table.meta == CostMeta(
        hardware=HW, model="tiny-v1", tiers=(8, 16), created_at="2025-01-01T00:00:00Z", version="cost-3"
    )
    save_cost_table(table, tmp_path / "again.json")
    assert load_cost_table(tmp_path / "again.json") == table


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"sample_batch_tokens": [8, 8, 16, 32]}, "sample_batch_tokens"),
        ({"sample_batch_tokens": [16, 8, 32, 64]}, "sample_batch_tokens"),
        ({"sample_batch_tokens": [0, 8, 32, 64]}, "sample_batch_tokens[0]"),
        ({"sample_steps_per_sec": [1000.0, 950.0, 500.0]}, "sample_steps_per_sec"),
        ({"sample_steps_per_sec": [1000.0, float("nan"), 500.0, 480.0]}, "sample_steps_per_sec[1]"),
        ({"sample_steps_per_sec": [1000.0, 0.0, 500.0, 480.0]}, "sample_steps_per_sec[1]"),
        ({"max_batch_tokens": 32}, "max_batch_tokens"),
        ({"sample_batch_tokens": "8,16"}, "sample_batch_tokens"),
        ({"extra": 1}, "extra"),
        ({"meta": {"tiers": [16, 8]}}, "meta.tiers"),
        ({"meta": {"hardware": "x86"}}, "meta.hardware"),
        ({"meta": {"colour": "red"}}, "meta.colour"),
    ],
)
def test_bad_sps_tables_fail_naming_the_field(patch, field):
    with pytest.raises(CostTableError, match="^" + re.escape(field)):
        parse_cost_table({**SGLANG_SPS, **patch})


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"alpha_seconds": [0.0, -0.001]}, "alpha_seconds[1]"),
        ({"theta_seconds": [0.0, 0.0005]}, "theta_seconds"),
        ({"m_probes": [1, 64, 64]}, "m_probes"),
        ({"bias_seconds": float("inf")}, "bias_seconds"),
        ({"bias_seconds": True}, "bias_seconds"),
        ({"bias_seconds": 0.0, "theta_seconds": [0.0, 0.0, 0.0], "alpha_seconds": [0.0, 0.0]}, "bias_seconds"),
        # SGLang refuses a table without a positive bias even when alpha and theta price every step.
        ({"bias_seconds": 0.0}, "bias_seconds: expected a finite number > 0, got 0.0"),
    ],
)
def test_bad_additive_tables_fail_naming_the_field(patch, field):
    with pytest.raises(CostTableError, match="^" + re.escape(field)):
        parse_cost_table({**SGLANG_ADDITIVE, **patch})


@pytest.mark.parametrize("missing", ["sample_steps_per_sec", "max_batch_tokens"])
def test_missing_field_is_named(missing):
    table = {k: v for k, v in SGLANG_SPS.items() if k != missing}
    with pytest.raises(CostTableError, match=f"^{missing}: missing"):
        parse_cost_table(table)


def test_layout_must_be_exactly_one():
    with pytest.raises(CostTableError, match="exactly one layout"):
        parse_cost_table({**SGLANG_SPS, **SGLANG_ADDITIVE})
    with pytest.raises(CostTableError, match="exactly one layout"):
        parse_cost_table({"max_batch_tokens": 3})


def test_invalid_json_names_the_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(CostTableError, match="broken.json: not valid JSON"):
        load_cost_table(path)


def test_a_key_given_twice_is_refused_naming_it(tmp_path):
    """The standard decoder keeps the last: an operator reading the file's first ``meta`` would not see the
    table's."""
    path = tmp_path / "twice.json"
    path.write_text('{"meta": {"model": "m1"}, "meta": {"model": "m2"}}')
    with pytest.raises(CostTableError, match="twice.json: not valid JSON .*key 'meta' appears more than once"):
        load_cost_table(path)


def test_fingerprint_mismatch_is_refused_unless_forced(tmp_path):
    path = write(tmp_path, {**SGLANG_SPS, "meta": {"hardware": {**HW, "device": "NVIDIA H200"}, "model": "m1"}})
    with pytest.raises(FingerprintMismatch, match="meta.hardware.device: table has 'NVIDIA H200'"):
        load_cost_table(path, hardware=HW)
    with pytest.raises(FingerprintMismatch, match="meta.model"):
        load_cost_table(path, model="m2")
    assert load_cost_table(path, hardware=HW, model="m2", force=True).meta.model == "m1"
    assert load_cost_table(path, model="m1").meta.model == "m1"


def test_table_without_fingerprint_is_refused_when_one_is_checked():
    table = parse_cost_table(SGLANG_SPS)
    with pytest.raises(FingerprintMismatch, match="meta.hardware: missing"):
        check_fingerprint(table, hardware=HW)
    check_fingerprint(table)  # nothing to check against
    check_fingerprint(table, hardware=HW, force=True)


def test_step_seconds_is_vectorised_and_matches_scalar_predictions():
    table = parse_cost_table({**SGLANG_SPS, "meta": {"tiers": [16, 48]}})
    rows = torch.arange(1, 130, dtype=torch.float64)
    vector = table.step_seconds(8, rows)
    scalar = [table.predict_step_ms(8, int(r)) / 1000 for r in rows]
    assert vector.tolist() == pytest.approx(scalar)
    assert all(math.isfinite(v) and v > 0 for v in vector.tolist())
    # By hand: rows run padded to their tier (16 or 48), beyond the largest eagerly as they are; each step
    # costs the largest probe's at or below the rows run (1,000, 950, 500 and 480 steps/s at 8, 16, 32, 64).
    expected = {1: 1 / 950, 16: 1 / 950, 17: 1 / 500, 48: 1 / 500, 49: 1 / 500, 63: 1 / 500, 64: 1 / 480, 129: 1 / 480}
    assert {r: vector[r - 1].item() for r in expected} == pytest.approx(expected)
