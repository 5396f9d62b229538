"""``sparkgate eval drafter`` on the shipped models: the report, its figures and the step records it writes,
and the bad input it refuses before evaluating."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.schema import StepRecord
from sparkgate.collectors.validate import validate
from tests.verify_runtime.refusals import refused

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


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--gamma", "9"], "--gamma", "9 is beyond the drafter's max_gamma"),
        (["--gamma", "5"], "--gamma", "calibrates gamma=7: give --sts fitted at this gamma"),
        (["--prompt-len", "8"], "--prompt-len", "8 is not longer than the window of the --drafter drafter"),
        (["--max-new-tokens", "600"], "--max-new-tokens", "--max-new-tokens 600 and --gamma 7: 622 positions"),
        (["--prompts", "100000"], "--prompts", "domain 'prose' holds"),
        (["--records-out", "FILE/records.ndjson"], "--records-out", "is not a directory"),
        (["--out", "FILE/eval"], "--out", "is not a directory"),
        (["--target", "FILE"], "--target", "is not a target checkpoint"),
    ],
)
def test_eval_drafter_refuses_bad_input_before_evaluating_and_writes_nothing(tmp_path, args, option, named):
    (tmp_path / "file").write_text("not a directory, nor a checkpoint")
    args = [a.replace("FILE", str(tmp_path / "file")) for a in args]
    output = refused(["eval", "drafter", "--out", str(tmp_path / "eval"), "--prompt-len", "16", *args])
    assert f"'{option}'" in output and named in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
