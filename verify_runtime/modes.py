"""The four verify modes of docs/design.md §3 and the labels each one yields.

| mode | verified | commit limit | full_accept |
|---|---|---|---|
| static | γ | γ | a* |
| shadow | γ (suggestion logged) | γ | a* |
| cap_accept | γ | w | a* (``cap_trim = a* - a``) |
| compact | w | w | a* if a < w or w = γ, else censored (None) |
"""

from __future__ import annotations

import torch

from sparkgate.collectors.schema import MODES


def mode_codes(modes: list[str], device: torch.device | str = "cpu") -> torch.Tensor:
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown verify mode(s) {unknown}; expected one of {list(MODES)}")
    return torch.tensor([MODES.index(m) for m in modes], dtype=torch.long, device=device)


def verify_plan(codes: torch.Tensor, windows: torch.Tensor, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(verified drafts, commit limit) per request, both ``[B]`` int64."""
    full = torch.full_like(windows, gamma)
    compact = codes == MODES.index("compact")
    capped = compact | (codes == MODES.index("cap_accept"))
    return torch.where(compact, windows, full), torch.where(capped, windows, full)


def labels(mode: str, window: int, accepted: int, full: int, gamma: int) -> tuple[int, int | None, int]:
    """(logged window, full_accept or None when censored, cap_trim) for one request."""
    if mode in ("static", "shadow"):
        return gamma, full, 0
    if mode == "cap_accept":
        return window, full, full - accepted
    censored = accepted == window < gamma
    return window, None if censored else full, 0
