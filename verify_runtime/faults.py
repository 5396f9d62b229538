"""Faults ``sparkgate replica --fault`` arms and fires on SIGUSR1, to rehearse a rollback.

- ``drift`` serves new requests at a sampling temperature the drafter's
  confidences and their STS calibration were never fitted on (they were fitted
  on greedy traffic), so the survival ECE drifts.
- ``cost-table`` loads a cost table fitted on an accelerator, forced past the
  fingerprint check, with the graph tiers it was measured at: verification looks
  free to the scheduler, which verifies whole blocks, and every step over the
  table's 32-row tiers runs eager (a tier miss).
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

from sparkgate.policies.cost_model import FingerprintMismatch, load_cost_table
from sparkgate.policies.cost_profile import hardware_fingerprint
from sparkgate.policies.vocabulary import Phase
from sparkgate.policies.window import CostAwareScheduler

from .arrivals import Arrivals
from .profiler import step_version
from .replica import Replica
from .tiers import measured_grid


class Fault(StrEnum):
    NONE = "none"
    DRIFT = "drift"
    COST_TABLE = "cost-table"


# A table measured on an accelerator: verifying a whole block costs about what one row does,
# so the scheduler verifies every draft, and that deployment captured graph tiers only up to
# 32 rows. The fingerprint names hardware this is not.
FOREIGN_COST_TABLE = {
    "bias_seconds": 0.006,
    "bs_probes": [1, 256],
    "alpha_seconds": [0.0, 0.002],
    "m_probes": [8, 32],
    "theta_seconds": [0.0, 0.0002],
    "meta": {
        "hardware": {
            "system": "Linux",
            "machine": "x86_64",
            "cpu": "Intel Xeon",
            "torch": "2.4.0+cu121",
            "device": "NVIDIA A10G",
        },
        "model": "other-model",
        "tiers": [8, 16, 24, 32],
        "created_at": "2024-06-01T00:00:00+00:00",
        "version": "foreign-a10g",
    },
}


def fire(fault: Fault, node: Replica, arrivals: Arrivals | None, drift_temperature: float, out_dir: Path | None) -> str:
    """Apply ``fault`` to the running replica; returns what was done, for the log."""
    if fault is Fault.DRIFT:
        if arrivals is None:
            raise ValueError("the drift fault needs an arrival process (--rate)")
        arrivals.temperature = drift_temperature
        return f"drift: new requests sample at temperature {drift_temperature}"
    path = (out_dir or Path(".")) / "foreign_cost_table.json"
    path.write_text(json.dumps(FOREIGN_COST_TABLE, indent=2) + "\n")
    engine = node.engine
    try:
        table = load_cost_table(
            path, hardware=hardware_fingerprint(engine.device), model=step_version(engine.model, engine.drafter)
        )
        refused = "accepted"
    except FingerprintMismatch as exc:
        refused = f"refused ({exc}), forced"
        table = load_cost_table(path, force=True)
    node.scheduler = CostAwareScheduler(table)
    engine.runner.grid = measured_grid(table.meta.tiers)
    engine.config.cost_table_version = table.meta.version
    if node.payload is not None and node.payload.phase is not Phase.FALLBACK:
        engine.policy = node.scheduler
    return f"cost-table: {path} {refused}"
