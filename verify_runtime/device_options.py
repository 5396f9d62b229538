"""``--device`` and ``--graphs/--no-graphs``, shared by the commands that time the runtime.

CUDA graphs are on by default on CUDA (replicas serve with them, so timings
should too) and refused elsewhere with a usage error instead of a traceback.
"""

from __future__ import annotations

import click
import torch


def device_options(fn):
    fn = click.option(
        "--graphs/--no-graphs",
        default=None,
        help="Replay CUDA-graph tiers, as a CUDA replica serves (default: on for CUDA).",
    )(fn)
    return click.option("--device", default="cpu", show_default=True)(fn)


def resolve_graphs(device: str, graphs: bool | None) -> bool:
    """Whether to capture graph tiers on ``device`` given the flag (None: the default)."""
    try:
        parsed = torch.device(device)
    except RuntimeError as exc:
        raise click.BadParameter(str(exc), param_hint=["--device"]) from None
    cuda = parsed.type == "cuda"
    if cuda and (parsed.index or 0) >= torch.cuda.device_count():  # torch would assert deep in a first kernel
        raise click.BadParameter(
            f"{device}: this machine has {torch.cuda.device_count()} CUDA device(s) torch can use",
            param_hint=["--device"],
        )
    if graphs and not cuda:
        raise click.BadParameter(f"CUDA-graph tiers need a CUDA device, got --device {device}", param_hint=["--graphs"])
    return cuda if graphs is None else graphs
