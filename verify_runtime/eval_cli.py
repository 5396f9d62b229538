"""``sparkgate eval drafter``: offline evaluation of the shipped (or given) drafter."""

from __future__ import annotations

import json
from pathlib import Path

import click

from sparkgate.policies.outputs import output_path, written_whole

from .cli_checks import check_gamma, check_positions, check_reads, given_target, load_given


@click.group("eval")
def evaluate() -> None:
    """Offline evaluations."""


@evaluate.command("drafter")
@click.option("--split", type=click.Choice(["validation", "calibration", "test"]), default="test", show_default=True)
@click.option("--prompts", default=96, show_default=True, type=click.IntRange(min=1), help="Prompts per domain.")
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1))
@click.option("--batch", default=32, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--target",
    "target_path",
    type=click.Path(dir_okay=False, exists=True),
    help="Target checkpoint (default: shipped).",
)
@click.option(
    "--drafter",
    "drafter_path",
    type=click.Path(dir_okay=False, exists=True),
    help="Drafter checkpoint (default: shipped).",
)
@click.option(
    "--ablation",
    "ablation_path",
    type=click.Path(dir_okay=False, exists=True),
    help="Pure-parallel drafter to compare against (default: shipped drafter_parallel).",
)
@click.option(
    "--sts", "sts_path", type=click.Path(dir_okay=False, exists=True), help="STS file (default: shipped, if any)."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="runs/eval",
    show_default=True,
    help="Where the JSON and the PNGs go.",
)
@click.option(
    "--records-out",
    type=click.Path(dir_okay=False),
    help="Also write the drafter's step records (NDJSON), e.g. to fit STS with `sparkgate calibrate`.",
)
@click.option("--threads", default=0, type=click.IntRange(min=0), help="torch CPU threads (0: torch's default).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def drafter(
    split,
    prompts,
    prompt_len,
    max_new_tokens,
    gamma,
    batch,
    target_path,
    drafter_path,
    ablation_path,
    sts_path,
    out_dir,
    records_out,
    threads,
    as_json,
):
    """Acceptance by depth, sequential-head ablation, draft cost and calibration (before/after STS)."""
    import torch

    from sparkgate.policies.calibration import STS

    from .admission import positions_needed
    from .block_drafter import BlockDrafter, load_drafter
    from .corpus import DOMAINS, stdlib_corpus
    from .eval_plots import acceptance_figure, reliability_figure
    from .evaluation import Blocks, EvalConfig
    from .evaluation import evaluate as run_evaluation
    from .shipped import ASSETS, FILES

    out = output_path(out_dir, "--out", directory=True)
    if records_out:
        output_path(records_out, "--records-out")
    if threads:
        torch.set_num_threads(threads)
    target = given_target(target_path)
    drafters = {}
    for name, path, option in (
        ("sequential", drafter_path or ASSETS / FILES["drafter"], "--drafter"),
        ("parallel", ablation_path or ASSETS / FILES["drafter_parallel"], "--ablation"),
    ):
        if Path(path).exists():
            net = load_given(lambda p: load_drafter(p)[0], str(path), "drafter", option)
            check_reads(net, target, option)
            check_gamma(gamma, net)
            # The draft latency is timed on prompts that fill the drafter's window of target hidden states.
            if prompt_len <= net.args.window:
                raise click.BadParameter(
                    f"{prompt_len} is not longer than the window of the {option} drafter "
                    f"({net.args.window} target hidden states)",
                    param_hint=["--prompt-len"],
                )
            drafters[name] = BlockDrafter(net)
    if "sequential" not in drafters:
        raise click.UsageError(f"no drafter at {drafter_path or ASSETS / FILES['drafter']}")
    default_sts = ASSETS / FILES["sts"]
    sts = STS.load(sts_path) if sts_path else STS.load(default_sts) if default_sts.exists() else None
    if sts is not None and sts.gamma != gamma:
        raise click.BadParameter(
            f"{gamma}, but the STS file {sts_path or default_sts} calibrates gamma={sts.gamma}: "
            "give --sts fitted at this gamma",
            param_hint=["--gamma"],
        )
    check_positions(
        positions_needed(prompt_len, max_new_tokens, gamma),
        target.args.max_seq_len,
        f"--prompt-len {prompt_len}, --max-new-tokens {max_new_tokens} and --gamma {gamma}",
        "--max-new-tokens",
    )
    corpus = stdlib_corpus()
    # Each domain's prompts, and the draft latency's batch, are cut from the split before anything runs.
    for count, domain, option in [*((prompts, d, "--prompts") for d in DOMAINS), (batch, DOMAINS[0], "--batch")]:
        try:
            corpus.prompts(split, domain, count, prompt_len)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=[option]) from None
    cfg = EvalConfig(
        split=split,
        prompts_per_domain=prompts,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        gamma=gamma,
        batch=batch,
    )
    report, records = run_evaluation(target, drafters, corpus, cfg, sts)

    pooled = Blocks.from_records([r for recs in records.values() for r in recs])
    with written_whole(out / "reliability.png") as partial:
        reliability_figure(pooled, sts, partial)
    with written_whole(out / "acceptance.png") as partial:
        acceptance_figure(report, partial)
    report["figures"] = {"reliability": str(out / "reliability.png"), "acceptance": str(out / "acceptance.png")}
    if records_out:
        with written_whole(records_out) as partial, open(partial, "w") as f:
            for rec in (r for recs in records.values() for r in recs):
                f.write(json.dumps(rec.to_dict()) + "\n")
        report["records"] = str(records_out)
    with written_whole(out / "eval_drafter.json") as partial:
        partial.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name, t in report["targets"].items():
        click.echo(f"{'PASS' if t['met'] else 'MISS'}  {name}: {t['value']} (target {t['threshold']})")
    click.echo(f"report: {out / 'eval_drafter.json'}")
