"""``sparkgate backtest``: a store's history replayed through a rollout policy, acting on nothing
(docs/design.md §6).

At every time the stored controller decided (the ledger, oldest first), the replay evaluates what the
store holds up to that time through the given policy's gates and state machine, with the same code
``serve`` runs (``Replay`` is a ``Controller`` whose decisions stay in memory and whose every read is
bounded at the replayed time). Operator actions are replayed as they were taken, and skipped, saying
so, where the replayed state does not allow them; so are the stored cost-table publications of adaptive
(the replay fits no table of its own). Nothing is written: not the ledger, not a table, not an actuator.

What a replay can and cannot say: records were produced under the stored rollout's phases. While the
replayed ladder agrees with the stored one, the replay is exact (given the same policy, it reproduces
the stored decisions). Once it departs, a gate reads the records of the replayed stage's window, which
were served under the stored stage: a stricter policy's earlier rollback is meaningful, a looser
policy's advance past what was served is not evidence about the rung it advanced to. Comparisons read
the epochs of the replayed revision only, so after a departure they are inconclusive.

What the store does not hold is replayed as the controller had it: each stored decision's collector
errors (its ``collector`` verdicts: a poller that could not read its server) come back at its time; a
fleet split by server (``serve --sglang``) is compared by the same groups when given the same URLs
(``--sglang``); a PromQL gate asks Prometheus (``--prometheus``) for the value at the replayed time, which
reproduces the controller's while Prometheus still holds that time.

Reads are bounded by record time, not by arrival: records a replica posted late (its spool, after an
outage) with times before a decision are read by the replay of that decision, though the controller
never saw them. Up to the first departure, where both judged one stage, a row names every gate whose
sample count differs from the stored verdict's (``samples_differ``), so a difference in evidence is
shown, not taken for a difference in policy.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import click

from sparkgate.collectors.store import Store
from sparkgate.policies.cli_types import HttpUrl, PastTime
from sparkgate.policies.policy_cli import policy_option
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import CHANGES_POLICY, Action

from . import ledger, promql, rollout
from .actuators import arms
from .rollout import TransitionError
from .rollout_state import Decision, RolloutState, apply
from .supervisor import Controller


class Replay(Controller):
    """A controller that keeps its decisions in memory and reads the store as of ``clock()``: it starts
    where the stored ledger stood at that time (``resumed``), or with a new rollout where it held none."""

    def _resume(self) -> RolloutState:
        self.decisions: list[Decision] = []
        try:
            resumed = ledger.load_state(self.store, self.policy, before=self.clock())
        except LookupError as exc:
            raise click.ClickException(f"the stored rollout then was on a stage this policy lacks: {exc}") from None
        self.resumed = resumed is not None
        return resumed if resumed is not None else self._commit(None, rollout.start(self.policy, self.clock()))

    def _commit(self, state: RolloutState | None, decision: Decision) -> RolloutState:
        self.decisions.append(decision)
        self.state = apply(state, decision)
        return self.state

    def _until(self, now: float) -> float | None:
        return now

    def _adapt(self, now: float) -> list[Decision]:
        return []  # fitting writes a table: the stored publications are replayed instead (``replay``)

    def republish(self, stored: Decision) -> Decision:
        """The stored table publication, in the replayed state (raises ``TransitionError`` outside adaptive)."""
        rule = stored.reasons[0]
        detail = {k: v for k, v in rule.items() if k not in ("rule", "group", "version")}
        decision = rollout.publish_table(self.state, stored.decided_at, rule["group"], rule["version"], detail)
        self._commit(self.state, decision)
        return decision


@dataclass(frozen=True)
class Row:
    """One stored decision beside the replay's at the same time."""

    at: float
    stored: Decision
    replayed: Decision | None  # None: an operator action the replayed state did not allow
    note: str = ""
    # gate -> [samples stored, samples replayed], where the two judged one stage and read different evidence
    samples_differ: dict[str, list[int]] = field(default_factory=dict)

    @property
    def agrees(self) -> bool:
        return self.replayed is not None and _key(self.stored) == _key(self.replayed)

    def to_dict(self, origin: float) -> dict:
        return {
            "at_s": round(self.at - origin, 3),
            "stored": _brief(self.stored),
            "replayed": None if self.replayed is None else _brief(self.replayed),
            "agrees": self.agrees,
            **({"note": self.note} if self.note else {}),
            **({"samples_differ": self.samples_differ} if self.samples_differ else {}),
        }


def _key(d: Decision) -> tuple:
    return d.action, d.phase_to, round(d.compact_fraction, 9), d.outcome


def _samples_differ(stored: Decision, replayed: Decision) -> dict[str, list[int]]:
    """Gates judged on a different number of samples by the replay than by the controller."""
    before = {r["gate"]: r["samples"] for r in stored.reasons[1:] if "gate" in r and "samples" in r}
    return {
        r["gate"]: [before[r["gate"]], r["samples"]]
        for r in replayed.reasons[1:]
        if r.get("gate") in before and "samples" in r and r["samples"] != before[r["gate"]]
    }


def _with_evidence(rows: list[Row]) -> list[Row]:
    """``rows`` with ``samples_differ`` set on each row up to the first disagreement (where the two judged
    the same stage): reads are bounded by record time, so records that arrived after a decision with
    earlier times, or records since removed, make the replay read what the controller did not."""
    out, agreed = [], True
    for row in rows:
        if agreed and row.replayed is not None:
            row = replace(row, samples_differ=_samples_differ(row.stored, row.replayed))
        agreed = agreed and row.agrees
        out.append(row)
    return out


def _brief(d: Decision) -> dict:
    failing = [r["gate"] for r in d.reasons[1:] if r.get("outcome") == "fail" and not r.get("dry_run")]
    return {"action": d.action, "phase": d.phase_to, "compact_fraction": d.compact_fraction,
            "outcome": d.outcome, "rule": d.reasons[0].get("rule") if d.reasons else None,
            "failing": failing}  # fmt: skip


def replay(
    store: Store,
    policy: RolloutPolicy,
    since: float | None = None,
    resamples: int = 200,
    sglang_urls: Sequence[str] = (),
    prometheus_url: str | None = None,
) -> list[Row]:
    """Every stored decision from ``since`` on beside what ``policy`` would have decided at its time, the
    replay starting from the state the stored decisions before ``since`` left; ``sglang_urls`` (those
    ``serve --sglang`` was given) compare the fleet's server groups, ``prometheus_url`` answers PromQL gates."""
    stored = ledger.decisions(store, since=since)
    if not stored:
        return []
    clock: dict = {"now": stored[0].decided_at, "collector": []}
    urls = [u.rstrip("/") for u in sglang_urls]
    ctl = Replay(store, policy, clock=lambda: clock["now"], resamples=resamples,
                 groups=functools.partial(arms, urls) if urls else None, prometheus_url=prometheus_url,
                 collector_errors=lambda: clock["collector"])  # fmt: skip
    rows = [] if ctl.resumed else [Row(stored[0].decided_at, stored[0], ctl.decisions[0])]
    for decision in stored[len(rows) :]:
        clock["now"] = decision.decided_at
        clock["collector"] = [r["note"] for r in decision.reasons[1:] if r.get("gate") == "collector"]
        if decision.action == Action.PUBLISH_TABLE:
            try:
                rows.append(Row(decision.decided_at, decision, ctl.republish(decision)))
            except TransitionError as exc:
                rows.append(Row(decision.decided_at, decision, None, f"table publication skipped: {exc}"))
            continue
        if decision.operator is None:
            rows.append(Row(decision.decided_at, decision, ctl.tick()))
            continue
        try:
            rows.append(Row(decision.decided_at, decision, ctl.act(decision.action, decision.operator)))
        except TransitionError as exc:
            rows.append(Row(decision.decided_at, decision, None, f"operator {decision.action} skipped: {exc}"))
    return _with_evidence(rows)


def summary(rows: list[Row]) -> dict:
    """Agreement counts and where the replay first departed from the stored decisions."""
    differ = [r for r in rows if not r.agrees]
    origin = rows[0].at if rows else 0.0
    return {
        "decisions": len(rows),
        "agree": len(rows) - len(differ),
        "first_difference_at_s": round(differ[0].at - origin, 3) if differ else None,
        "samples_differ": sum(bool(r.samples_differ) for r in rows),
        "stored_phases": _phases(r.stored for r in rows),
        "replayed_phases": _phases(r.replayed for r in rows if r.replayed is not None),
    }


def _phases(decisions) -> list[str]:
    out: list[str] = []
    for d in decisions:
        if d.action in CHANGES_POLICY and (not out or out[-1] != d.phase_to):
            out.append(d.phase_to)
    return out


@click.command("backtest")
@click.option("--db", required=True, type=click.Path(exists=True, dir_okay=False), help="DuckDB file (not in use).")
@click.option("--policy", "policy_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--since", type=PastTime(), default=None,
              help="Replay decisions from then on: unix seconds, ISO time, or a duration ago (30m, 2h).")  # fmt: skip
@click.option("--sglang", "sglang_urls", multiple=True, type=HttpUrl(),
              help="An SGLang server URL, in the order serve --sglang was given them: the fleet's groups.")  # fmt: skip
@click.option("--prometheus", default=None, type=HttpUrl(), help="Prometheus base URL for the policy's PromQL gates.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: every row and the summary.")
def backtest(
    db: str, policy_path: str, since: float | None, sglang_urls: tuple[str, ...], prometheus: str | None, as_json: bool
) -> None:
    """Replay a store's history through a policy, beside the decisions it holds; acts on nothing."""
    policy = policy_option(policy_path)  # named before the store is opened, decisions to replay or not
    promql.require_url(policy.gates, prometheus)  # as serve refuses: they would replay as "no data"
    with Store(db, create=False) as store:
        rows = replay(store, policy, since, sglang_urls=sglang_urls, prometheus_url=prometheus)
    if not rows:
        raise click.ClickException(f"{db}: no decisions to replay")
    origin = rows[0].at
    result = {"summary": summary(rows), "rows": [r.to_dict(origin) for r in rows]}
    if as_json:
        click.echo(json.dumps(result))
        return
    for r in result["rows"]:
        mark = " " if r["agrees"] else "≠"
        replayed = r["replayed"] or {"action": "-", "phase": "-"}
        click.echo(f"{mark} {r['at_s']:>8.1f}s  stored {r['stored']['action']:<8} -> {r['stored']['phase']:<10}"
                   f"  replayed {replayed['action']:<8} -> {replayed['phase']:<10} {r.get('note', '')}"
                   + (f" evidence differs (gate: [stored, replayed] samples): {r['samples_differ']}"
                      if "samples_differ" in r else ""))  # fmt: skip
    click.echo(json.dumps(result["summary"]))
