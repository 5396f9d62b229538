"""A command driven through the console script with bad input, and what every refusal must look like."""

from __future__ import annotations

from click.testing import CliRunner

from sparkgate.cli import main


def refused(args: list[str], exit_code: int = 2) -> str:
    """The output of ``sparkgate ARGS``, asserted to be a refusal: ``exit_code`` (2: a usage error, 1: a
    ClickException), raised as click's exit rather than an exception escaping, and no traceback."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output, result.output
    return result.output
