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

from sparkgate.policies.outputs import output_path, written_whole

from .cli_checks import SEED, check_gamma, check_positions, check_reads, given_target, load_given
from .model import ModelArgs

LOOP_OPTIONS = [
    click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="Run directory (resumable)."),
    click.option("--steps", default=1000, show_default=True, type=click.IntRange(min=1)),
    click.option("--batch-size", default=16, show_default=True, type=click.IntRange(min=1)),
    click.option("--seq-len", default=256, show_default=True, type=click.IntRange(min=1)),
    click.option("--lr", default=2e-3, show_default=True, type=click.FloatRange(min=0, min_open=True)),
    click.option("--warmup", default=50, show_default=True, type=click.IntRange(min=0), help="Steps (0: none)."),
    click.option(
        "--prose-fraction",
        default=0.2,
        show_default=True,
        type=click.FloatRange(0, 1),
        help="Share of training rows drawn from prose.",
    ),
    click.option("--seed", default=0, show_default=True, type=SEED),
    click.option("--checkpoint-every", default=50, show_default=True, type=click.IntRange(min=1)),
    click.option("--threads", default=0, type=click.IntRange(min=0), help="torch CPU threads (0: torch's default)."),
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
    with written_whole(out / "report.json") as partial:
        partial.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(json.dumps(report))


_TARGET = ModelArgs()  # the target's shape defaults are the model's


@click.group()
def train() -> None:
    """Train the target LM and the DSpark block drafter on the stdlib corpus."""


@train.command("target")
@loop_options
@click.option("--dim", default=_TARGET.dim, show_default=True, type=click.IntRange(min=1))
@click.option("--layers", default=_TARGET.n_layers, show_default=True, type=click.IntRange(min=1))
@click.option("--heads", default=_TARGET.n_heads, show_default=True, type=click.IntRange(min=1))
@click.option("--kv-heads", default=_TARGET.n_kv_heads, show_default=True, type=click.IntRange(min=1))
@click.option("--ffn", default=_TARGET.ffn_hidden, show_default=True, type=click.IntRange(min=1))
def target(out, threads, ship, dim, layers, heads, kv_heads, ffn, **loop):
    """Train the byte-level target LM on the train split."""
    import torch

    from .corpus import stdlib_corpus
    from .shipped import record_asset
    from .training import train_target

    output_path(out, "--out", directory=True)
    try:
        args = ModelArgs(dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads, ffn_hidden=ffn)
    except ValueError as exc:  # a shape the attention cannot split into heads
        raise click.UsageError(f"--dim {dim} --heads {heads} --kv-heads {kv_heads}: {exc}") from None
    seq_len = loop["seq_len"]  # a row is seq_len inputs and one more token, the last input's label
    check_positions(seq_len + 1, args.max_seq_len, f"--seq-len {seq_len} plus the last token's label", "--seq-len")
    if threads:
        torch.set_num_threads(threads)
    corpus = stdlib_corpus()
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
@click.option("--window", default=8, show_default=True, type=click.IntRange(min=1),
              help="Target hidden states read per request.")  # fmt: skip
@click.option("--layers", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--ffn", default=384, show_default=True, type=click.IntRange(min=1))
@click.option("--rank", default=48, show_default=True, type=click.IntRange(min=1),
              help="Rank of the Markov transition bias.")  # fmt: skip
@click.option(
    "--sequential/--no-sequential",
    default=True,
    show_default=True,
    help="--no-sequential trains the pure-parallel ablation.",
)
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1))
@click.option("--anchors", default=32, show_default=True, type=click.IntRange(min=1),
              help="Blocks sampled per training sequence.")  # fmt: skip
@click.option("--depth-decay", default=0.8, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="Weight of depth k is depth_decay ** (k - 1).")  # fmt: skip
@click.option("--confidence-weight", default=0.5, show_default=True, type=click.FloatRange(min=0))
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
    from .model import model_version
    from .shipped import drafter_variant
    from .training import DraftObjective, train_drafter

    output_path(out, "--out", directory=True)
    target_model = given_target(target_path)
    seq_len = loop["seq_len"]
    check_positions(seq_len, target_model.args.max_seq_len, f"--seq-len {seq_len}", "--seq-len")
    if seq_len <= gamma:  # a training block is a pending token and γ more from the same row
        raise click.BadParameter(f"{seq_len} is not longer than --gamma {gamma}", param_hint=["--seq-len"])
    if threads:
        torch.set_num_threads(threads)
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
    type=click.IntRange(min=1),
    help="Train-split prompts, mixed as the serving workload is (code, prose, shuffled 'hard' prose).",
)
@click.option("--prompt-len", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option("--gamma", default=7, show_default=True, type=click.IntRange(min=1))
@click.option("--steps", default=600, show_default=True, type=click.IntRange(min=1), help="Adam steps of the head.")
@click.option("--threads", default=0, type=click.IntRange(min=0), help="torch CPU threads (0: torch's default).")
@click.option("--ship", is_flag=True, help="Install the result as the shipped drafter (or its pure-parallel ablation).")
def confidence(out, target_path, drafter_path, prompts, prompt_len, max_new_tokens, gamma, steps, threads, ship):
    """Refit the drafter's confidence head on its own greedy blocks (train split)."""
    import torch

    from .admission import positions_needed
    from .block_drafter import load_drafter
    from .confidence_tuning import collect_own_blocks, fit_confidence_head
    from .model import model_version
    from .shipped import drafter_variant
    from .workload import mixed_workload

    output_path(out, "--out", directory=True)
    target_model = given_target(target_path)
    net, distilled = load_given(load_drafter, drafter_path, "drafter", "--drafter")
    check_reads(net, target_model, "--drafter")
    check_gamma(gamma, net)
    check_positions(
        positions_needed(prompt_len, max_new_tokens, gamma),
        target_model.args.max_seq_len,
        f"--prompt-len {prompt_len}, --max-new-tokens {max_new_tokens} and --gamma {gamma}",
        "--max-new-tokens",
    )
    try:
        # The serving mix, hard prompts included: the head must learn what an unpredictable block looks like.
        workload = mixed_workload(prompts, seed=0, prompt_len=prompt_len, split="train")
    except ValueError as exc:  # the train split holds too few tokens for that many prompts
        raise click.BadParameter(str(exc), param_hint=["--prompts"]) from None
    if threads:
        torch.set_num_threads(threads)
    train_prompts = [p.tokens for p in workload]
    blocks = collect_own_blocks(target_model, net, train_prompts, max_new_tokens, gamma)
    report = {
        **distilled,
        "distilled_version": model_version(net),
        "confidence_tuning": fit_confidence_head(net, blocks, steps),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    _finish(net, report, Path(out), drafter_variant(net.args.sequential), ship)
