"""Sequential Temperature Scaling (STS) and the calibration metrics it is judged by.

STS gives depth k a temperature ``T_k`` applied to the raw conditional confidence
in logit space, ``c'_k = σ(logit(c_k) / T_k)``, and reports the calibrated prefix
survival ``S_k = Π_{i≤k} c'_i``. Temperatures are fitted left to right
(docs/design.md §5): depth k's is the point of a log-spaced grid that minimises the survival ECE
of ``S_k`` with the earlier depths' temperatures frozen. A positive temperature
is a monotone map, so the order of confidences at a depth is preserved.

The file layout is SGLang's: ``{"temperatures": [γ], "dataset", "num_samples",
"ece_before": [γ], "ece_after": [γ]}``.

Metrics follow docs/design.md §2: 15 equal-width bins ``[k/15, (k+1)/15)``, the last one
closed, over the rows where the label is observed.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from sparkgate.policies import json_text
from sparkgate.policies.binning import EDGES, N_BINS
from sparkgate.policies.errors import InputError
from sparkgate.policies.outputs import written_whole

_INNER_EDGES = torch.tensor(EDGES[1:-1], dtype=torch.float64)
DEFAULT_GRID = torch.logspace(math.log10(0.05), math.log10(20.0), 241, dtype=torch.float64)
_EPS = 1e-6


class STSFormatError(InputError):
    """A malformed STS file or object; the message names the field and value."""


def bin_index(p: torch.Tensor) -> torch.Tensor:
    """``binning.bin_index`` on a tensor, on its device: k with k/15 <= p < (k+1)/15, the last bin for p = 1."""
    return torch.bucketize(p.double().contiguous(), _INNER_EDGES.to(p.device), right=True)


def batched_ece(pred: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """ECE of each row of ``pred [G, N]`` against labels ``y [N]``: ``[G]`` (NaN when N = 0).

    ``weight [G, N]`` counts each row that many times (a bootstrap resample); ``pred``
    may then be ``[1, N]``.
    """
    w = torch.ones_like(pred, dtype=torch.float64) if weight is None else weight.double()
    pred = pred.double()
    weighted = (pred - y.double()) * w  # has the broadcast shape of pred, y and w
    pred, w = pred.expand_as(weighted), w.expand_as(weighted)
    index = bin_index(pred)
    gap = torch.zeros(pred.shape[0], N_BINS, dtype=torch.float64, device=pred.device)
    gap.scatter_add_(1, index, weighted)
    return gap.abs().sum(1) / w.sum(1)


def _observed_columns(
    values: torch.Tensor, labels: torch.Tensor, observed: torch.Tensor | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per depth, the (values, labels) of rows whose label is observed."""
    for k in range(values.shape[1]):
        keep = slice(None) if observed is None else observed[:, k].bool()
        yield values[keep, k], labels[keep, k]


def ece_per_depth(survival: torch.Tensor, labels: torch.Tensor, observed: torch.Tensor | None = None) -> list[float]:
    """Survival ECE per depth of ``survival [N, γ]`` against ``labels [N, γ]`` (``nan`` where no rows)."""
    return [float(batched_ece(s[None], y)[0]) for s, y in _observed_columns(survival, labels, observed)]


def brier_per_depth(survival: torch.Tensor, labels: torch.Tensor, observed: torch.Tensor | None = None) -> list[float]:
    return [float(((s.double() - y.double()) ** 2).mean()) for s, y in _observed_columns(survival, labels, observed)]


def auroc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Area under the ROC curve (Mann–Whitney, ties count half); None without both classes."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels).astype(bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        return None
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based rank shared by tied scores
    rank_sum = mean_rank[inverse][labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def auroc_per_depth(
    survival: torch.Tensor, labels: torch.Tensor, observed: torch.Tensor | None = None
) -> list[float | None]:
    return [auroc(s.cpu().numpy(), y.cpu().numpy()) for s, y in _observed_columns(survival, labels, observed)]


def reliability(pred: torch.Tensor, y: torch.Tensor) -> list[dict[str, float]]:
    """Per non-empty bin: edges, count, mean prediction and observed frequency."""
    index = bin_index(pred)
    rows: list[dict[str, float]] = []
    for b in range(N_BINS):
        inside = index == b
        n = int(inside.sum())
        if n:
            rows.append(
                {
                    "lo": b / N_BINS,
                    "hi": (b + 1) / N_BINS,
                    "count": n,
                    "mean_p": float(pred[inside].double().mean()),
                    "freq_y": float(y[inside].double().mean()),
                }
            )
    return rows


def scale_confidence(confidence: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
    """``σ(logit(c) / T)``, broadcasting ``temperature`` against ``confidence``."""
    c = confidence.clamp(_EPS, 1 - _EPS)
    return torch.sigmoid((torch.log(c) - torch.log1p(-c)) / temperature)


@dataclass
class STS:
    temperatures: list[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: list[float] = field(default_factory=list)
    ece_after: list[float] = field(default_factory=list)
    # sparkgate's addition to SGLang's layout: the drafter version (records' drafter_version) the temperatures
    # were fitted for, so a replica can refuse them for another drafter; "" when unknown (an SGLang file).
    drafter: str = ""

    def __post_init__(self) -> None:
        _validate(asdict(self), "STS")
        self.temperatures = [float(t) for t in self.temperatures]
        # Not a field (asdict and equality skip it): the temperatures already on each device,
        # so a step copies nothing from the host and the stage stays graph-capturable.
        self._on_device: dict[tuple[torch.device, torch.dtype, tuple[float, ...]], torch.Tensor] = {}

    @property
    def gamma(self) -> int:
        return len(self.temperatures)

    @property
    def version(self) -> str:
        """A content id of the temperatures (what changes behaviour), for ``sts_version``."""
        return "sts-" + hashlib.sha256(json.dumps([round(t, 9) for t in self.temperatures]).encode()).hexdigest()[:12]

    def calibrated(self, confidence: torch.Tensor) -> torch.Tensor:
        """Calibrated conditional confidences ``c'`` for raw ``confidence [..., γ]``."""
        if confidence.shape[-1] != self.gamma:
            raise ValueError(f"confidence has {confidence.shape[-1]} depths, this STS has gamma={self.gamma}")
        key = (confidence.device, confidence.dtype, tuple(self.temperatures))
        t = self._on_device.get(key)
        if t is None:
            t = self._on_device[key] = torch.tensor(self.temperatures, dtype=confidence.dtype, device=confidence.device)
        return scale_confidence(confidence, t)

    def __call__(self, confidence: torch.Tensor) -> torch.Tensor:
        """Calibrated survival ``S [..., γ]``: the engine's ``calibrate`` hook."""
        return self.calibrated(confidence).cumprod(-1)

    def to_dict(self) -> dict[str, Any]:
        """SGLang's layout, plus ``drafter`` when it is known (as cost tables carry sparkgate's ``meta``)."""
        data = asdict(self)
        if not data["drafter"]:
            del data["drafter"]
        return data

    @classmethod
    def from_dict(cls, data: object, source: str = "STS") -> STS:
        known = _validate(data, source)
        names = ("temperatures", "dataset", "num_samples", "ece_before", "ece_after", "drafter")
        return cls(**{k: known[k] for k in names if k in known})

    def save(self, path: str | Path) -> None:
        """Writes ``path`` whole or leaves what it held (``shipped.ship_sts`` does not wrap it)."""
        with written_whole(path) as partial:
            partial.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> STS:
        try:
            data = json_text.loads(Path(path).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise STSFormatError(f"{path}: not JSON ({exc})") from exc
        return cls.from_dict(data, str(path))


def _validate(data: object, source: str) -> dict[str, Any]:
    """``data`` itself once it is a well-formed STS object; raises ``STSFormatError`` otherwise."""

    def fail(name: str, value: object, why: str) -> NoReturn:
        raise STSFormatError(f"{source}: {name}={value!r}: {why}")

    if not isinstance(data, dict):
        fail("<root>", type(data).__name__, "expected a JSON object")
    temps = data.get("temperatures")
    if not isinstance(temps, list) or not temps:
        fail("temperatures", temps, "expected a non-empty list with one temperature per depth")
    for i, t in enumerate(temps):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            fail(f"temperatures[{i}]", t, "must be a finite number > 0")
    for name in ("dataset", "drafter"):
        if not isinstance(data.get(name, ""), str):
            fail(name, data[name], "expected a string")
    n = data.get("num_samples", 0)
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        fail("num_samples", n, "expected an integer >= 0")
    for name in ("ece_before", "ece_after"):
        values = data.get(name, [])
        if not isinstance(values, list) or (values and len(values) != len(temps)):
            fail(name, values, f"expected a list of {len(temps)} values (one per depth) or none")
        for i, v in enumerate(values):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                fail(f"{name}[{i}]", v, "must be a number in [0, 1]")
    return data


def _log_loss(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean log loss of each row of ``pred [G, N]`` against ``y [N]``; survivals are clamped off 0 and 1
    so that one confident miss costs a bounded amount."""
    p = pred.clamp(1e-12, 1 - 1e-12)
    return -(y * p.log() + (1 - y) * (-p).log1p()).mean(-1)


def fit_sts(
    confidence: torch.Tensor,
    labels: torch.Tensor,
    observed: torch.Tensor | None = None,
    grid: torch.Tensor = DEFAULT_GRID,
    dataset: str = "",
    drafter: str = "",
) -> STS:
    """Fit per-depth temperatures left to right on raw ``confidence [N, γ]`` against
    survival labels ``labels [N, γ]`` (``y_k = 1[a* >= k]``), using at depth k only rows
    where ``observed[:, k]`` (all rows when None).

    Each temperature minimises the mean log loss of the survival at its depth, a
    proper scoring rule: it is least at T = 1 for confidences that are already right,
    where binned ECE is least for a huge temperature that squeezes every survival
    into the bin around 0.5. Among grid points with the same loss the one nearest
    T = 1 wins.
    """
    if confidence.dim() != 2 or confidence.shape != labels.shape:
        raise ValueError(
            f"confidence {tuple(confidence.shape)} and labels {tuple(labels.shape)} must both be [N, gamma]"
        )
    if observed is not None and observed.shape != labels.shape:
        raise ValueError(f"observed has shape {tuple(observed.shape)}, expected {tuple(labels.shape)}")
    if (grid <= 0).any():
        raise ValueError("temperature grid values must be > 0")
    confidence, labels, grid = confidence.double(), labels.double(), grid.double().to(confidence.device)
    obs = torch.ones_like(labels, dtype=torch.bool) if observed is None else observed.bool()
    if not obs.any(0).all():
        raise ValueError(f"no observed labels at depth(s) {(~obs.any(0)).nonzero().flatten().add(1).tolist()}")
    prefix = torch.ones(confidence.shape[0], dtype=torch.float64, device=confidence.device)
    temperatures = []
    for k in range(confidence.shape[1]):
        rows = obs[:, k]
        candidates = prefix[rows] * scale_confidence(confidence[rows, k][None], grid[:, None])
        loss = _log_loss(candidates, labels[rows, k])
        tied = loss <= loss.min() + 1e-12
        best = int(torch.where(tied, grid.log().abs(), torch.inf).argmin())
        temperatures.append(float(grid[best]))
        prefix = prefix * scale_confidence(confidence[:, k], grid[best])
    sts = STS(temperatures, dataset=dataset, num_samples=int(confidence.shape[0]), drafter=drafter)
    sts.ece_before = ece_per_depth(confidence.cumprod(-1), labels, obs)
    sts.ece_after = ece_per_depth(sts(confidence), labels, obs)
    return sts
