"""The command table: every command loads from its layer, help lists them all, and help stays light."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from sparkgate.cli import BENCHMARKS, COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_loads(name):
    command = main.get_command(click.Context(main), name)
    assert isinstance(command, click.Command)
    assert CliRunner().invoke(main, [name, "--help"]).exit_code == 0


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_loads(name):
    assert CliRunner().invoke(main, ["bench", name, "--help"]).exit_code == 0


def test_help_lists_every_command_with_its_line():
    output = CliRunner().invoke(main, ["--help"]).output
    for name, entry in COMMANDS.items():
        assert name in output and entry.help.split()[0] in output


def test_an_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["deploy"])
    assert result.exit_code == 2 and "No such command 'deploy'" in result.output


def test_help_and_the_controller_commands_do_not_import_torch():
    code = (
        "import sys; from click.testing import CliRunner; from sparkgate.cli import main; "
        "CliRunner().invoke(main, ['--help']); CliRunner().invoke(main, ['status', '--help']); "
        "CliRunner().invoke(main, ['policy', 'schema']); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_help_lists_the_runtime_commands():
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0
    for name in ("demo", "generate", "bench"):
        assert name in out.output
