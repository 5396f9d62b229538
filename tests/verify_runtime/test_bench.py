"""``sparkgate bench verify``: the verify benchmark's fields, and bad input refused before timing."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.verify_runtime.verify_profile import CATEGORIES, OTHER, category
from tests.verify_runtime.refusals import refused


def test_bench_verify_runs_and_reports_its_fields():
    out = CliRunner().invoke(
        main,
        [
            "bench",
            "verify",
            "--batch",
            "4",
            "--gamma",
            "3",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--prompt-len",
            "8",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    result = json.loads(out.output.strip().splitlines()[-1])
    assert result["peak_rss_mb"] > 0  # every benchmark reports its memory beside its timings
    for key in (
        "batch",
        "gamma",
        "rows_static",
        "rows_compact",
        "tier_rows_compact",
        "static_ms",
        "compact_ms",
        "time_ratio",
        "row_ratio",
    ):
        assert key in result
    assert result["rows_static"] == 16 and result["batch"] == 4
    assert result["tier_rows_compact"] >= result["rows_compact"]
    v = result["verdict"]
    assert v["measure"] == "cpu" and v["rounds"] == 2 and v["met"] is None  # two steps give no interval
    assert v["target"] == round(1.15 * result["row_ratio"] + 0.03, 4)


def small_bench(steps: int, flag: str) -> dict:
    """``bench verify --FLAG`` on a small batch: its JSON."""
    args = ["bench", "verify", "--batch", "8", "--gamma", "3", "--steps", str(steps), "--warmup", "1", flag, "--json"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    return json.loads(out.output.strip().splitlines()[-1])


def test_the_profile_puts_every_operator_in_a_category_for_both_arms():
    prof = small_bench(3, "--profile")["profile"]
    categories = [*CATEGORIES, OTHER, "op_calls"]
    assert list(prof["static_ms"]) == list(prof["compact_ms"]) == list(prof["compact_over_static"]) == categories
    for arm in ("static_ms", "compact_ms"):  # times only as present and positive: no timing thresholds here
        assert prof[arm]["matmul"] > 0 and prof[arm]["attention"] > 0 and prof[arm]["op_calls"] > 0


def test_operators_fall_into_their_categories():
    assert [category(op) for op in ("aten::mm", "aten::index_select", "aten::add", "aten::softmax")] == [
        "matmul",
        "gather and scatter",
        OTHER,
        "attention",
    ]


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--gamma", "3", "--mean-window", "5"], "--mean-window", "5.0 is more than --gamma 3"),
        (["--prompt-len", "510"], "--prompt-len", "--prompt-len 510 and a block of --gamma 7 + 1: 518 positions"),
        (["--steps", "0"], "--steps", "0 is not in the range x>=1"),
        (["--threads", "0"], "--threads", "0 is not in the range x>=1"),
    ],
)
def test_bench_verify_refuses_bad_input_before_timing(args, option, named):
    output = refused(["bench", "verify", *args])
    assert f"'{option}'" in output and named in output


def test_the_overhead_twin_times_every_step_beside_the_real_one():
    over = small_bench(12, "--overhead")["overhead"]
    assert over["twin_dim"] == 16
    for key in ("twin_static_ms", "twin_compact_ms", "fixed_share_static", "fixed_share_compact"):
        assert over[key]["rounds"] == 12 and over[key]["median"] > 0
    assert over["compute_ratio"]["rounds"] <= 12


def test_the_overhead_twin_is_refused_off_the_cpu():
    out = CliRunner().invoke(main, ["bench", "verify", "--overhead", "--device", "meta"])
    assert out.exit_code != 0 and "--overhead" in out.output and "meta" in out.output
