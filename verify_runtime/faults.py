"""Faults ``sparkgate replica --fault`` arms and fires on SIGUSR1, to rehearse a rollback.

- ``drift`` serves new requests at a sampling temperature the drafter's
  confidences and their STS calibration were never fitted on (they were fitted
  on greedy traffic), so the survival ECE drifts.
- ``cost-table`` loads a cost table fitted on an accelerator, forced past the
  fingerprint check, with the graph tiers it was measured at: verification looks
  free to the scheduler, which verifies whole blocks, and every step over the
  table's 32-row tiers runs eager (a tier miss).
- ``slow-verify`` makes the treatment's verification slower on this replica: after
  each verify call in a treatment epoch the replica busy-waits for
  ``SLOW_VERIFY_EXTRA`` of the time the call took, so the extra cost scales with
  the rows verified, as a slower kernel's would. Control epochs run untouched,
  so only a comparison against a concurrent control can tell.
- ``load-shift`` changes what a step costs without anything being wrong: new
  requests carry prompts of ``LOAD_SHIFT_PROMPT_LEN`` tokens instead of 96, so
  every verified row attends over a longer context (about 30% more CPU time per
  step here) and the offline table goes stale. Adaptive must refit the table;
  nothing should roll back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from sparkgate.policies.cost_model import FingerprintMismatch, load_cost_table
from sparkgate.policies.cost_profile import hardware_fingerprint
from sparkgate.policies.vocabulary import Arm
from sparkgate.policies.window import CostAwareScheduler

from .arrivals import Arrivals
from .engine import Request
from .profiler import step_version
from .replica import Replica
from .tiers import measured_grid


class Fault(StrEnum):
    NONE = "none"
    DRIFT = "drift"
    COST_TABLE = "cost-table"
    SLOW_VERIFY = "slow-verify"
    LOAD_SHIFT = "load-shift"


# The slow-verify fault's extra verify time, a fraction of what the call took (verification about 25%
# slower, about 15% slower steps on this CPU, where verification is most of a step).
SLOW_VERIFY_EXTRA = 0.25
LOAD_SHIFT_PROMPT_LEN = 384


@dataclass(frozen=True)
class FaultSize:
    """How large the faults that have a size are when they fire."""

    drift_temperature: float = 3.0  # the drift fault's sampling temperature for new requests
    slow_verify_extra: float = SLOW_VERIFY_EXTRA  # extra verify time in treatment epochs, a fraction


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


def fire(
    fault: Fault,
    node: Replica,
    arrivals: Arrivals | None,
    size: FaultSize,
    out_dir: Path | None,
    shifted: Iterator[Request] | None = None,
) -> str:
    """Apply ``fault`` to the running replica; returns what was done, for the log. ``shifted`` is the
    workload of long prompts the load shift serves from then on."""
    if fault in (Fault.DRIFT, Fault.LOAD_SHIFT) and arrivals is None:
        raise ValueError(f"the {fault} fault needs an arrival process (--rate)")
    if fault is Fault.DRIFT:
        assert arrivals is not None
        arrivals.temperature = size.drift_temperature
        return f"drift: new requests sample at temperature {size.drift_temperature}"
    if fault is Fault.SLOW_VERIFY:
        slow_verify(node.engine, size.slow_verify_extra)
        return f"slow-verify: treatment verification {size.slow_verify_extra:.0%} slower"
    if fault is Fault.LOAD_SHIFT:
        assert arrivals is not None and shifted is not None
        arrivals.source = shifted
        return f"load-shift: new requests carry {LOAD_SHIFT_PROMPT_LEN}-token prompts"
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
    node.use_static(CostAwareScheduler(table))
    engine.runner.grid = measured_grid(table.meta.tiers)
    node.switch()
    return f"cost-table: {path} {refused}"


def slow_verify(engine, extra: float = SLOW_VERIFY_EXTRA) -> None:
    """Wrap ``engine``'s verify so that treatment epochs take ``1 + extra`` times as long."""
    verify = engine.runner.verify

    def slower(*args, **kwargs):
        start = time.perf_counter()
        out = verify(*args, **kwargs)
        if engine.config.arm == Arm.TREATMENT:
            until = time.perf_counter() + extra * (time.perf_counter() - start)
            while time.perf_counter() < until:  # a busy wait: the core is taken, as by a slower kernel
                pass
        return out

    engine.runner.verify = slower
