"""``sparkgate calibrate``: STS fitted from full-block records only; a malformed record is named."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.policies.calibration import STS
from sparkgate.verify_runtime.calibrate_cli import calibrate, read_labels

pytestmark = pytest.mark.usefixtures("one_thread")


def test_calibrate_fits_from_full_block_records_only(tmp_path, evaluated):
    _, records, _ = evaluated
    lines = [rec.to_dict() for recs in records.values() for rec in recs]
    lines[0]["requests"][0]["mode"] = "compact"  # censored traffic is left out
    path = tmp_path / "records.ndjson"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    confidence, labels, drafter = read_labels([path])
    assert drafter == lines[0]["drafter_version"]
    rows = sum(len(line["requests"]) for line in lines)
    assert confidence.shape == labels.shape == (rows - 1, 7)
    assert (labels.diff(dim=1) <= 0).all()

    result = CliRunner().invoke(calibrate, ["--records", str(path), "--out", str(tmp_path / "sts.json")])
    assert result.exit_code == 0, result.output
    sts = STS.load(tmp_path / "sts.json")
    assert sts.gamma == 7 and sts.num_samples == rows - 1 and json.loads(result.output)["version"] == sts.version
    assert sts.drafter == drafter  # the file names the drafter it calibrates

    lines[1]["requests"][0]["confidence"] = [0.5] * 3
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = CliRunner().invoke(calibrate, ["--records", str(path), "--out", str(tmp_path / "x.json")])
    assert result.exit_code != 0 and "records.ndjson:2: requests[0].confidence has 3 values, gamma=7" in result.output


def test_records_calibrated_by_their_server_are_refused(tmp_path):
    # What the SGLang poller stores: the server applied its STS temperatures before dumping confidence.
    from sparkgate.collectors.schema import CALIBRATED_AT_SOURCE
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire

    parsed = from_wire(synthetic_wire(2, 4, 7, "sg/dp0", seed=1, ts=1.75e9))
    lines = parsed.wire.to_pylist()
    lines[1]["sts_version"] = CALIBRATED_AT_SOURCE
    path = tmp_path / "sglang.ndjson"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = CliRunner().invoke(calibrate, ["--records", str(path), "--out", str(tmp_path / "sts.json")])
    assert result.exit_code == 1
    assert f"sglang.ndjson:2: sts_version={CALIBRATED_AT_SOURCE}: these confidences were already calibrated" in (
        result.output
    )
    assert not (tmp_path / "sts.json").exists()


def test_one_sts_file_calibrates_one_drafter(tmp_path, evaluated):
    _, records, _ = evaluated
    lines = [rec.to_dict() for recs in records.values() for rec in recs]
    lines[-1]["drafter_version"] = "another-drafter"
    path = tmp_path / "mixed.ndjson"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    result = CliRunner().invoke(calibrate, ["--records", str(path), "--out", str(tmp_path / "sts.json")])
    assert result.exit_code == 1
    assert f"mixed.ndjson:{len(lines)}: drafter_version=another-drafter" in result.output
