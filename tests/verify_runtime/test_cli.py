"""``sparkgate generate``: one prompt through one verify mode."""

from click.testing import CliRunner

from sparkgate.cli import main


def test_generate_prints_a_continuation():
    out = CliRunner().invoke(main, ["generate", "--prompt", "def f(x):", "--max-new-tokens", "5", "--mode", "compact"])
    assert out.exit_code == 0, out.output
