"""Switchback epochs (docs/design.md §6): the concurrent control the latency and throughput gates compare with.

Compact verification shortens every request's step in a mixed batch, so arms of
requests inside one batch cannot separate a latency effect. Instead each replica
alternates whole epochs: in a ``treatment`` epoch it serves the phase's policy,
in a ``control`` epoch the baseline's (every request static). Epoch ``e`` spans
``[origin + e * epoch_s, origin + (e + 1) * epoch_s)``.

Invariants:
- the schedule is a pure function of (seed, replica, epoch): every party that
  knows the payload computes the same arms;
- it is balanced in pairs: epochs ``2k`` and ``2k + 1`` of a replica hold one
  treatment and one control, in an order drawn from (seed, replica, k), so a
  load swing slower than a pair affects both arms alike and neither arm can run
  more than two epochs in a row;
- replicas draw their orders independently, so at any moment about half the
  fleet is in each arm.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from sparkgate.policies.vocabulary import Arm


@dataclass(frozen=True)
class Switchback:
    """A schedule: ``seed``, epoch length ``epoch_s`` and ``origin`` (unix seconds of epoch 0)."""

    seed: int
    epoch_s: float
    origin: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epoch_s) and self.epoch_s > 0):
            raise ValueError(f"epoch_s={self.epoch_s!r}: expected a finite number of seconds > 0")
        if not math.isfinite(self.origin):
            raise ValueError(f"origin={self.origin!r}: expected finite unix seconds")

    def epoch(self, ts: float) -> int:
        """The epoch holding unix time ``ts`` (negative before the origin): the ``e`` with ``start(e) <= ts <
        start(e + 1)`` as ``start`` computes them. The division alone rounds ``start(e)`` into epoch ``e - 1``
        for most epoch lengths, which left a walk over epochs (the simulated fleet's) stuck on a boundary."""
        e = math.floor((ts - self.origin) / self.epoch_s)
        while self.start(e) > ts:
            e -= 1
        while self.start(e + 1) <= ts:
            e += 1
        return e

    def start(self, epoch: int) -> float:
        return self.origin + epoch * self.epoch_s

    def arm(self, replica_id: str, epoch: int) -> Arm:
        """The arm ``replica_id`` serves in ``epoch``."""
        pair, second = divmod(epoch, 2)
        digest = hashlib.blake2b(f"{self.seed}/{replica_id}/{pair}".encode(), digest_size=1).digest()
        treatment_first = digest[0] & 1 == 0
        return Arm.TREATMENT if treatment_first != bool(second) else Arm.CONTROL
