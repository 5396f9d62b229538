"""Packed (ragged) layout of a verify step.

Request ``b`` contributes ``lens[b]`` rows (its last committed token plus its
window of drafts, or a prompt at prefill) at absolute positions
``starts[b] .. starts[b] + lens[b] - 1``. Rows are concatenated request by
request; ``cu_seqlens`` holds the cumulative offsets. Padding rows (up to a
graph tier) follow the real rows, write their K/V into the cache's scratch slot
and are attended by nobody.

Attention runs per *group* of requests with similar row counts: a group is a
``[n, q_len]`` grid of query cells, and every real row owns one cell. Requests
are grouped by their row count rounded up to a power of two, and a group is as
wide as its longest member: padded cells stay under 2× the real rows, so
attention cost follows the packed rows too, and a batch of equal lengths (a
prefill of same-length prompts, a static step) pads nothing. A CUDA graph asks
for one fixed-shape group instead.

Invariants of a ``PackedLayout`` with ``n_rows`` real rows and ``T`` rows in all:
- ``row_req[:n_rows]`` is non-decreasing, ``row_req[n_rows:] == B``;
- ``positions[r] == starts[row_req[r]] + row_q[r]`` for real rows, 0 for padding;
- each real row's ``cell`` is unique; padding rows share the cell ``n_cells``,
  which no group computes (its attention output is zero);
- ``dense`` layouts (``cell[r] == r`` for every row) let attention read and
  write the packed rows in place.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass
class AttentionGroup:
    slots: torch.Tensor  # [n] cache slot per request
    starts: torch.Tensor  # [n] absolute position of each request's first row
    q_len: int  # query cells per request
    kv_len: int  # keys read per request
    offset: int  # first cell of this group in the flat grid

    @property
    def n_cells(self) -> int:
        return self.slots.shape[0] * self.q_len

    def mask(self) -> torch.Tensor:
        """Boolean ``[n, 1, q_len, kv_len]``: key ``j`` visible to query ``q`` iff ``j <= start + q``."""
        device = self.starts.device
        last = self.starts[:, None] + torch.arange(self.q_len, device=device)[None, :]
        keys = torch.arange(self.kv_len, device=device)
        return (keys[None, None, :] <= last[:, :, None]).unsqueeze(1)


@dataclass
class PackedLayout:
    cu_seqlens: torch.Tensor  # [B+1] int64
    row_req: torch.Tensor  # [T] request index per row; padding rows -> B
    row_q: torch.Tensor  # [T] offset of the row inside its request; padding 0
    positions: torch.Tensor  # [T] absolute positions (KV write index)
    kv_slot: torch.Tensor  # [T] cache slot per row (KV write slot)
    cell: torch.Tensor  # [T] query cell in the flat attention grid
    groups: list[AttentionGroup]
    n_rows: int
    batch_size: int
    # Row r owns cell r and nothing is padding, so attention can work on the rows
    # in place. Decided on the host: reading the cells back would sync a device
    # (and break a CUDA-graph capture).
    dense: bool = False

    @property
    def tier_rows(self) -> int:
        return self.row_req.shape[0]

    @property
    def n_cells(self) -> int:
        return sum(g.n_cells for g in self.groups)


def _bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


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

    Without ``q_len`` requests are grouped by their row count rounded up to a
    power of two, each group reading the keys it needs. With ``q_len`` (and
    ``kv_len``) all requests form one group of that fixed shape, as a CUDA graph
    needs.
    """
    if not (len(starts) == len(lens) == len(slots)):
        raise ValueError(f"starts, lens, slots differ in length: {len(starts)}, {len(lens)}, {len(slots)}")
    if any(n < 1 for n in lens):
        raise ValueError(f"every request needs at least one row, got lens={lens}")
    n_rows, batch = sum(lens), len(lens)
    total = n_rows if tier_rows is None else tier_rows
    if total < n_rows:
        raise ValueError(f"tier_rows={tier_rows} is smaller than the {n_rows} real rows")
    if q_len is not None and q_len < max(lens):
        raise ValueError(f"q_len={q_len} is smaller than the longest request ({max(lens)} rows)")

    if q_len is None:
        buckets = sorted({_bucket(n) for n in lens})
        members = [[b for b in range(batch) if _bucket(lens[b]) == k] for k in buckets]
        widths = [max(lens[b] for b in reqs) for reqs in members]
    else:
        widths, members = [q_len], [list(range(batch))]
    groups, cell_of = [], [0] * batch
    offset = 0
    for width, reqs in zip(widths, members):
        need = max(starts[b] + lens[b] for b in reqs)
        groups.append(
            AttentionGroup(
                slots=torch.tensor([slots[b] for b in reqs], dtype=torch.long, device=device),
                starts=torch.tensor([starts[b] for b in reqs], dtype=torch.long, device=device),
                q_len=width,
                kv_len=need if kv_len is None else kv_len,
                offset=offset,
            )
        )
        for i, b in enumerate(reqs):
            cell_of[b] = offset + i * width
        offset += len(reqs) * width

    lens_t = torch.tensor(lens, dtype=torch.long, device=device)
    cu = torch.zeros(batch + 1, dtype=torch.long, device=device)
    cu[1:] = torch.cumsum(lens_t, 0)
    pad = total - n_rows
    real_req = torch.repeat_interleave(torch.arange(batch, device=device), lens_t, output_size=n_rows)
    real_q = torch.arange(n_rows, device=device) - cu[real_req]
    pad_zeros = torch.zeros(pad, dtype=torch.long, device=device)
    starts_t = torch.tensor(starts, dtype=torch.long, device=device)
    slots_t = torch.tensor(slots, dtype=torch.long, device=device)
    cells_t = torch.tensor(cell_of, dtype=torch.long, device=device)
    return PackedLayout(
        cu_seqlens=cu,
        row_req=torch.cat([real_req, pad_zeros + batch]),
        row_q=torch.cat([real_q, pad_zeros]),
        positions=torch.cat([starts_t[real_req] + real_q, pad_zeros]),
        kv_slot=torch.cat([slots_t[real_req], pad_zeros + scratch_slot]),
        cell=torch.cat([cells_t[real_req] + real_q, pad_zeros + offset]),
        groups=groups,
        n_rows=n_rows,
        batch_size=batch,
        dense=pad == 0 and offset == n_rows and cell_of == list(itertools.accumulate(lens, initial=0))[:-1],
    )


def gather_rows(strided: torch.Tensor, layout: PackedLayout) -> torch.Tensor:
    """``[B, W, ...]`` -> packed ``[T, ...]``; padding rows read request 0's first row."""
    real = layout.row_req < layout.batch_size
    req = torch.where(real, layout.row_req, 0)
    q = torch.where(real, layout.row_q, 0)
    return strided[req, q]


def scatter_rows(packed: torch.Tensor, layout: PackedLayout, width: int) -> torch.Tensor:
    """Packed ``[T, ...]`` -> strided ``[B, width, ...]``; unfilled cells and padding are zero."""
    n = layout.n_rows
    out = packed.new_zeros(layout.batch_size, width, *packed.shape[1:])
    out[layout.row_req[:n], layout.row_q[:n]] = packed[:n]
    return out
