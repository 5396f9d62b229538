"""The models, calibration and cost table that commands use when not told otherwise.

Shipped assets (``verify_runtime/assets/``) win when present; otherwise a seeded
random target of the default size and the n-gram stand-in drafter. A cost table
must match this machine, target and drafter (it times whole decode steps): the
shipped one is used when its fingerprint matches, else the profiler measures one
here (cached per target and drafter under ``~/.cache/sparkgate``) rather than
trusting numbers from other hardware.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sparkgate.policies.calibration import STS
from sparkgate.policies.cost_model import (
    CostTable,
    CostTableError,
    load_cost_table,
    save_cost_table,
)
from sparkgate.policies.cost_profile import hardware_fingerprint

from .block_drafter import BlockDrafter, load_drafter
from .drafters import Drafter, NGramDrafter
from .model import ModelArgs, Transformer, model_version, read_checkpoint
from .shipped import ASSETS, FILES, load_shipped_target, read_manifest

# Profiled for the shipped target and drafter: on this project's 2-core CPU class, and on one
# H200 with graph replay. A table is used only where its fingerprint matches.
SHIPPED_COST_TABLES = (ASSETS / "cost_table_cpu.json", ASSETS / "cost_table_h200.json")
CACHE_DIR = Path(os.environ.get("SPARKGATE_CACHE", Path.home() / ".cache" / "sparkgate"))


def default_target_args() -> ModelArgs:
    """The shape of ``default_target()``, read without building it: what a command checks its options
    against before the run loads the model."""
    if (ASSETS / FILES["target"]).exists():
        return ModelArgs(**read_checkpoint(ASSETS / FILES["target"])[0])
    return ModelArgs()


def default_target(seed: int = 0) -> Transformer:
    """The shipped target, or (before one is trained) a seeded random one of the default size."""
    if (ASSETS / FILES["target"]).exists():
        return load_shipped_target()
    torch.manual_seed(seed)
    return Transformer(ModelArgs()).eval()


def default_drafter(target: Transformer) -> Drafter:
    """The shipped block drafter when ``target`` is the model it was trained against, else n-gram."""
    manifest = read_manifest()
    shipped_target = manifest.get("target", {}).get("version")
    if (ASSETS / FILES["drafter"]).exists() and shipped_target == model_version(target):
        return BlockDrafter(load_drafter(ASSETS / FILES["drafter"], map_location=target.output.weight.device)[0])
    return NGramDrafter(target.args.vocab_size)


def default_calibration(drafter: Drafter, path: Path | None = None) -> STS | None:
    """The STS file (default: the shipped one) for ``drafter``, a block drafter (None: raw running products).

    A file fitted for another drafter (its ``drafter`` names another version) is refused: temperatures fit one
    drafter's confidences, and serving them under another would be calibration in name only."""
    path = ASSETS / FILES["sts"] if path is None else path
    if not isinstance(drafter, BlockDrafter) or not path.exists():
        return None
    sts = STS.load(path)
    if sts.drafter and sts.drafter != drafter.version:
        raise ValueError(
            f"{path}: fitted for drafter {sts.drafter}, but this replica runs drafter {drafter.version}; "
            "refit it with `sparkgate calibrate` on this drafter's records"
        )
    return sts


def default_cost_table(
    target: Transformer, drafter: Drafter, path: str | Path | None = None, *, quick: bool = True, graphs: bool = False
) -> tuple[CostTable, str]:
    """(table, where it came from). An explicit ``path`` must match or it is an error; a table
    profiled here times graph-replayed steps when ``graphs`` (the engines it serves use them)."""
    from .profiler import profile_model, step_version

    device = target.output.weight.device
    hardware, model = hardware_fingerprint(device), step_version(target, drafter)
    if path is not None:
        return load_cost_table(path, hardware=hardware, model=model), str(path)
    # step_version is TARGET+DRAFTER: reuse it rather than hash the target's weights again.
    cached = CACHE_DIR / f"cost_table-{model.replace('+', '-')}{'-graphs' * graphs}.json"
    for candidate in (*SHIPPED_COST_TABLES, cached):
        if candidate.exists():
            try:
                return load_cost_table(candidate, hardware=hardware, model=model), str(candidate)
            except CostTableError:
                continue  # measured elsewhere or for another model: profile here instead
    if quick:
        profile = profile_model(
            target, drafter, graphs=graphs, batches=(1, 8, 32, 64), fractions=(0.0, 0.3, 0.6, 1.0), repeats=3
        )
    else:
        profile = profile_model(target, drafter, graphs=graphs)
    table = profile.table
    cached.parent.mkdir(parents=True, exist_ok=True)
    save_cost_table(table, cached)
    return table, f"profiled here ({cached})"
