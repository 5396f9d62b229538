"""``sparkgate generate``: one prompt through one verify mode."""

import json

import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.verify_runtime.cli import decode, encode
from sparkgate.verify_runtime.defaults import default_target
from tests.verify_runtime.reference import greedy_decode
from tests.verify_runtime.refusals import refused


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_generate_prints_the_targets_greedy_continuation(mode):
    # Greedy speculative decoding is lossless: any verify mode prints what the target alone decodes.
    prompt = "def f(x):"
    out = CliRunner().invoke(main, ["generate", "--prompt", prompt, "--max-new-tokens", "5", "--mode", mode])
    assert out.exit_code == 0, out.output
    expected = decode(greedy_decode(default_target(0), encode(prompt), 5))
    assert out.stdout == expected + "\n"
    summary = json.loads(out.stderr.strip().splitlines()[-1])
    # Static verifies the whole block (γ 7), compact the fixed window (3); the steps commit at least the output.
    assert summary["mean_window"] == {"static": 7.0, "compact": 3.0}[mode] and summary["committed_tokens"] >= 5


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--prompt", ""], "--prompt", "'' is empty"),
        (["--gamma", "0"], "--gamma", "0 is not in the range x>=1"),
        (["--gamma", "9"], "--gamma", "9 is beyond the drafter's max_gamma"),
        (["--window", "-1"], "--window", "-1 is not in the range x>=0"),
        (["--max-new-tokens", "0"], "--max-new-tokens", "0 is not in the range x>=1"),
        (["--max-new-tokens", "600"], "--max-new-tokens", "--max-new-tokens 600 and --gamma 7: 608 positions"),
        (["--temperature", "-1"], "--temperature", "-1.0 is not in the range x>=0"),
        (["--seed", "-1"], "--seed", "-1 is not in the range 0<=x<=4294967295"),
    ],
)
def test_generate_refuses_bad_input_before_decoding(args, option, named):
    output = refused(["generate", "--prompt", "hi", *args])
    assert f"'{option}'" in output and named in output
