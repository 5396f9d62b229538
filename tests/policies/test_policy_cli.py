"""``sparkgate policy schema | check``: the schema editors read, and a check that names every problem."""

from __future__ import annotations

import json

import jsonschema
import yaml
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.policies.rollout import DEFAULT_PATH


def test_schema_is_valid_json_schema_that_accepts_the_shipped_policy():
    result = CliRunner().invoke(main, ["policy", "schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(DEFAULT_PATH.read_text()), schema)
    gate = schema["$defs"]["Gate"]
    assert gate["properties"]["direction"]["enum"] == ["at_most", "at_least"]
    assert set(gate["required"]) == {"metric", "threshold", "direction"}
    assert schema["additionalProperties"] is False  # an editor flags a misspelt key too


def test_check_passes_a_good_file(tmp_path):
    result = CliRunner().invoke(main, ["policy", "check", str(DEFAULT_PATH)])
    assert result.exit_code == 0 and result.output.strip().endswith(": ok")


def test_check_names_every_problem_at_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "observe_fraction: 2\ncolour: red\ngates:\n"
        "  - {metric: tier_miss_rate, threshold: high, direction: at_most}\n"
        "  - {metric: tier_miss_rate, threshold: 0.1, direction: below}\n"
    )
    result = CliRunner().invoke(main, ["policy", "check", str(bad)])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [
        f"{bad}: gates[0].threshold: expected a number, got 'high'",
        f"{bad}: gates[1].direction: expected one of at_most, at_least, got 'below'",
        f"{bad}: colour: unknown key (known: gamma, phases, canary_steps, observe_fraction, consecutive_passes, "
        "failure_limit, failure_window_s, error_limit, evaluation_interval_s, progress_deadline_s, "
        "on_progress_deadline, max_lookback_s, min_dwell_s, stale_after_s, fallback_window, gates, notify, "
        "comparison, adaptive)",
    ]


def test_check_reports_the_range_problems_once_the_types_are_right(tmp_path):
    # Range checks read the whole file, so they run once every value has the right type.
    bad = tmp_path / "ranges.yaml"
    bad.write_text("observe_fraction: 2\nconsecutive_passes: 0\nfallback_window: 9\n")
    result = CliRunner().invoke(main, ["policy", "check", str(bad)])
    assert result.exit_code == 1
    assert [line.split(": ", 2)[1] for line in result.output.strip().splitlines()] == [
        "observe_fraction",
        "consecutive_passes",
        "fallback_window",
    ]


def test_check_names_a_file_that_is_not_yaml(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("gates: [\n")
    result = CliRunner().invoke(main, ["policy", "check", str(broken)])
    assert result.exit_code == 1 and "not valid YAML" in result.output
    missing = CliRunner().invoke(main, ["policy", "check", str(tmp_path / "absent.yaml")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
