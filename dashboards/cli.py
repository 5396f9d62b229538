"""``sparkgate dashboard``: start the Streamlit app on one of the read-only sources.

Its inputs are checked before Streamlit starts (a server that started would report them only in the
browser, or not at all): the policy loads, a ``--db`` that exists is a sparkgate store, a ``--controller``
is a URL, and the address can be listened on. A ``--db`` or ``--snapshot-dir`` that does not exist yet is
let through when something could still create it: the pages say what to run, and read it once it exists.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import duckdb

from sparkgate.collectors.migrations import not_a_store
from sparkgate.controller.service import is_loopback, listen
from sparkgate.policies.cli_types import HttpUrl
from sparkgate.policies.policy_cli import policy_option
from sparkgate.policies.rollout import DEFAULT_PATH

APP = Path(__file__).with_name("app.py")
# Bytes 8 to 12 of every DuckDB database file.
DUCKDB_MAGIC = b"DUCK"


def streamlit_command(app_args: list[str], host: str = "127.0.0.1", port: int = 8501) -> list[str]:
    """The ``streamlit run`` command line, run by ``dashboards.server`` (the page modules imported before it
    listens): headless, no usage statistics, bound to ``host``."""
    return [
        sys.executable,
        "-m",
        "sparkgate.dashboards.server",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--",
        *app_args,
    ]


def check_store(path: str) -> None:
    """Refuse a ``--db`` the pages could never read: a path in no folder, a file that is not DuckDB, or a DuckDB
    file without sparkgate's tables. The file is opened read-only, so it is not changed; one a writer holds
    locked is let through (the pages read a copy of it), without copying a large store once more here."""
    file = Path(path)
    if not file.exists():
        if not file.parent.is_dir():
            raise click.BadParameter(f"{path!r}: no folder {str(file.parent)!r} to hold it", param_hint=["--db"])
        return
    with file.open("rb") as head:
        if head.read(12)[8:] != DUCKDB_MAGIC:
            raise click.BadParameter(f"{path!r} is not a DuckDB file", param_hint=["--db"])
    try:
        with duckdb.connect(str(file), read_only=True) as con:
            problem = not_a_store(con, create=False)
    except duckdb.Error as exc:
        if isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower():
            return  # a writer (``serve``) holds it: the pages read their copy of it
        raise click.BadParameter(f"{path!r} cannot be read ({str(exc).splitlines()[0]})", param_hint=["--db"]) from None
    if problem:
        raise click.BadParameter(f"{path!r}: {problem}", param_hint=["--db"])


@click.command()
@click.option("--db", type=click.Path(dir_okay=False), help="DuckDB file (read from a private copy).")
@click.option(
    "--snapshot-dir",
    type=click.Path(file_okay=False),
    help="Parquet snapshots published by `serve --snapshot-dir` or `collect --snapshot-dir`.",
)
@click.option("--controller", "url", type=HttpUrl(),
              help="A running controller's base URL (state, ledger and report only).")  # fmt: skip
@click.option(
    "--policy",
    "policy_path",
    default=str(DEFAULT_PATH),
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Rollout policy YAML (ladder and gate thresholds).",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8501, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--behind-auth-proxy",
    is_flag=True,
    help="Listen beyond loopback: an authenticating reverse proxy stands in front (Streamlit has no auth).",
)
def dashboard(db, snapshot_dir, url, policy_path, host, port, behind_auth_proxy):
    """Operator dashboards: rollout, calibration, acceptance, tiers and cost, fleet. Read-only."""
    if not is_loopback(host) and not behind_auth_proxy:
        raise click.UsageError(
            f"--host {host}: the dashboards have no authentication of their own; listen on loopback and put an "
            "authenticating reverse proxy in front (then pass --behind-auth-proxy)"
        )
    given = [
        (flag, value)
        for flag, value in (("--db", db), ("--snapshot-dir", snapshot_dir), ("--controller", url))
        if value
    ]
    if len(given) != 1:
        raise click.UsageError("give exactly one of --db FILE, --snapshot-dir DIR or --controller URL")
    ((flag, value),) = given
    policy_option(policy_path)
    if db:
        check_store(db)
    for sock in listen(host, port):  # Streamlit would say so only after its start; it binds again at once
        sock.close()
    command = streamlit_command([flag, value, "--policy", policy_path], host, port)
    click.echo(f"sparkgate dashboard on http://{host}:{port} ({flag} {value})", err=True)
    os.execv(command[0], command)
