"""``sparkgate profile``: a cost table and its plot written, a tier grid taken, bad options refused."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from tests.verify_runtime.refusals import refused


def test_profile_command_writes_table_and_plot(tmp_path):
    out = tmp_path / "table.json"
    res = CliRunner().invoke(
        main,
        ["profile", "--out", str(out), "--batch-sizes", "1,2", "--fractions", "0,1", "--repeats", "1", "--gamma", "3"],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["samples"] == 4 and (tmp_path / "table.png").stat().st_size > 0
    table = json.loads(out.read_text())
    assert {"bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds", "meta"} <= set(table)


def test_profile_command_rejects_bad_fractions_and_contexts(tmp_path):
    res = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "t.json"), "--fractions", "0,1.5"])
    assert res.exit_code == 2 and "'--fractions': 1.5 is not in the range 0<=x<=1" in res.output
    res = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "t.json"), "--context", "500"])
    assert res.exit_code == 2 and "--context 500" in res.output and "needs 556 positions" in res.output
    assert not (tmp_path / "t.json").exists()


def test_profile_command_takes_a_tier_grid(tmp_path):
    out = tmp_path / "table.json"
    res = CliRunner().invoke(
        main,
        [
            "profile",
            "--out",
            str(out),
            "--batch-sizes",
            "2",
            "--fractions",
            "0,1",
            "--repeats",
            "1",
            "--gamma",
            "3",
            "--tiers",
            "4,16",
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["meta"]["tiers"] == [4, 16]
    bad = CliRunner().invoke(main, ["profile", "--out", str(out), "--tiers", "16,8"])
    assert bad.exit_code != 0 and "strictly increasing" in bad.output


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--gamma", "9"], "--gamma", "9 is beyond the drafter's max_gamma"),
        (["--threads", "0"], "--threads", "0 is not in the range x>=1"),
        (["--fractions", "0,nan"], "--fractions", "'nan' is not a finite number"),
        (["--fractions", "0,a"], "--fractions", "'a' is not a valid number"),
        (["--plot", "FILE/p.png"], "--plot", "is not a directory"),
        (["--out", "FILE/t.json"], "--out", "is not a directory"),
    ],
)
def test_profile_refuses_bad_input_and_unwritable_outputs_before_measuring(tmp_path, args, option, named):
    (tmp_path / "file").write_text("not a directory")
    args = [a.replace("FILE", str(tmp_path / "file")) for a in args]
    output = refused(["profile", "--out", str(tmp_path / "t.json"), *args])
    assert f"'{option}'" in output and named in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
