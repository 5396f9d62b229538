"""``sparkgate train target | drafter | confidence``.

The stages run in that order: the target LM, the drafter distilled from it (and
its ``--no-sequential`` ablation), then the drafter's confidence head refitted
on its own blocks. Each writes a half-precision checkpoint and ``report.json``
into ``--out`` (target and drafter also their resume state: rerunning with the
same ``--out`` and options resumes); ``--ship`` also installs the checkpoint
under ``verify_runtime/assets/`` and records it in the manifest.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import click

from .model import ModelArgs

LOOP_OPTIONS = [
    click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="Run directory (resumable)."),
    click.option("--steps", default=1000, show_default=True),
    click.option("--batch-size", default=16, show_default=True),
    click.option("--seq-len", default=256, show_default=True),
    click.option("--lr", default=2e-3, show_default=True),
    click.option("--warmup", default=50, show_default=True),
    click.option("--prose-fraction", default=0.2, show_default=True, help="Share of training rows drawn from prose."),
    click.option("--seed", default=0, show_default=True),
    click.option("--checkpoint-every", default=50, show_default=True),
    click.option("--threads", default=0, help="torch CPU threads (0: torch's default)."),
    click.option("--ship", is_flag=True, help="Install the result under verify_runtime/assets/."),
]


def loop_options(fn):
    for option in reversed(LOOP_OPTIONS):
        fn = option(fn)
    return fn


def _config(steps, batch_size, seq_len, lr, warmup, prose_fraction, seed, checkpoint_every):
    from .training import TrainConfig

    return TrainConfig(
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        warmup=warmup,
        prose_fraction=prose_fraction,
        seed=seed,
        checkpoint_every=checkpoint_every,
    )


def _finish(module, report: dict, out: Path, key: str, ship: bool) -> None:
    from .model import save_checkpoint
    from .shipped import ship_model

    save_checkpoint(copy.deepcopy(module).half(), out / f"{key}.pt", extra=report)
    if ship:
        report["shipped"] = ship_model(module, key, report)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    click.echo(json.dumps(report))


_TARGET = ModelArgs()  # the target's shape defaults are the model's


@click.group()
def train() -> None:
    """Train the target LM and the DSpark block drafter on the stdlib corpus."""


@train.command("target")
@loop_options
@click.option("--dim", default=_TARGET.dim, show_default=True)
@click.option("--layers", default=_TARGET.n_layers, show_default=True)
@click.option("--heads", default=_TARGET.n_heads, show_default=True)
@click.option("--kv-heads", default=_TARGET.n_kv_heads, show_default=True)
@click.option("--ffn", default=_TARGET.ffn_hidden, show_default=True)
def target(out, threads, ship, dim, layers, heads, kv_heads, ffn, **loop):
    """Train the byte-level target LM on the train split."""
    import torch

    from .corpus import stdlib_corpus
    from .shipped import record_asset
    from .training import train_target

    if threads:
        torch.set_num_threads(threads)
    corpus = stdlib_corpus()
    args = ModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, ffn_hidden=ffn)
    model, report = train_target(corpus, args, _config(**loop), out)
    report["corpus_hash"] = corpus.content_hash
    if ship:
        record_asset("corpus", corpus.stats())
    _finish(model, report, Path(out), "target", ship)


@train.command("drafter")
@loop_options
@click.option(
    "--target",
    "target_path",
    type=click.Path(dir_okay=False, exists=True),
    help="Target checkpoint (default: the shipped target).",
)
@click.option("--window", default=8, show_default=True, help="Target hidden states read per request.")
@click.option("--layers", default=1, show_default=True)
@click.option("--ffn", default=384, show_default=True)
@click.option("--rank", default=48, show_default=True, help="Rank of the Markov transition bias.")
@click.option(
    "--sequential/--no-sequential",
    default=True,
    show_default=True,
    help="--no-sequential trains the pure-parallel ablation.",
)
@click.option("--gamma", default=7, show_default=True)
@click.option("--anchors", default=32, show_default=True, help="Blocks sampled per training sequence.")
@click.option("--depth-decay", default=0.8, show_default=True)
@click.option("--confidence-weight", default=0.5, show_default=True)
def drafter(
    out,
    threads,
    ship,
    target_path,
    window,
    layers,
    ffn,
    rank,
    sequential,
    gamma,
    anchors,
    depth_decay,
    confidence_weight,
    **loop,
):
    """Distil the DSpark block drafter from the target on the train split."""
    import torch

    from .block_drafter import DrafterArgs
    from .corpus import stdlib_corpus
    from .model import load_checkpoint, model_version
    from .shipped import drafter_variant, load_shipped_target
    from .training import DraftObjective, train_drafter

    if threads:
        torch.set_num_threads(threads)
    target_model = load_checkpoint(target_path)[0] if target_path else load_shipped_target()
    corpus = stdlib_corpus()
    args = DrafterArgs(
        target_dim=target_model.args.dim,
        dim=target_model.args.dim,
        n_layers=layers,
        n_heads=target_model.args.n_heads,
        n_kv_heads=target_model.args.n_kv_heads,
        ffn_hidden=ffn,
        window=window,
        max_gamma=max(8, gamma),
        markov_rank=rank,
        sequential=sequential,
    )
    objective = DraftObjective(
        gamma=gamma, anchors_per_row=anchors, depth_decay=depth_decay, confidence_weight=confidence_weight
    )
    net, report = train_drafter(corpus, target_model, args, _config(**loop), objective, out)
    report.update(corpus_hash=corpus.content_hash, target_version=model_version(target_model))
    _finish(net, report, Path(out), drafter_variant(sequential), ship)


@train.command("confidence")
@click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="Output directory.")
@click.option(
    "--target",
    "target_path",
    type=click.Path(dir_okay=False, exists=True),
    help="Target checkpoint (default: the shipped target).",
)
@click.option(
    "--drafter",
    "drafter_path",
    type=click.Path(dir_okay=False, exists=True),
    required=True,
    help="The distilled drafter (`train drafter`'s checkpoint).",
)
@click.option(
    "--prompts",
    default=512,
    show_default=True,
    help="Train-split prompts, mixed as the serving workload is (code, prose, shuffled 'hard' prose).",
)
@click.option("--prompt-len", default=128, show_default=True)
@click.option("--max-new-tokens", default=128, show_default=True)
@click.option("--gamma", default=7, show_default=True)
@click.option("--steps", default=600, show_default=True)
@click.option("--threads", default=0, help="torch CPU threads (0: torch's default).")
@click.option("--ship", is_flag=True, help="Install the result as the shipped drafter (or its pure-parallel ablation).")
def confidence(out, target_path, drafter_path, prompts, prompt_len, max_new_tokens, gamma, steps, threads, ship):
    """Refit the drafter's confidence head on its own greedy blocks (train split)."""
    import torch

    from .block_drafter import load_drafter
    from .confidence_tuning import collect_own_blocks, fit_confidence_head
    from .model import load_checkpoint, model_version
    from .shipped import drafter_variant, load_shipped_target
    from .workload import mixed_workload

    if threads:
        torch.set_num_threads(threads)
    target_model = load_checkpoint(target_path)[0].eval() if target_path else load_shipped_target()
    net, distilled = load_drafter(drafter_path)
    # The serving mix, hard prompts included: the head must learn what an unpredictable block looks like.
    train_prompts = [p.tokens for p in mixed_workload(prompts, seed=0, prompt_len=prompt_len, split="train")]
    blocks = collect_own_blocks(target_model, net, train_prompts, max_new_tokens, gamma)
    report = {
        **distilled,
        "distilled_version": model_version(net),
        "confidence_tuning": fit_confidence_head(net, blocks, steps),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    _finish(net, report, Path(out), drafter_variant(net.args.sequential), ship)
