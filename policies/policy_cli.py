"""``sparkgate policy schema | check FILE``: the rollout policy file's JSON Schema, and a validator."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sparkgate.policies.rollout import (
    RolloutPolicy,
    RolloutPolicyError,
    json_schema,
    load_rollout_policy,
    problems,
    read_yaml,
)


def policy_option(path: str, param_hint: str = "--policy") -> RolloutPolicy:
    """The policy file a command was given, loaded before the command opens or starts anything; a usage
    error naming the option and the file's problems otherwise."""
    try:
        return load_rollout_policy(path)
    except RolloutPolicyError as exc:
        raise click.BadParameter(str(exc), param_hint=[param_hint]) from None


@click.group()
def policy() -> None:
    """The rollout policy file: print its JSON Schema, or check a file."""


@policy.command()
def schema() -> None:
    """Print the policy file's JSON Schema (point an editor's YAML support at it)."""
    click.echo(json.dumps(json_schema(), indent=2))


@policy.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def check(path: Path) -> None:
    """Validate a policy file: exit 0 when valid, else name every problem and exit 1."""
    try:
        found = [f"{path}: {line}" for line in problems(read_yaml(path))]
    except RolloutPolicyError as exc:  # not YAML, or not text: the message names the file already
        found = exc.problems
    if found:
        for line in found:
            click.echo(line, err=True)
        raise SystemExit(1)
    click.echo(f"{path}: ok")
