"""``sparkgate dashboard``: start the Streamlit app on one of the read-only sources."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from sparkgate.controller.service import is_loopback
from sparkgate.policies.rollout import DEFAULT_PATH

APP = Path(__file__).with_name("app.py")


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


@click.command()
@click.option("--db", type=click.Path(dir_okay=False), help="DuckDB file (read from a private copy).")
@click.option(
    "--snapshot-dir",
    type=click.Path(file_okay=False),
    help="Parquet snapshots published by `serve --snapshot-dir` or `collect --snapshot-dir`.",
)
@click.option("--controller", "url", help="A running controller's base URL (state, ledger and report only).")
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
    command = streamlit_command([flag, value, "--policy", policy_path], host, port)
    click.echo(f"sparkgate dashboard on http://{host}:{port} ({flag} {value})", err=True)
    os.execv(command[0], command)
