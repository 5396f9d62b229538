"""The trained models and STS file shipped under ``verify_runtime/assets/``.

``manifest.json`` describes each asset (file, size, parameters, version id,
validation figures, the corpus hash it was trained on). Checkpoints are stored
in half precision and load as float32; version ids are computed from the
loaded (rounded) weights, so they match what the engine reports at run time.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import NamedTuple

import torch

from sparkgate.policies.calibration import STS
from sparkgate.policies.outputs import written_whole

from .block_drafter import BlockDrafter, DSparkNet, load_drafter
from .model import Transformer, load_checkpoint, model_version, save_checkpoint

ASSETS = Path(__file__).parent / "assets"
MANIFEST = "manifest.json"
# manifest key -> file name
FILES = {"target": "target.pt", "drafter": "drafter.pt", "drafter_parallel": "drafter_parallel.pt", "sts": "sts.json"}
DRAFTER_VARIANTS = ("drafter", "drafter_parallel")


def drafter_variant(sequential: bool) -> str:
    """The asset key of a drafter: the DSpark drafter, or its pure-parallel ablation."""
    return DRAFTER_VARIANTS[0] if sequential else DRAFTER_VARIANTS[1]


class Shipped(NamedTuple):
    target: Transformer
    drafter: BlockDrafter
    sts: STS | None


def read_manifest(assets: Path = ASSETS) -> dict:
    path = Path(assets) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def record_asset(key: str, info: dict, assets: Path = ASSETS) -> None:
    """Set one manifest entry, keeping the others (written atomically)."""
    if key not in FILES and key != "corpus":
        raise ValueError(f"unknown asset {key!r}; expected one of {sorted(FILES) + ['corpus']}")
    manifest = read_manifest(assets)
    manifest[key] = info
    with written_whole(Path(assets) / MANIFEST) as partial:
        partial.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def ship_model(module: Transformer | DSparkNet, key: str, info: dict, assets: Path = ASSETS) -> dict:
    """Write ``module`` in half precision as asset ``key`` and record it; returns the manifest entry."""
    if key not in ("target", *DRAFTER_VARIANTS):
        raise ValueError(f"asset {key!r} is not a model; expected target or one of {DRAFTER_VARIANTS}")
    path = Path(assets) / FILES[key]
    save_checkpoint(copy.deepcopy(module).half(), path, extra=info)
    loaded = load_checkpoint(path)[0] if key == "target" else load_drafter(path)[0]
    entry = {
        **info,
        "file": FILES[key],
        "bytes": path.stat().st_size,
        "params": loaded.num_params,
        "version": model_version(loaded),
        "args": dataclasses.asdict(loaded.args),
    }
    record_asset(key, entry, assets)
    return entry


def ship_sts(sts: STS, assets: Path = ASSETS) -> dict:
    sts.save(Path(assets) / FILES["sts"])
    entry = {"file": FILES["sts"], "version": sts.version, "dataset": sts.dataset, "num_samples": sts.num_samples}
    record_asset("sts", entry, assets)
    return entry


def load_shipped_target(device: str | torch.device = "cpu", assets: Path = ASSETS) -> Transformer:
    return load_checkpoint(_require(assets, "target"), map_location=device)[0].to(device).eval()


def load_shipped(variant: str = "drafter", device: str | torch.device = "cpu", assets: Path = ASSETS) -> Shipped:
    """(target, drafter, sts) as shipped; ``variant="drafter_parallel"`` gives the pure-parallel
    ablation drafter. ``sts`` is None when no STS file was shipped."""
    if variant not in DRAFTER_VARIANTS:
        raise ValueError(f"variant must be one of {DRAFTER_VARIANTS}, got {variant!r}")
    target = load_shipped_target(device, assets)
    net, _ = load_drafter(_require(assets, variant), map_location=device)
    sts_path = Path(assets) / FILES["sts"]
    return Shipped(target, BlockDrafter(net), STS.load(sts_path) if sts_path.exists() else None)


def _require(assets: Path, key: str) -> Path:
    path = Path(assets) / FILES[key]
    if not path.exists():
        raise FileNotFoundError(
            f"no shipped {key} at {path}; train and ship one with `sparkgate train "
            f"{'target' if key == 'target' else 'drafter'} --ship`"
        )
    return path
