"""The DSpark block drafter: a parallel backbone plus a light sequential head.

One pass of a small transformer (``DrafterArgs.n_layers``, 1–2 layers) turns the
target's final hidden states of the last ``window`` committed positions, the
pending token and γ block-position embeddings into γ position representations
``h_1..h_γ`` at once. Only the γ block rows are queries; the context rows (the
projected hidden states and the pending token's embedding) enter each layer as
keys and values only, so the context costs one K/V projection per layer instead
of a full transformer row.

The sequential head restores in-block dependence cheaply: depth k's logits get
a low-rank Markov transition bias from the token drafted at depth k − 1,
``(A[x_{k−1}] ⊙ G h_k) B`` with rank ``markov_rank``, so the only serial work per
depth is an embedding lookup, an elementwise product, a ``rank × V`` matmul and
the token pick. The confidence head is a small MLP,
``c_k = σ(MLP([h_k; e(x_{k−1}); stats_k]))``, where ``stats_k`` describe the
distribution depth k's token was drafted from (see ``draft_stats``): how sure the
drafter was is the strongest single sign of whether the target will agree.

``DSparkNet`` is the trainable module; ``BlockDrafter`` wraps it in the runtime's
``Drafter`` protocol (drafts drawn with ``pick``, so they are deterministic per
(seed, position) and the acceptance rule stays lossless).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .drafters import DraftContext, DraftOutput, pick, temperature_probs
from .model import (
    BYTE_VOCAB,
    FeedForward,
    ModelArgs,
    RMSNorm,
    Transformer,
    apply_rope,
    model_version,
    read_checkpoint,
    rope_tables,
)


@dataclass
class DrafterArgs:
    target_dim: int = 256  # width of the target hidden states it reads
    dim: int = 256
    n_layers: int = 1
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_hidden: int = 384
    vocab_size: int = BYTE_VOCAB
    window: int = 8  # target hidden states read per request (the engine's ``hidden_window``)
    max_gamma: int = 8
    markov_rank: int = 48
    confidence_hidden: int = 64  # width of the confidence MLP
    sequential: bool = True  # False: pure parallel drafting (the ablation)
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in (
            "target_dim",
            "dim",
            "n_layers",
            "window",
            "max_gamma",
            "markov_rank",
            "confidence_hidden",
            "vocab_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"DrafterArgs.{name} must be >= 1, got {getattr(self, name)}")
        self.layer_args()  # validates heads against dim

    def layer_args(self) -> ModelArgs:
        """The transformer-layer shape, with RoPE tables long enough for context + pending + block."""
        return ModelArgs(
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            ffn_hidden=self.ffn_hidden,
            vocab_size=self.vocab_size,
            max_seq_len=self.window + 1 + self.max_gamma,
            norm_eps=self.norm_eps,
            init_std=self.init_std,
        )


N_DRAFT_STATS = 3


def draft_stats(logits: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` draft logits -> ``[..., 3]``: the logit of the top token's probability, the
    entropy (nats) and the top-1 minus top-2 probability margin, at temperature 1 and without
    gradient (the confidence loss must not reshape the drafts it judges)."""
    logp = torch.log_softmax(logits.detach().float(), dim=-1)
    top = logp.topk(2, dim=-1).values
    p1 = top[..., 0].exp().clamp(1e-6, 1 - 1e-6)
    entropy = -(logp.exp() * logp).sum(-1)
    return torch.stack([torch.log(p1) - torch.log1p(-p1), entropy, p1 - top[..., 1].exp()], -1)


class DraftLayer(nn.Module):
    """A pre-norm transformer layer whose queries are the block rows only."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.wqkv = nn.Linear(args.dim, (args.n_heads + 2 * args.n_kv_heads) * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(
        self, x: torch.Tensor, context: torch.Tensor, rope_q: tuple, rope_c: tuple, mask: torch.Tensor
    ) -> torch.Tensor:
        n, q_len = x.shape[:2]
        qkv = self.wqkv(self.attention_norm(x)).view(n, q_len, -1, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=2)
        kv_weight = self.wqkv.weight[self.n_heads * self.head_dim :]
        ckv = F.linear(self.attention_norm(context), kv_weight).view(n, context.shape[1], -1, self.head_dim)
        ck, cv = ckv.chunk(2, dim=2)
        q, k, ck = apply_rope(q, *rope_q), apply_rope(k, *rope_q), apply_rope(ck, *rope_c)
        keys, values = torch.cat([ck, k], 1), torch.cat([cv, v], 1)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, enable_gqa=True
        )
        x = x + self.wo(out.transpose(1, 2).flatten(2))
        return x + self.feed_forward(self.ffn_norm(x))


class DSparkNet(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, args: DrafterArgs):
        super().__init__()
        self.args = args
        layer_args = args.layer_args()
        self.fuse = nn.Linear(args.target_dim, args.dim, bias=False)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.block_pos = nn.Parameter(torch.zeros(args.max_gamma, args.dim))
        self.layers = nn.ModuleList(DraftLayer(layer_args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.confidence_head = nn.Sequential(
            nn.Linear(2 * args.dim + N_DRAFT_STATS, args.confidence_hidden),
            nn.SiLU(),
            nn.Linear(args.confidence_hidden, 1),
        )
        if args.sequential:
            self.markov_prev = nn.Embedding(args.vocab_size, args.markov_rank)
            self.markov_gate = nn.Linear(args.dim, args.markov_rank, bias=False)
            self.markov_out = nn.Linear(args.markov_rank, args.vocab_size, bias=False)
        cos, sin = rope_tables(layer_args)
        self.register_buffer("rope_cos", cos.float(), persistent=False)
        self.register_buffer("rope_sin", sin.float(), persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=args.init_std)
        nn.init.normal_(self.block_pos, std=args.init_std)
        if args.sequential:
            nn.init.zeros_(self.markov_out.weight)  # start as the pure parallel drafter

    def init_from_target(self, target: Transformer) -> None:
        """Start the token embedding and LM head from the target's (they share a vocabulary)."""
        if target.args.dim != self.args.dim or target.args.vocab_size != self.args.vocab_size:
            raise ValueError(
                f"target dim/vocab {target.args.dim}/{target.args.vocab_size} differ from the "
                f"drafter's {self.args.dim}/{self.args.vocab_size}"
            )
        with torch.no_grad():
            self.tok_embeddings.weight.copy_(target.tok_embeddings.weight)
            self.output.weight.copy_(target.output.weight)

    def backbone(
        self, hidden: torch.Tensor, hidden_len: torch.Tensor, pending: torch.Tensor, gamma: int
    ) -> torch.Tensor:
        """Normed block representations ``[N, γ, dim]`` from context ``hidden [N, W, target_dim]``
        (left-padded, ``hidden_len [N]`` real rows) and the pending tokens ``[N]``."""
        if not 1 <= gamma <= self.args.max_gamma:
            raise ValueError(f"gamma={gamma} is outside [1, max_gamma={self.args.max_gamma}] of this drafter")
        if hidden.shape[1:] != (self.args.window, self.args.target_dim):
            raise ValueError(
                f"hidden has shape {tuple(hidden.shape)}, expected [N, {self.args.window}, {self.args.target_dim}]"
            )
        window, n = self.args.window, len(pending)
        # The pending token joins the context: its K/V is all the block needs from it.
        context = torch.cat([self.fuse(hidden.to(self.block_pos.dtype)), self.tok_embeddings(pending)[:, None]], 1)
        x = self.block_pos[:gamma].expand(n, -1, -1)
        # Relative positions: context rows 0..W-1, the pending token W, depth k at W + k.
        rope_c = (self.rope_cos[: window + 1], self.rope_sin[: window + 1])
        rope_q = (self.rope_cos[window + 1 : window + 1 + gamma], self.rope_sin[window + 1 : window + 1 + gamma])
        real = torch.arange(window, device=x.device) >= window - hidden_len.to(x.device)[:, None]
        mask = torch.cat([real, real.new_ones(n, 1 + gamma)], 1)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, context, rope_q, rope_c, mask)
        return self.norm(x)

    def transition_gate(self, h: torch.Tensor) -> torch.Tensor:
        """The block-dependent half of the Markov bias, computed once for all depths."""
        return self.markov_gate(h)

    def transition(self, prev: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Markov logit bias ``[..., V]`` from the previous tokens ``[...]`` and their gates ``[..., rank]``."""
        return self.markov_out(self.markov_prev(prev) * gate)

    def confidence_input(self, h: torch.Tensor, prev: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The head's input ``[h_k; e(x_{k−1}); draft_stats(logits_k)]``, ``[..., 2·dim + 3]``."""
        return torch.cat([h, self.tok_embeddings(prev), draft_stats(logits).to(h.dtype)], -1)

    def confidence(self, h: torch.Tensor, prev: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """Raw confidence logits of depths whose representations are ``h``, previous tokens ``prev``
        and draft logits ``logits`` (the ones each depth's token was drafted from); shape of ``prev``."""
        return self.confidence_head(self.confidence_input(h, prev, logits)).squeeze(-1)

    def forward(
        self, hidden: torch.Tensor, hidden_len: torch.Tensor, prev: torch.Tensor, sequential: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced training pass: ``prev [N, γ]`` holds x_0 (the pending token) .. x_{γ−1}.

        Returns draft logits ``[N, γ, V]`` and confidence logits ``[N, γ]``.
        """
        h = self.backbone(hidden, hidden_len, prev[:, 0], prev.shape[1])
        logits = self.draft_logits(h, prev, sequential)
        return logits, self.confidence(h, prev, logits)

    def draft_logits(self, h: torch.Tensor, prev: torch.Tensor, sequential: bool = True) -> torch.Tensor:
        """Each depth's draft logits ``[N, γ, V]`` given the tokens before it, ``prev [N, γ]``."""
        logits = self.output(h)
        if sequential and self.args.sequential:
            logits = logits + self.transition(prev, self.transition_gate(h))
        return logits

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class BlockDrafter:
    """``Drafter`` protocol over a ``DSparkNet``; ``sequential=False`` drops the Markov head."""

    def __init__(self, net: DSparkNet, sequential: bool = True):
        self.net = net.eval()
        self.sequential = sequential and net.args.sequential
        self.hidden_window = net.args.window
        self.version = f"dspark-{model_version(net)}" + ("" if self.sequential else "-parallel")

    @torch.inference_mode()
    def propose(self, ctx: DraftContext) -> DraftOutput:
        if ctx.hidden is None or ctx.hidden_len is None:
            raise ValueError("BlockDrafter needs the target hidden states (ctx.hidden, ctx.hidden_len)")
        device = self.net.output.weight.device
        pending = torch.tensor([h[-1] for h in ctx.history], dtype=torch.long, device=device)
        h = self.net.backbone(ctx.hidden.to(device), ctx.hidden_len, pending, ctx.gamma)
        logits = self.net.output(h).float()
        gate = self.net.transition_gate(h) if self.sequential else None
        temps = ctx.temperatures.to(device)
        tokens, probs, drafted_from, prev = [], [], [], pending
        for k in range(ctx.gamma):
            step_logits = logits[:, k]
            if gate is not None:
                step_logits = step_logits + self.net.transition(prev, gate[:, k]).float()
            p = temperature_probs(step_logits, temps)
            prev = pick(p, ctx, k + 1).to(device)
            tokens.append(prev)
            probs.append(p)
            drafted_from.append(step_logits)
        tokens_t = torch.stack(tokens, 1)
        previous = torch.cat([pending[:, None], tokens_t[:, :-1]], 1)
        confidence = self.net.confidence(h, previous, torch.stack(drafted_from, 1)).float()
        out_device = ctx.positions.device
        return DraftOutput(tokens_t.to(out_device), torch.stack(probs, 1).to(out_device), confidence.to(out_device))


def load_drafter(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[DSparkNet, dict]:
    """Inverse of ``model.save_checkpoint(net, ...)`` for a ``DSparkNet``."""
    args, state, extra = read_checkpoint(path, map_location)
    net = DSparkNet(DrafterArgs(**args))
    net.load_state_dict(state)
    return net.to(map_location).eval(), extra
