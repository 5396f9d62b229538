"""Packed (ragged) layout of a verify step.

Request ``b`` contributes ``lens[b]`` rows (its last committed token plus its
window of drafts, or a prompt at prefill) at absolute positions
``starts[b] .. starts[b] + lens[b] - 1``. Rows are concatenated request by
request; ``cu_seqlens`` holds the cumulative offsets. Padding rows (up to a
graph tier) follow the real rows and belong to a scratch request ``B`` that
owns the cache's scratch slot, so they never touch a real request's state.

Invariants of a ``PackedLayout`` with ``n_rows`` real rows and ``T`` rows in all:
- ``row_req[:n_rows]`` is non-decreasing, ``row_req[n_rows:] == B``;
- ``positions[r] == req_start[row_req[r]] + row_q[r]`` for real rows;
- ``q_len >= max(lens)`` and ``kv_len >= max(starts + lens)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedLayout:
    cu_seqlens: torch.Tensor  # [B+1] int64
    row_req: torch.Tensor  # [T] request index per row; padding rows -> B
    row_q: torch.Tensor  # [T] offset of the row inside its request
    positions: torch.Tensor  # [T] absolute positions (KV write index)
    kv_slot: torch.Tensor  # [T] cache slot per row (KV write slot)
    req_slot: torch.Tensor  # [B+1] cache slot per request, scratch slot last
    req_start: torch.Tensor  # [B+1] absolute position of each request's first row
    n_rows: int
    q_len: int  # width of the strided per-request view used by attention
    kv_len: int  # keys read per request

    @property
    def tier_rows(self) -> int:
        return self.row_req.shape[0]

    @property
    def batch_size(self) -> int:
        return self.req_slot.shape[0] - 1


def build_layout(
    starts: list[int],
    lens: list[int],
    slots: list[int],
    scratch_slot: int,
    *,
    tier_rows: int | None = None,
    q_len: int | None = None,
    kv_len: int | None = None,
    device: torch.device | str = "cpu",
) -> PackedLayout:
    """Lay out ``lens[b]`` rows per request, padded with scratch rows to ``tier_rows``.

    ``q_len``/``kv_len`` default to the tightest shapes for this step; a CUDA
    graph passes fixed ones so that every replay has the same shapes.
    """
    if not (len(starts) == len(lens) == len(slots)):
        raise ValueError(f"starts, lens, slots differ in length: {len(starts)}, {len(lens)}, {len(slots)}")
    if any(n < 1 for n in lens):
        raise ValueError(f"every request needs at least one row, got lens={lens}")
    n_rows = sum(lens)
    total = n_rows if tier_rows is None else tier_rows
    if total < n_rows:
        raise ValueError(f"tier_rows={tier_rows} is smaller than the {n_rows} real rows")
    q_len = max(lens) if q_len is None else q_len
    kv_len = max(s + n for s, n in zip(starts, lens)) if kv_len is None else kv_len
    batch = len(lens)

    lens_t = torch.tensor(lens, dtype=torch.long, device=device)
    starts_t = torch.tensor(starts + [0], dtype=torch.long, device=device)
    cu = torch.zeros(batch + 1, dtype=torch.long, device=device)
    cu[1:] = torch.cumsum(lens_t, 0)
    pad = total - n_rows
    real_req = torch.repeat_interleave(torch.arange(batch, device=device), lens_t, output_size=n_rows)
    row_req = torch.cat([real_req, torch.full((pad,), batch, dtype=torch.long, device=device)])
    row_q = torch.cat([torch.arange(n_rows, device=device) - cu[real_req], torch.zeros(pad, dtype=torch.long, device=device)])
    req_slot = torch.tensor(slots + [scratch_slot], dtype=torch.long, device=device)
    return PackedLayout(
        cu_seqlens=cu,
        row_req=row_req,
        row_q=row_q,
        positions=starts_t[row_req] + row_q,
        kv_slot=req_slot[row_req],
        req_slot=req_slot,
        req_start=starts_t,
        n_rows=n_rows,
        q_len=q_len,
        kv_len=kv_len,
    )


def kv_positions_mask(layout: PackedLayout) -> torch.Tensor:
    """Boolean ``[B+1, 1, q_len, kv_len]``: key ``j`` visible to row ``q`` iff ``j <= start + q``."""
    device = layout.req_start.device
    last = layout.req_start[:, None] + torch.arange(layout.q_len, device=device)[None, :]
    keys = torch.arange(layout.kv_len, device=device)
    return (keys[None, None, :] <= last[:, :, None]).unsqueeze(1)


def gather_rows(strided: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
    """``[B, W, ...]`` -> packed ``[T, ...]``; padding rows read request 0's first row."""
    req = layout.row_req.clamp(max=layout.batch_size - 1)
    q = torch.where(layout.row_req < layout.batch_size, layout.row_q, 0)
    return strided[req, q]


def scatter_rows(packed: torch.Tensor, layout: PackedLayout, width: int) -> torch.Tensor:
    """Packed ``[T, ...]`` -> strided ``[B, width, ...]``; unfilled cells and padding are zero."""
    n = layout.n_rows
    out = packed.new_zeros(layout.batch_size, width, *packed.shape[1:])
    out[layout.row_req[:n], layout.row_q[:n]] = packed[:n]
    return out
