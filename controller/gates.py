"""Gate verdicts (docs/design.md §6): each gate of the rollout policy judges one measurement.

A verdict is ``pass``, ``fail`` or ``inconclusive``: inconclusive when the value
is missing, when it rests on fewer than ``min_samples`` samples, or when the data
is stale — except that a critical gate's failure stands even on stale data.
Equality with the threshold passes. A measurement with an interval (a comparison
gate's) is judged by the interval, not the estimate: pass when the whole interval
is on the good side of the threshold, fail when it is wholly on the bad side,
inconclusive (collect more) when it straddles it. ``guard`` gates act on their
failures only; ``dry_run`` gates get verdicts like any other but never decide;
``interval_outcome`` folds the deciding verdicts of one evaluation interval into
the one outcome the state machine acts on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sparkgate.policies.gate import Gate
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import Outcome

from .measurement import Measurement, span

# Metrics that compare with what baseline recorded; their min_samples size the reference it must collect.
BASELINE_METRICS = ("accepted_length_ratio",)


@dataclass(frozen=True)
class Verdict:
    """One gate's judgement in one interval; ``to_dict`` is the reason stored with a decision."""

    gate: str
    metric: str
    outcome: str
    value: float | None
    threshold: float
    direction: str
    samples: int
    min_samples: int
    critical: bool
    dry_run: bool
    note: str
    low: float | None = None
    high: float | None = None
    method: str | None = None
    guard: bool = False

    @property
    def decides(self) -> bool:
        return not self.dry_run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(gate: Gate, measurement: Measurement | None, stale: str | None = None) -> Verdict:
    """The verdict of ``gate`` on ``measurement``; ``stale`` (a reason) makes it inconclusive."""
    m = measurement or Measurement(None, 0)

    def verdict(outcome: str, note: str) -> Verdict:
        return Verdict(
            gate.name,
            gate.metric,
            outcome,
            m.value,
            gate.threshold,
            gate.direction,
            m.samples,
            gate.min_samples,
            gate.critical,
            gate.dry_run,
            note,
            m.low,
            m.high,
            m.method,
            gate.guard,
        )

    if m.error is not None:
        return verdict(Outcome.ERROR, m.error)
    if m.value is None:
        return verdict(Outcome.INCONCLUSIVE, stale or m.why or "no data")
    if m.samples < gate.min_samples:
        return verdict(Outcome.INCONCLUSIVE, f"{m.samples} samples < min_samples {gate.min_samples}")
    if m.method is not None:
        return _judge_interval(gate, m, stale, verdict)
    limit = gate.fail_limit
    failed = f"{m.value:.6g} not {_symbol(gate.direction)} {limit:g}"
    if gate.fails(m.value) and gate.critical:
        return verdict(Outcome.FAIL, failed)  # evidence of a correctness bug counts whatever the age of the steps
    if stale is not None:
        return verdict(Outcome.INCONCLUSIVE, stale)
    if gate.passes(m.value):
        return verdict(Outcome.PASS, f"{m.value:.6g} {_symbol(gate.direction)} {gate.threshold:g}")
    if gate.fails(m.value):
        return verdict(Outcome.FAIL, failed)
    return verdict(Outcome.INCONCLUSIVE, f"{m.value:.6g} in the grey zone between {gate.threshold:g} and {limit:g}")


def _judge_interval(gate: Gate, m: Measurement, stale: str | None, verdict: Callable[[str, str], Verdict]) -> Verdict:
    if m.low is None and m.high is None:
        return verdict(Outcome.INCONCLUSIVE, f"{m.samples} samples are too few for an interval: collect more")
    interval = span(m.low, m.high)
    good, bad = (m.high, m.low) if gate.direction == "at_most" else (m.low, m.high)
    limit = gate.fail_limit
    # An open side can neither pass nor fail the gate: only the bound that is there decides.
    failed = bad is not None and gate.fails(bad)
    if failed and gate.critical:  # as for a value: a correctness bug counts whatever the age of the steps
        return verdict(Outcome.FAIL, f"interval {interval} wholly beyond {limit:g}")
    if stale is not None:
        return verdict(Outcome.INCONCLUSIVE, stale)
    if good is not None and gate.passes(good):
        return verdict(Outcome.PASS, f"interval {interval} wholly {_symbol(gate.direction)} {gate.threshold:g}")
    if failed:
        return verdict(Outcome.FAIL, f"interval {interval} wholly beyond {limit:g}")
    where = (
        f"straddles {gate.threshold:g}"
        if gate.fail_threshold is None
        else f"ends between {gate.threshold:g} and {limit:g}"
    )
    return verdict(Outcome.INCONCLUSIVE, f"interval {interval} {where}: collect more")


def _symbol(direction: str) -> str:
    return "<=" if direction == "at_most" else ">="


def error_verdict(note: str, name: str = "evaluation") -> Verdict:
    """An error verdict: the interval could not be evaluated at all (``evaluation``), or a source of its
    records failed (``collector``); ``note`` says why."""
    return Verdict(name, name, Outcome.ERROR, None, 0.0, "at_most", 0, 0, False, False, note)


def judge_all(
    gates: Iterable[Gate], measurements: Mapping[str, Measurement], stale: str | None = None
) -> list[Verdict]:
    """Verdicts of ``gates`` in policy order, each on ``measurements[gate.measured_as]``."""
    return [judge(g, measurements.get(g.measured_as), stale) for g in gates]


def judge_baseline(policy: RolloutPolicy, steps: int, stale: str | None = None) -> Verdict:
    """Baseline's one check: has it recorded the reference the latency gates will compare with?
    It passes or waits (inconclusive), never fails: baseline changes nothing that could go wrong."""
    needed = max([g.min_samples for g in policy.gates if g.metric in BASELINE_METRICS] + [1])
    outcome = Outcome.INCONCLUSIVE if stale or steps < needed else Outcome.PASS
    return Verdict(
        "baseline_reference",
        "baseline_steps",
        outcome,
        float(steps),
        float(needed),
        "at_least",
        steps,
        needed,
        False,
        False,
        stale or f"{steps} baseline steps (need {needed})",
    )


def interval_outcome(verdicts: Iterable[Verdict]) -> str:
    """``critical`` if a deciding critical gate failed, else ``fail`` if any deciding gate failed, else
    ``error`` if one could not be measured, else ``inconclusive`` if any was inconclusive, else ``pass``
    (also when no gate decides)."""
    # A guard gate acts on its failures only: its inconclusive verdicts neither hold nor reset the rollout.
    deciding = [v for v in verdicts if v.decides and not (v.guard and v.outcome == Outcome.INCONCLUSIVE)]
    if any(v.critical and v.outcome == Outcome.FAIL for v in deciding):
        return Outcome.CRITICAL
    if any(v.outcome == Outcome.FAIL for v in deciding):
        return Outcome.FAIL
    if any(v.outcome == Outcome.ERROR for v in deciding):
        return Outcome.ERROR
    if any(v.outcome == Outcome.INCONCLUSIVE for v in deciding):
        return Outcome.INCONCLUSIVE
    return Outcome.PASS


def verdict_table(verdicts: Iterable[Mapping[str, Any]], indent: str = "    ") -> str:
    """Stored verdicts (``Verdict.to_dict()``) as an aligned text table: the demo's log and notifications."""
    rows = [("gate", "value", "interval", "threshold", "samples", "verdict")]
    for v in verdicts:
        value = "-" if v["value"] is None else f"{v['value']:.3f}"
        interval = span(v.get("low"), v.get("high"), ".3f")
        bound = f"{'<=' if v['direction'] == 'at_most' else '>='} {v['threshold']:g}"
        verdict = (
            v["outcome"]
            + (" (dry run)" if v.get("dry_run") else "")
            + (" (guard)" if v.get("guard") else "")
            + (" CRITICAL" if v["critical"] and v["outcome"] == Outcome.FAIL else "")
        )
        rows.append((v["gate"], value, interval, bound, f"{v['samples']:,}", verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        indent
        + "  ".join(c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    )
