"""The joint contract in the controller (docs/design.md §6): a rollout judges one contract at a time.

The rollout pins the contract it judges (``RolloutState.contract``, carried by
every decision). Each interval ``read`` says which contracts the window's steps
carry, and ``rollout.decide`` acts on it:
- a window that mixes contracts (a rolling update under way) cannot be judged:
  its interval is inconclusive, whatever the gates say;
- a window whose one contract is not the pinned one starts the evaluation again,
  as a decision: back to shadow, or to baseline when the new contract has no
  baseline steps to compare latency with;
- the first contract seen is pinned without a decision of its own.
The references the gates compare with (baseline latency, the acceptance
reference) are read for the contract being judged only (``queries.SameContract``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkgate.collectors.store import Store
from sparkgate.policies.vocabulary import Phase

from . import queries
from .queries import CONTRACT_FIELDS, SameContract, Slice, Window


@dataclass(frozen=True)
class ContractReading:
    """The window's contracts (``seen``, most steps first, with their step counts), what tells the pinned
    contract and the window's apart (``differs``: record fields, or the parts records do not carry), and
    whether the window's contract has baseline steps of its own (``in_baseline``)."""

    pinned: str | None
    seen: tuple[str | None, ...] = ()
    steps: tuple[int, ...] = ()
    differs: tuple[str, ...] = ()
    in_baseline: bool = True

    @property
    def mixed(self) -> bool:
        return len(self.seen) > 1

    @property
    def judged(self) -> str | None:
        """The contract this interval's figures are read for: the window's one contract, else the pinned."""
        return self.seen[0] if len(self.seen) == 1 else self.pinned

    @property
    def changed(self) -> bool:
        """The window is on one contract that is not the pinned one (a first contract is no change)."""
        return len(self.seen) == 1 and self.pinned is not None and self.seen[0] != self.pinned

    def reference(self) -> SameContract:
        return SameContract(self.judged)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pinned": self.pinned,
            "seen": dict(zip(self.seen, self.steps)),
            "differs": list(self.differs),
        }


def _differs(old: dict[str, Any] | None, new: dict[str, Any]) -> tuple[str, ...]:
    if old is None:
        return ("(the pinned contract has no steps left in the store)",)
    fields = tuple(f"{f}: {old[f]} -> {new[f]}" for f in CONTRACT_FIELDS if old[f] != new[f])
    return fields or ("hardware, label definition or acceptance rule (not carried in records)",)


def read(store: Store, window: Window, pinned: str | None) -> ContractReading:
    """The contracts of the window's steps against ``pinned``."""
    rows = queries.contracts(store, window, Slice())
    reading = ContractReading(pinned, tuple(r["contract"] for r in rows), tuple(r["steps"] for r in rows))
    if not reading.changed:
        return reading
    in_baseline = queries.contract_fields(store, SameContract(reading.seen[0]), Phase.BASELINE) is not None
    return ContractReading(
        pinned,
        reading.seen,
        reading.steps,
        _differs(queries.contract_fields(store, SameContract(pinned)), rows[0]),
        in_baseline,
    )
