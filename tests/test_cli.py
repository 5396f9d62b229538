"""The command table: every command loads from its layer, help lists them all, and help stays light."""

from __future__ import annotations

import subprocess
import sys

import click
import duckdb
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


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["simulate", "--policy", "POLICY", "--scenario", "latency", "--regression", "nan"], "'nan' is not a finite"),
        (["prune", "--db", "DB", "--older-than-days", "inf"], "'inf' is not a finite"),
        (["ingest", "--db", "DB", "--batch-lines", "0"], "--batch-lines"),
        (["bench", "e2e", "--batches", "8,0"], "'0' in '8,0' is not an integer >= 1"),
        (["report", "--db", "TEXT"], "not a valid DuckDB database file"),
        (["backtest", "--db", "BLANK", "--policy", "POLICY"], "an empty database, not a sparkgate store"),
        (["export", "--db", "DB", "--out", "TEXT/sub"], "TEXT"),
    ],
)
def test_bad_input_is_one_line_naming_it_and_no_traceback(tmp_path, argv, named):
    from sparkgate.collectors.store import Store
    from sparkgate.policies.rollout import DEFAULT_PATH

    Store(tmp_path / "s.duckdb").close()
    duckdb.connect(str(tmp_path / "blank.duckdb")).close()
    blank = (tmp_path / "blank.duckdb").read_bytes()
    text = tmp_path / "notes.txt"
    text.write_text("not a database\n")
    paths = {"POLICY": str(DEFAULT_PATH), "DB": str(tmp_path / "s.duckdb"), "TEXT": str(text),
             "BLANK": str(tmp_path / "blank.duckdb")}  # fmt: skip
    argv = [paths.get(a, a).replace("TEXT", str(text)) for a in argv]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code in (1, 2) and named.replace("TEXT", str(text)) in result.output, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert text.read_text() == "not a database\n" and (tmp_path / "blank.duckdb").read_bytes() == blank


# Numbers an option may take at any finite value (each with why); every other int or float option of every
# command carries a range, so a value the code cannot use is refused by name before any work starts.
UNBOUNDED = {
    ("replica", "offset"): "where in the load cycle the replica starts, in cycles: any number is a phase",
}


def _numeric_options(name: str, command: click.Command):
    if isinstance(command, click.Group):
        for sub_name, sub in command.commands.items():
            yield from _numeric_options(f"{name} {sub_name}", sub)
        return
    for param in command.params:
        if isinstance(param.type, click.types.IntParamType | click.types.FloatParamType):
            yield name, param


def _bounded(kind: click.ParamType) -> bool:
    return isinstance(kind, click.IntRange | click.FloatRange) and (kind.min is not None or kind.max is not None)


def test_every_number_on_the_command_line_has_a_range_or_a_reason():
    commands = [(n, main.get_command(click.Context(main), n)) for n in COMMANDS if n != "bench"]
    commands += [(f"bench {n}", entry.load()[n]) for n, entry in BENCHMARKS.items()]
    unranged = [
        f"{name} --{param.name}"
        for command_name, command in commands
        for name, param in _numeric_options(command_name, command)
        if (name, param.name) not in UNBOUNDED and not _bounded(param.type)
    ]
    assert unranged == []
