"""The fitted cost table a replica serves in adaptive, swapped in whole or not at all.

A replica starts from a static table (its group's name) and its scheduler.
When the payload names a fitted table for that group, the replica fetches it,
checks it was made for this replica (the static table's hardware and model
fingerprints and graph tiers: the engine captured its graphs for those tiers),
and only then replaces the fitted ``(version, scheduler)`` pair in one
assignment, so a step never sees a half-swapped table. A table that fails the
check is refused with its reason (kept in ``refused``, logged, counted) and the
replica goes on with what it had; it is not fetched again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from sparkgate.policies.cost_model import CostTable, CostTableError, check_fingerprint, parse_cost_table
from sparkgate.policies.window import CostAwareScheduler

log = logging.getLogger(__name__)


def check_for(static: CostTable, fetched: CostTable, version: str) -> None:
    """Raise ``CostTableError`` naming why ``fetched`` cannot replace ``static`` on this replica."""
    if fetched.meta.version != version:
        raise CostTableError(f"meta.version: asked for {version!r}, got {fetched.meta.version!r}")
    check_fingerprint(fetched, hardware=static.meta.hardware, model=static.meta.model)
    if fetched.meta.tiers != static.meta.tiers:
        raise CostTableError(
            f"meta.tiers: table has {list(fetched.meta.tiers)}, this replica captured {list(static.meta.tiers)}"
        )


class TableSwap:
    """The fitted table in force (None: the static one) for a replica whose scheduler is cost-aware."""

    def __init__(self, scheduler: CostAwareScheduler):
        self.static = scheduler
        self.fitted: tuple[str, CostAwareScheduler] | None = None
        self.refused: dict[str, str] = {}

    @property
    def group(self) -> str | None:
        """The replica group: the static table's version."""
        return self.static.cost_table.meta.version

    def follow(self, cost_tables: dict[str, str], fetch: Callable[[str], Any]) -> bool:
        """Serve what ``cost_tables`` names for this group (nothing named: the static table). ``fetch``
        returns a version's JSON. Returns whether the table in force changed."""
        want = cost_tables.get(self.group or "")
        have = self.fitted[0] if self.fitted else None
        if want == have or want in self.refused:
            return False
        if want is None:
            self.fitted = None
            return True
        try:
            table = parse_cost_table(fetch(want))
            check_for(self.static.cost_table, table, want)
        except (CostTableError, ValueError) as exc:
            self.refused[want] = str(exc)
            log.warning("cost table %s refused, keeping %s: %s", want, have or self.group, exc)
            return False
        self.fitted = (want, dataclasses.replace(self.static, cost_table=table))
        log.info("cost table %s in force (was %s)", want, have or self.group)
        return True

    def current(self, fitted: bool) -> tuple[str | None, CostAwareScheduler]:
        """(version, scheduler) to serve: the fitted table's when ``fitted`` and there is one."""
        if fitted and self.fitted is not None:
            return self.fitted
        return self.group, self.static
