"""``sparkgate calibrate``: STS fitted from full-block records only; a malformed record is named."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.policies.calibration import STS
from sparkgate.verify_runtime.calibrate_cli import calibrate, read_labels
from tests.verify_runtime.refusals import refused

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


def synthetic_records(tmp_path, change=None):
    """Two synthetic step records (full-block rows among them) in an NDJSON file, ``change`` applied."""
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire

    lines = from_wire(synthetic_wire(2, 4, 7, "r0", seed=1, ts=1.75e9)).wire.to_pylist()
    if change is not None:
        change(lines)
    path = tmp_path / "records.ndjson"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


@pytest.mark.parametrize("value", [float("nan"), 1.5, -0.1, "0.5", None])
def test_a_confidence_that_is_no_probability_is_named_and_nothing_is_written(tmp_path, value):
    def corrupt(lines):
        lines[1]["requests"][0]["confidence"][3] = value  # row 0 of the second record is static

    records = synthetic_records(tmp_path, corrupt)
    output = refused(["calibrate", "--records", str(records), "--out", str(tmp_path / "sts.json")], exit_code=1)
    assert f"records.ndjson:2: requests[0].confidence[3]={value!r} is not a finite probability in [0, 1]" in output
    assert not (tmp_path / "sts.json").exists()


def test_an_output_path_that_cannot_be_written_is_refused_before_the_records_are_read(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    output = refused(
        ["calibrate", "--records", str(synthetic_records(tmp_path)), "--out", str(tmp_path / "file/s.json")]
    )
    assert "'--out'" in output and f"{tmp_path / 'file'} is not a directory" in output


def test_calibrate_writes_the_sts_file_whole_and_only_it(tmp_path):
    result = CliRunner().invoke(
        calibrate, ["--records", str(synthetic_records(tmp_path)), "--out", str(tmp_path / "sts.json")]
    )
    assert result.exit_code == 0, result.output
    assert STS.load(tmp_path / "sts.json").gamma == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records.ndjson", "sts.json"]  # no partial file left
