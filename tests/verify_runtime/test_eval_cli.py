"""``sparkgate eval drafter`` on the shipped models: the report, its figures and the step records it writes."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.schema import StepRecord
from sparkgate.collectors.validate import validate

pytestmark = pytest.mark.usefixtures("one_thread")


def test_eval_drafter_writes_the_report_figures_and_valid_records(tmp_path):
    out, records = tmp_path / "eval", tmp_path / "records" / "drafter.ndjson"
    args = ["eval", "drafter", "--prompts", "2", "--prompt-len", "16", "--max-new-tokens", "8", "--batch", "2"]
    result = CliRunner().invoke(main, [*args, "--out", str(out), "--records-out", str(records), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report == json.loads((out / "eval_drafter.json").read_text())
    assert set(report["drafters"]) == {"sequential", "parallel"} and set(report["domains"]) == {"code", "prose"}
    assert (report["split"], report["prompts_per_domain"], report["gamma"]) == ("test", 2, 7)
    for name in ("reliability", "acceptance"):
        assert report["figures"][name] == str(out / f"{name}.png") and (out / f"{name}.png").stat().st_size > 0
    assert report["records"] == str(records)
    steps = [StepRecord.from_dict(json.loads(line)) for line in records.read_text().splitlines()]
    assert steps and all(validate(step) == [] and step.gamma == 7 for step in steps)
    assert {row.mode for step in steps for row in step.requests} == {"static"}  # full blocks, for calibration
