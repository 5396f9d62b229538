"""A Llama-style decoder-only LM in plain torch, over a byte-level vocabulary.

Two forward paths share every layer:
- ``forward_full`` — dense causal attention over ``[B, L]`` tokens, no cache. The
  reference for correctness tests and the path used for training.
- ``forward_packed`` — packed (ragged) rows from ``packing.PackedLayout``: all
  dense work (projections, MLP, LM head) runs on the packed rows only, new K/V
  rows are written into the ``KVCache``, and each row attends to its request's
  cache causally by absolute position.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from sparkgate.policies.outputs import written_whole

from .packing import PackedLayout

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# Byte-level vocabulary: ids 0..255 are bytes, then a few specials.
BOS, EOS, PAD = 256, 257, 258
BYTE_VOCAB = 260


@dataclass
class ModelArgs:
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_hidden: int = 768
    vocab_size: int = BYTE_VOCAB
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:  # rotary embedding turns a head's dimensions in pairs
            raise ValueError(f"dim={self.dim} / n_heads={self.n_heads} = {self.head_dim}: a head needs an even size")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_tables(args: ModelArgs) -> tuple[torch.Tensor, torch.Tensor]:
    half = args.head_dim // 2
    freqs = 1.0 / (args.rope_theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float64), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., H, D]`` by tables ``cos, sin [..., D/2]`` (broadcast over heads)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


# An attention kernel: (q [..., H, D], k [..., Hkv, D], v [..., Hkv, D]) -> [..., H, D].
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        # One fused projection: at decode-sized row counts each matmul call has a
        # fixed cost, so fewer, wider calls make step time follow the rows.
        self.wqkv = nn.Linear(args.dim, (args.n_heads + 2 * args.n_kv_heads) * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        lead = x.shape[:-1]
        qkv = self.wqkv(x).view(*lead, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=-2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.wo(attend(q, k, v).flatten(-2))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w13 = nn.Linear(args.dim, 2 * args.ffn_hidden, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(args.ffn_hidden, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x, cos, sin, attend: Attend, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``rows`` (indices along dim 0): the outputs wanted; every row's K/V is still written."""
        x = x + self.attention(self.attention_norm(x), cos, sin, attend)
        if rows is not None:
            x = x.index_select(0, rows)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args)
        self.register_buffer("rope_cos", cos.float(), persistent=False)
        self.register_buffer("rope_sin", sin.float(), persistent=False)
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.args.init_std)

    def _apply(self, fn, recurse=True):
        # Keep RoPE tables in the model's dtype when it is cast (e.g. .double()).
        out = super()._apply(fn, recurse)
        dtype = self.tok_embeddings.weight.dtype
        self.rope_cos, self.rope_sin = self.rope_cos.to(dtype), self.rope_sin.to(dtype)
        return out

    def hidden(
        self, tokens: torch.Tensor, positions: torch.Tensor, attends: list[Attend], rows: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final-normed hidden states for ``tokens`` at absolute ``positions`` (same shape), or for
        the packed ``rows`` only: the last layer's feed-forward, most of its cost, then skips the
        others (a prefill keeps a few rows of a long prompt)."""
        flat = positions.reshape(-1)
        cos = self.rope_cos.index_select(0, flat).view(*positions.shape, -1)
        sin = self.rope_sin.index_select(0, flat).view(*positions.shape, -1)
        h = self.tok_embeddings(tokens)
        last = len(self.layers) - 1
        for i, (layer, attend) in enumerate(zip(self.layers, attends)):
            h = layer(h, cos, sin, attend, rows if i == last else None)
        return self.norm(h)

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def _attend_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2)


def forward_full(model: Transformer, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense causal forward over ``tokens [B, L]`` from position 0: (hidden, logits)."""
    positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
    h = model.hidden(tokens, positions, [_attend_causal] * len(model.layers))
    return h, model.output(h)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -torch.inf)


def _attend_packed(layout: PackedLayout, k_cache: torch.Tensor, v_cache: torch.Tensor) -> Attend:
    """Attention for packed rows against one layer's cache ``[slots, max_len, Hkv, D]``.

    New K/V rows are written at (slot, position) first, so a row sees its own
    request's committed prefix plus the earlier rows of its window. Rows past a
    request's committed length from an earlier, rejected verification are never
    read: the mask admits only keys at positions <= the query's position, and
    every such position was just written or is committed.
    """
    # Additive float masks, built once per forward instead of once per layer.
    masks = [_additive(g.mask(), k_cache.dtype) for g in layout.groups]
    max_len = k_cache.shape[1]
    # Flat indices turn the row scatters and gathers into index_copy/index_select,
    # several times cheaper than advanced indexing on CPU.
    write_at = layout.kv_slot * max_len + layout.positions
    n_cells, dense = layout.n_cells, layout.dense

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, write_at, k)
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, write_at, v)
        if dense:  # rows are the cells already: no grid to fill and read back
            grid, out = q, torch.empty_like(q)
        else:
            # One spare cell (index n_cells) takes every padding row and stays zero.
            grid = q.new_zeros(n_cells + 1, *q.shape[1:]).index_copy_(0, layout.cell, q)
            out = torch.empty_like(grid)  # every group writes all its cells; only the spare one needs zeros
            out[n_cells] = 0
        for group, mask in zip(layout.groups, masks):
            cells = slice(group.offset, group.offset + group.n_cells)
            qs = grid[cells].view(-1, group.q_len, *q.shape[1:])
            keys = k_cache[:, : group.kv_len].index_select(0, group.slots)
            values = v_cache[:, : group.kv_len].index_select(0, group.slots)
            o = F.scaled_dot_product_attention(
                qs.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, enable_gqa=True
            )
            out[cells] = o.transpose(1, 2).reshape(group.n_cells, *q.shape[1:])
        return out if dense else out.index_select(0, layout.cell)

    return attend


def forward_packed(
    model: Transformer, cache, tokens: torch.Tensor, layout: PackedLayout, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed forward over ``tokens [T]`` laid out by ``layout``: (hidden [T, dim], logits [T, V]),
    or ``[len(rows), ...]`` for the packed ``rows`` only.

    Writes every row's K/V into ``cache`` at its position; does not move any
    committed length (that is ``KVCache.commit``'s job).
    """
    attends = [_attend_packed(layout, cache.k[i], cache.v[i]) for i in range(len(model.layers))]
    h = model.hidden(tokens, layout.positions, attends, rows)
    return h, model.output(h)


class Checkpointable(Protocol):
    """A model whose shape is a dataclass ``args``: the target ``Transformer`` and the drafter's ``DSparkNet``."""

    @property
    def args(self) -> DataclassInstance: ...

    def state_dict(self) -> dict[str, Any]: ...


def model_version(model: Checkpointable) -> str:
    """A short content hash of the weights and args: the ``model_version`` of records."""
    digest = hashlib.sha256(repr(dataclasses.asdict(model.args)).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def save_checkpoint(model: Checkpointable, path: str | Path, extra: dict | None = None) -> None:
    """Weights plus the ``ModelArgs`` as plain data, loadable with ``weights_only=True``."""
    payload = {"args": dataclasses.asdict(model.args), "model": model.state_dict(), "extra": extra or {}}
    with written_whole(path) as partial:  # never a half-written checkpoint under the real name
        torch.save(payload, partial)


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, dict, dict]:
    """(args, float32 state dict, extra) of a file written by ``save_checkpoint``, loaded weights-only."""
    payload = torch.load(path, map_location=map_location, weights_only=True)
    missing = {"args", "model"} - set(payload)
    if missing:
        raise ValueError(f"checkpoint {path} lacks {sorted(missing)}")
    # Shipped checkpoints are half precision; the runtime computes in float32.
    state = {k: v.float() if v.is_floating_point() else v for k, v in payload["model"].items()}
    return payload["args"], state, payload.get("extra", {})


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[Transformer, dict]:
    args, state, extra = read_checkpoint(path, map_location)
    model = Transformer(ModelArgs(**args))
    model.load_state_dict(state)
    return model, extra
