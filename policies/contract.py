"""The joint contract (docs/design.md §5): everything acceptance labels and step times are measured under.

The target, the drafter, the block length γ, the definition of a label, the STS
temperatures, the acceptance rule and the hardware are one contract: changing
any of them means evaluating again, not only checking that the model loads.
``Contract.fingerprint()`` is the short hash every step record carries
(``contract``); two records with the same fingerprint were measured under the
same contract, and the controller judges one contract at a time.

Left out on purpose, each for its reason:
- request temperatures: they are per request, sliced in every report, and a
  shift in them is traffic drift the calibration gates must catch, not a
  deployment that restarts the rollout;
- the cost table: it prices windows, it does not change what a label means, and
  the adaptive phase replaces it while the rollout goes on (a wrong one must
  fail the gates, not reset them).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

# y_k = 1 iff drafts 1..k were all accepted (docs/design.md §2). A new definition is a new string.
LABEL_DEFINITION = "prefix-survival/1"
# Lossless verification: the target's argmax for greedy requests, speculative rejection sampling otherwise.
ACCEPTANCE_RULE = "lossless/1"
FINGERPRINT_HEX = 16


@dataclass(frozen=True)
class Contract:
    """The parts of one contract. ``target`` names the target's weights and tokenizer (for sparkgate's own
    models the byte vocabulary is part of the weights' args, so their hash covers both); ``sts`` is None when
    confidences are used raw; ``hardware`` is the canonical text of the machine the cost table describes."""

    target: str
    drafter: str
    gamma: int
    sts: str | None
    hardware: str
    label: str = LABEL_DEFINITION
    sampling: str = ACCEPTANCE_RULE

    def fingerprint(self) -> str:
        """A stable short hash of every part: equal parts give equal fingerprints on every machine."""
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_HEX]


def hardware_text(fingerprint: dict[str, str]) -> str:
    """A hardware fingerprint (``cost_profile.hardware_fingerprint``) as one canonical string."""
    return json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
