"""Training loops for the target LM and the DSpark block drafter.

Both are deterministic and resumable: the batch of step ``s`` is drawn from a
generator seeded by (seed, s) alone, and the learning rate is a pure function of
the step, so a run stopped at any checkpoint and resumed reaches bit-for-bit the
weights of an uninterrupted run. The resume state (weights, optimizer, step,
config) lives in ``state.pt`` of the run directory.

The drafter learns by distillation: on train-split text, the frozen target gives
its final hidden states (the drafter's context) and its next-token distributions
(the soft labels for every depth of the block); the confidence head learns
whether the drafter's greedy token matches the target's (the realised greedy
accept indicator). Both losses are weighted by ``depth_decay ** (k − 1)``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from sparkgate.policies.errors import InputError

from .block_drafter import DrafterArgs, DSparkNet
from .corpus import DOMAINS, Corpus
from .model import ModelArgs, Transformer, forward_full


class ResumeError(InputError):
    """A run directory whose resume state is unreadable or was written by another run (named in the message)."""


STATE_FILE = "state.pt"


def require_at_least_one(config, names: tuple[str, ...]) -> None:
    """Raise naming the first of ``names`` whose value on ``config`` is below 1."""
    for name in names:
        if getattr(config, name) < 1:
            raise ValueError(f"{type(config).__name__}.{name} must be >= 1, got {getattr(config, name)}")


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    prose_fraction: float = 0.2
    seed: int = 0
    checkpoint_every: int = 50
    eval_batches: int = 8

    def __post_init__(self) -> None:
        require_at_least_one(self, ("steps", "batch_size", "seq_len", "checkpoint_every", "eval_batches"))
        if self.lr <= 0:
            raise ValueError(f"TrainConfig.lr must be > 0, got {self.lr}")

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class DraftObjective:
    gamma: int = 7
    anchors_per_row: int = 32  # block starts sampled per training sequence
    depth_decay: float = 0.8
    confidence_weight: float = 0.5

    def __post_init__(self) -> None:
        if self.gamma < 1 or self.anchors_per_row < 1:
            raise ValueError(f"gamma and anchors_per_row must be >= 1, got {self.gamma}, {self.anchors_per_row}")
        if not 0 < self.depth_decay <= 1:
            raise ValueError(f"depth_decay must be in (0, 1], got {self.depth_decay}")

    def depth_weights(self) -> torch.Tensor:
        w = self.depth_decay ** torch.arange(self.gamma, dtype=torch.float32)
        return w / w.sum()


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator for one step's batch: depends on (seed, step) only."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def fit(
    module: nn.Module,
    step_loss: Callable[[int], torch.Tensor],
    cfg: TrainConfig,
    run_dir: str | Path,
    tokens_per_step: int,
    desc: str,
    identity: dict,
) -> dict:
    """Run (or resume) ``cfg.steps`` optimizer steps of ``step_loss(step)`` on ``module``.

    ``identity`` (the config and model args) must match a state file being resumed.
    Returns the mean loss of the last 50 steps, the steps run and the wall time.
    """
    decay = [p for p in module.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    state_path = Path(run_dir) / STATE_FILE
    start, recent, wall = 0, [], 0.0
    if state_path.exists():
        try:
            state = torch.load(state_path, weights_only=True)
        except Exception as exc:  # torch raises what its unpickler or zip reader met, by many types
            reason = str(exc).strip().split("\n")[0] or type(exc).__name__
            raise ResumeError(f"{state_path} cannot be read ({reason}); use another run directory") from None
        changed = {k: (state["identity"].get(k), v) for k, v in identity.items() if state["identity"].get(k) != v}
        if changed:
            raise ResumeError(
                f"{state_path} was written by a different run: {changed} (saved, requested); use another run directory"
            )
        module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, recent, wall = state["step"], state["recent"], state["wall_s"]
    module.train()
    began = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=start, desc=desc, unit="step", mininterval=2.0, dynamic_ncols=True)
    for step in range(start, cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr_at(step)
        loss = step_loss(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(module.parameters(), cfg.grad_clip)
        optimizer.step()
        recent = (recent + [loss.item()])[-50:]
        elapsed = time.perf_counter() - began
        bar.set_postfix(loss=f"{recent[-1]:.4f}", tok_s=f"{tokens_per_step * (step + 1 - start) / elapsed:.0f}")
        bar.update()
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = state_path.with_suffix(".tmp")
            torch.save(
                {
                    "model": module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step + 1,
                    "recent": recent,
                    "wall_s": wall + elapsed,
                    "identity": identity,
                },
                tmp,
            )
            tmp.replace(state_path)
    bar.close()
    module.eval()
    return {
        "steps": cfg.steps,
        "train_loss": sum(recent) / max(1, len(recent)),
        "wall_s": round(wall + time.perf_counter() - began, 1),
        "tokens": cfg.steps * tokens_per_step,
    }


# -- target ---------------------------------------------------------------------
def lm_loss(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    _, logits = forward_full(model, tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train_target(corpus: Corpus, args: ModelArgs, cfg: TrainConfig, run_dir: str | Path) -> tuple[Transformer, dict]:
    if cfg.seq_len + 1 > args.max_seq_len:
        raise ValueError(f"seq_len={cfg.seq_len} needs max_seq_len >= {cfg.seq_len + 1}, model has {args.max_seq_len}")
    torch.manual_seed(cfg.seed)
    model = Transformer(args)

    def step_loss(step: int) -> torch.Tensor:
        gen = step_generator(cfg.seed, step)
        return lm_loss(model, corpus.batch("train", cfg.batch_size, cfg.seq_len + 1, gen, cfg.prose_fraction))

    report = fit(
        model,
        step_loss,
        cfg,
        run_dir,
        cfg.batch_size * cfg.seq_len,
        "train target",
        {"config": dataclasses.asdict(cfg), "args": dataclasses.asdict(args)},
    )
    with torch.no_grad():
        report["val_loss"] = {d: _mean_over_val(corpus, cfg, d, lambda t: lm_loss(model, t)) for d in DOMAINS}
    report["params"] = model.num_params
    return model, report


def _mean_over_val(
    corpus: Corpus, cfg: TrainConfig, domain: str, loss: Callable[[torch.Tensor], torch.Tensor]
) -> float:
    """Mean of ``loss`` over fixed validation batches of one domain (nats per token)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    batches = [
        corpus.batch("validation", cfg.batch_size, cfg.seq_len + 1, gen, float(domain == "prose"))
        for _ in range(cfg.eval_batches)
    ]
    return round(sum(float(loss(b)) for b in batches) / len(batches), 4)


# -- drafter --------------------------------------------------------------------
@dataclass
class DraftExamples:
    """Teacher-forced training blocks, one per anchor (flattened over rows)."""

    hidden: torch.Tensor  # [N, window, target_dim] context, left-padded with zeros
    hidden_len: torch.Tensor  # [N]
    prev: torch.Tensor  # [N, γ] tokens x_0 (pending) .. x_{γ-1}
    target_logits: torch.Tensor  # [N, γ, V] the target's distribution at each depth


@torch.no_grad()
def draft_examples(
    target: Transformer, tokens: torch.Tensor, window: int, objective: DraftObjective, generator: torch.Generator
) -> DraftExamples:
    """Cut anchors out of ``tokens [B, L]``: the pending token at position p, depth k
    drafting position p + k, whose target distribution is the target's logits at p + k − 1."""
    hidden, logits = forward_full(target, tokens)
    batch, length = tokens.shape
    gamma = objective.gamma
    if length <= gamma:
        raise ValueError(f"sequences of length {length} are too short for gamma={gamma}")
    p = torch.randint(0, length - gamma + 1, (batch, objective.anchors_per_row), generator=generator)
    rows = torch.arange(batch)[:, None, None]
    ctx_pos = p[..., None] - window + torch.arange(window)
    ctx = hidden[rows, ctx_pos.clamp(min=0)] * (ctx_pos >= 0)[..., None]
    block_pos = p[..., None] + torch.arange(gamma)
    return DraftExamples(
        hidden=ctx.flatten(0, 1),
        hidden_len=p.clamp(max=window).flatten(),
        prev=tokens[rows, block_pos].flatten(0, 1),
        target_logits=logits[rows, block_pos].flatten(0, 1),
    )


def draft_loss(net: DSparkNet, ex: DraftExamples, objective: DraftObjective) -> tuple[torch.Tensor, dict]:
    """Depth-weighted distillation cross-entropy plus confidence BCE; also the per-depth greedy match rate."""
    logits, confidence = net(ex.hidden, ex.hidden_len, ex.prev)
    target_probs = torch.softmax(ex.target_logits.float(), -1)
    distill = -(target_probs * torch.log_softmax(logits, -1)).sum(-1)  # [N, γ]
    match = (logits.argmax(-1) == ex.target_logits.argmax(-1)).float()
    bce = F.binary_cross_entropy_with_logits(confidence, match, reduction="none")
    w = objective.depth_weights().to(logits.device)
    loss = (distill * w).sum(-1).mean() + objective.confidence_weight * (bce * w).sum(-1).mean()
    return loss, {"distill": distill.mean(0), "bce": bce.mean(0), "match": match.mean(0)}


def train_drafter(
    corpus: Corpus,
    target: Transformer,
    args: DrafterArgs,
    cfg: TrainConfig,
    objective: DraftObjective,
    run_dir: str | Path,
) -> tuple[DSparkNet, dict]:
    if args.target_dim != target.args.dim:
        raise ValueError(f"DrafterArgs.target_dim={args.target_dim} differs from the target's dim={target.args.dim}")
    if objective.gamma > args.max_gamma:
        raise ValueError(f"objective gamma={objective.gamma} exceeds DrafterArgs.max_gamma={args.max_gamma}")
    target = target.eval().requires_grad_(False)
    torch.manual_seed(cfg.seed)
    net = DSparkNet(args)
    if args.dim == target.args.dim:
        net.init_from_target(target)

    def examples(split: str, gen: torch.Generator, prose: float) -> DraftExamples:
        tokens = corpus.batch(split, cfg.batch_size, cfg.seq_len, gen, prose)
        return draft_examples(target, tokens, args.window, objective, gen)

    def step_loss(step: int) -> torch.Tensor:
        gen = step_generator(cfg.seed, step)
        return draft_loss(net, examples("train", gen, cfg.prose_fraction), objective)[0]

    identity = {
        "config": dataclasses.asdict(cfg),
        "args": dataclasses.asdict(args),
        "objective": dataclasses.asdict(objective),
    }
    report = fit(net, step_loss, cfg, run_dir, cfg.batch_size * cfg.seq_len, "train drafter", identity)
    report["validation"] = {}
    with torch.no_grad():
        for domain in DOMAINS:
            gen = torch.Generator().manual_seed(cfg.seed)
            parts = [
                draft_loss(net, examples("validation", gen, float(domain == "prose")), objective)
                for _ in range(cfg.eval_batches)
            ]
            report["validation"][domain] = {
                "loss": round(sum(float(loss) for loss, _ in parts) / len(parts), 4),
                **{
                    key: [round(float(v), 4) for v in torch.stack([m[key] for _, m in parts]).mean(0)]
                    for key in ("distill", "bce", "match")
                },
            }
    report["params"] = net.num_params
    return net, report
