"""Per-request KV cache slots with a committed length.

Layout per layer: ``[n_slots + 1, max_len, n_kv_heads, head_dim]``; the last slot
is scratch, written by padding rows and never read by a real request.

Invariant: for a slot with committed length ``n``, rows ``0 .. n-1`` hold the
K/V of the request's committed tokens (all but the pending last token). A
verify step writes candidate rows at ``n ..``; ``commit`` advances ``n`` by the
number of rows that were accepted. Rows at or past ``n`` are garbage that the
attention mask never admits, so a rejection needs no undo.
"""

from __future__ import annotations

import torch

from .model import ModelArgs


class CacheFull(RuntimeError):
    """No free slot is left."""


class KVCache:
    def __init__(
        self,
        args: ModelArgs,
        n_slots: int,
        max_len: int | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.max_len = max_len or args.max_seq_len
        if self.max_len > args.max_seq_len:
            raise ValueError(f"cache max_len={self.max_len} exceeds the model's max_seq_len={args.max_seq_len}")
        shape = (args.n_layers, n_slots + 1, self.max_len, args.n_kv_heads, args.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.n_slots = n_slots
        self.lengths = [0] * n_slots
        self._free = list(range(n_slots - 1, -1, -1))

    @property
    def scratch_slot(self) -> int:
        return self.n_slots

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise CacheFull(f"all {self.n_slots} cache slots are in use")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} is not allocated")
        self._free.append(slot)

    def commit(self, slot: int, rows: int) -> None:
        """Make ``rows`` more rows of ``slot`` part of its committed prefix."""
        new = self.lengths[slot] + rows
        if rows < 0 or new > self.max_len:
            raise ValueError(f"commit of {rows} rows takes slot {slot} to {new}, outside [0, {self.max_len}]")
        self.lengths[slot] = new
