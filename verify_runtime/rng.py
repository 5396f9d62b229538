"""Counter-based randomness keyed by (request seed, absolute position, stream).

A uniform drawn for a request at a position never depends on the batch it ran
in, the window it verified or how many steps it took to get there. That is what
makes ``cap_accept`` and ``compact`` with the same windows commit identical
tokens (docs/design.md §3, invariant 3). Pure tensor ops: no host sync on CUDA.
"""

from __future__ import annotations

import torch

# Independent streams: a draft token, its accept test and a resampled token at
# the same position must use independent uniforms for the sampler to be lossless.
DRAFT, ACCEPT, SAMPLE, NOISE = 1, 2, 3, 4

_MASK64 = (1 << 64) - 1


def _to_signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _to_signed(0x9E3779B97F4A7C15)
_M1 = _to_signed(0xBF58476D1CE4E5B9)
_M2 = _to_signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    # Logical shift right on int64 (torch's >> is arithmetic).
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser on int64 tensors (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniform(seed: torch.Tensor, position: torch.Tensor, stream: int, lanes: int | None = None) -> torch.Tensor:
    """Uniforms in [0, 1) (float64) for broadcast ``seed`` and ``position`` int64 tensors.

    With ``lanes`` a trailing axis of that many independent uniforms is added
    (used for per-vocabulary noise).
    """
    key = splitmix64(splitmix64(seed.long()) ^ (position.long() * 8 + stream))
    if lanes is not None:
        key = splitmix64(key.unsqueeze(-1) + torch.arange(lanes, device=key.device) * _GOLDEN)
    else:
        key = splitmix64(key)
    return _shr(key, 11).double() * (1.0 / (1 << 53))


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample from ``probs [..., V]`` (need not be normalised) with ``u [...]``."""
    cdf = probs.double().cumsum(-1)
    target = (u * cdf[..., -1]).unsqueeze(-1)
    # right=True skips zero-probability tokens: their cdf equals their left neighbour's.
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)
