"""``sparkgate eval drafter``: offline evaluation of the shipped (or given) drafter."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group("eval")
def evaluate() -> None:
    """Offline evaluations."""


@evaluate.command("drafter")
@click.option("--split", type=click.Choice(["validation", "calibration", "test"]), default="test", show_default=True)
@click.option("--prompts", default=96, show_default=True, help="Prompts per domain.")
@click.option("--prompt-len", default=128, show_default=True)
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--gamma", default=7, show_default=True)
@click.option("--batch", default=32, show_default=True)
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
@click.option("--threads", default=0, help="torch CPU threads (0: torch's default).")
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

    from .block_drafter import BlockDrafter, load_drafter
    from .corpus import stdlib_corpus
    from .eval_plots import acceptance_figure, reliability_figure
    from .evaluation import Blocks, EvalConfig
    from .evaluation import evaluate as run_evaluation
    from .model import load_checkpoint
    from .shipped import ASSETS, FILES, load_shipped_target

    if threads:
        torch.set_num_threads(threads)
    target = load_checkpoint(target_path)[0].eval() if target_path else load_shipped_target()
    drafters = {}
    for name, path in (
        ("sequential", drafter_path or ASSETS / FILES["drafter"]),
        ("parallel", ablation_path or ASSETS / FILES["drafter_parallel"]),
    ):
        if Path(path).exists():
            drafters[name] = BlockDrafter(load_drafter(path)[0])
    if "sequential" not in drafters:
        raise click.UsageError(f"no drafter at {drafter_path or ASSETS / FILES['drafter']}")
    default_sts = ASSETS / FILES["sts"]
    sts = STS.load(sts_path) if sts_path else STS.load(default_sts) if default_sts.exists() else None
    cfg = EvalConfig(
        split=split,
        prompts_per_domain=prompts,
        prompt_len=prompt_len,
        max_new_tokens=max_new_tokens,
        gamma=gamma,
        batch=batch,
    )
    report, records = run_evaluation(target, drafters, stdlib_corpus(), cfg, sts)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pooled = Blocks.from_records([r for recs in records.values() for r in recs])
    reliability_figure(pooled, sts, out / "reliability.png")
    acceptance_figure(report, out / "acceptance.png")
    report["figures"] = {"reliability": str(out / "reliability.png"), "acceptance": str(out / "acceptance.png")}
    if records_out:
        Path(records_out).parent.mkdir(parents=True, exist_ok=True)
        with open(records_out, "w") as f:
            for rec in (r for recs in records.values() for r in recs):
                f.write(json.dumps(rec.to_dict()) + "\n")
        report["records"] = str(records_out)
    (out / "eval_drafter.json").write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name, t in report["targets"].items():
        click.echo(f"{'PASS' if t['met'] else 'MISS'}  {name}: {t['value']} (target {t['threshold']})")
    click.echo(f"report: {out / 'eval_drafter.json'}")
