"""``sparkgate profile``: measure step time here and fit the additive cost table (JSON + PNG).

The command lives apart from ``profiler`` so the measurement code does not import
``defaults`` (which itself profiles when no shipped table fits): imports run one way.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from sparkgate.policies.cli_types import CountList, FloatList
from sparkgate.policies.cost_model import save_cost_table
from sparkgate.policies.outputs import output_path, written_whole

from .cli_checks import check_gamma
from .defaults import default_drafter, default_target
from .device_options import device_options, resolve_graphs
from .profiler import (
    DEFAULT_BATCHES,
    DEFAULT_CONTEXT,
    DEFAULT_FRACTIONS,
    plot_profile,
    profile_model,
)
from .tiers import DEFAULT_TIERS, TierGrid, parse_tiers


@click.command()
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="Cost-table JSON to write.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="PNG (default: beside --out).")
@click.option("--batch-sizes", default=",".join(map(str, DEFAULT_BATCHES)), show_default=True, type=CountList())
@click.option(
    "--fractions",
    default=",".join(map(str, DEFAULT_FRACTIONS)),
    show_default=True,
    type=FloatList(0, 1),
    help="Budget fractions of the B×γ drafts to force.",
)
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1))
@click.option("--repeats", default=5, show_default=True, type=click.IntRange(min=1),
              help="Recorded steps per shape (the median is kept).")  # fmt: skip
@click.option(
    "--context",
    default=DEFAULT_CONTEXT,
    show_default=True,
    type=click.IntRange(min=1),
    help="Prompt tokens per profiled request (attention cost grows with context).",
)
@device_options
@click.option(
    "--threads",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="torch intra-op threads; profile with the threading replicas serve with.",
)
@click.option(
    "--tiers",
    default=",".join(map(str, DEFAULT_TIERS)),
    show_default=True,
    help="Graph-tier row counts; recorded in the table so predictions step at tier boundaries.",
)
def profile(out_path, plot_path, batch_sizes, fractions, gamma, repeats, context, device, graphs, threads, tiers):
    """Measure decode step time over batch sizes × verify budgets and fit the additive cost table."""
    output_path(out_path, "--out")
    plot_path = plot_path or str(Path(out_path).with_suffix(".png"))
    output_path(plot_path, "--plot")
    torch.set_num_threads(threads)
    graphs = resolve_graphs(device, graphs)
    try:
        grid = TierGrid(parse_tiers(tiers))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tiers") from None
    target = default_target().to(device)
    drafter = default_drafter(target)
    check_gamma(gamma, drafter)
    need = context + (repeats + 2) * (gamma + 1)  # prompt, the timed steps' tokens, one block of headroom
    if need > target.args.max_seq_len:
        raise click.BadParameter(
            f"--context {context} with --repeats {repeats} and --gamma {gamma} needs {need} "
            f"positions; the model holds {target.args.max_seq_len}",
            param_hint="--context",
        )
    result = profile_model(
        target,
        drafter,
        batches=batch_sizes,
        fractions=fractions,
        gamma=gamma,
        repeats=repeats,
        context=context,
        grid=grid,
        graphs=graphs,
    )
    with written_whole(out_path) as partial:
        save_cost_table(result.table, partial)
    with written_whole(plot_path) as partial:
        plot_profile(result, partial)
    click.echo(
        json.dumps(
            {
                "cost_table": out_path,
                "plot": plot_path,
                "samples": len(result.samples),
                "median_rel_error": round(result.median_rel_error, 4),
                "version": result.table.meta.version,
            }
        )
    )
