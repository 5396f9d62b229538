"""What ``sparkgate demo`` reports: the stages it walked, their figures, the decisions, as JSON and text.

Everything is read back from the DuckDB file the controller wrote (after it
stopped), with the controller's own ledger and ``evaluate.evaluate``, so the
summary shows exactly the figures the gates decided on. A stage is one policy
revision (a rung of the ladder, or fallback); the fault, which happens inside
a stage, splits it in two so the figures before and after it stand apart.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from sparkgate.collectors import cost_tables
from sparkgate.collectors.store import Store
from sparkgate.controller import cost_report, ledger
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.measurement import span
from sparkgate.controller.queries import Window
from sparkgate.controller.rollout_state import Decision
from sparkgate.controller.window_sums import COMPACT_COUNTS
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import CHANGES_POLICY, COMPARISON_METRICS, Action, Outcome, Phase

# Bootstrap resamples per stage: the summary shows point figures; the gates had the intervals.
SUMMARY_RESAMPLES = 20


@dataclass(frozen=True)
class Stage:
    """A stretch of the run under one served policy, ``[start, end)`` in unix seconds."""

    label: str
    phase: str
    compact_fraction: float
    revision: int
    start: float
    end: float
    faulted: bool = False


def stage_label(phase: str, fraction: float) -> str:
    return f"{phase} {fraction:.0%}" if phase == "canary" else phase


def stages_of(decisions: list[Decision], end: float, fault_at: float | None = None) -> list[Stage]:
    """The stages the ledger's policy changes delimit, the last one ending at ``end``; the stage in
    which ``fault_at`` falls is split there (its second part labelled ``+ fault``)."""
    changes = [d for d in decisions if d.action in CHANGES_POLICY]
    out = []
    for i, d in enumerate(changes):
        stop = changes[i + 1].decided_at if i + 1 < len(changes) else end
        label = stage_label(d.phase_to, d.compact_fraction)
        if fault_at is not None and d.decided_at <= fault_at < stop:
            out.append(Stage(label, d.phase_to, d.compact_fraction, d.revision, d.decided_at, fault_at))
            out.append(
                Stage(f"{label} + fault", d.phase_to, d.compact_fraction, d.revision, fault_at, stop, faulted=True)
            )
        else:
            out.append(
                Stage(
                    label,
                    d.phase_to,
                    d.compact_fraction,
                    d.revision,
                    d.decided_at,
                    stop,
                    faulted=fault_at is not None and d.decided_at > fault_at,
                )
            )
    return out


def phases_entered(decisions: list[Decision]) -> list[str]:
    """Phases in the order first entered (a canary's rungs are one phase)."""
    seen: list[str] = []
    for d in decisions:
        if d.action in CHANGES_POLICY and d.phase_to not in seen:
            seen.append(d.phase_to)
    return seen


def failing(reasons) -> list[dict]:
    """The deciding gate verdicts that failed, among a decision's reasons."""
    return [r for r in reasons if r.get("outcome") == Outcome.FAIL and not r.get("dry_run")]


def describe_verdict(v: dict) -> str:
    symbol = ">" if v["direction"] == "at_most" else "<"
    if v.get("low") is not None or v.get("high") is not None:  # a comparison fails by its whole interval
        interval = span(v.get("low"), v.get("high"), ".3g")
        return f"{v['gate']} {v['value']:.3g} {interval} {symbol} {v['threshold']:g} ({v['samples']} epoch pairs)"
    return f"{v['gate']} {v['value']:.3g} {symbol} {v['threshold']:g} ({v['samples']} samples)"


def fallback_reason(decisions: list[Decision]) -> str | None:
    """Why the rollout last rolled back to fallback (rule, then the gates that failed), or None."""
    rollbacks = [d for d in decisions if d.action == Action.ROLLBACK]
    if not rollbacks:
        return None
    decision = rollbacks[-1]
    rule = decision.reasons[0]
    detail = {
        "failure limit": lambda: f" ({rule['failures']} failed intervals > limit {rule['limit']})",
        "progress deadline": lambda: f" (inconclusive {rule['inconclusive_s']:.0f} s)",
    }
    text = rule["rule"] + detail.get(rule["rule"], lambda: "")()
    gates = failing(decision.reasons)
    return text + (": " + "; ".join(describe_verdict(v) for v in gates) if gates else "")


def _by_phase(store: Store) -> dict[str, dict]:
    """Steps, committed tokens and busy seconds per phase the replicas recorded, in order of first use."""
    rows = store.query("""
        WITH t AS (SELECT replica_id, step_id, sum(accepted + 1) AS tokens FROM requests GROUP BY ALL)
        SELECT s.phase, count(*) AS steps, sum(t.tokens)::BIGINT AS tokens, sum(s.step_ms) / 1000 AS busy_s,
               min(s.ts) AS first
        FROM steps s JOIN t USING (replica_id, step_id) GROUP BY s.phase ORDER BY first""").to_pylist()
    return {
        r["phase"]: {
            "steps": r["steps"],
            "committed_tokens": r["tokens"],
            "busy_s": r["busy_s"],
            "tokens_per_s": r["tokens"] / r["busy_s"] if r["busy_s"] else None,
        }
        for r in rows
    }


def _labels(store: Store) -> dict:
    rows = store.query(
        "SELECT mode::VARCHAR AS mode, status::VARCHAR AS status, count(*) AS n "
        "FROM depth_labels GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
    by_mode: dict[str, dict[str, int]] = {}
    for r in rows:
        by_mode.setdefault(r["mode"], {})[r["status"]] = r["n"]
    total = {status: sum(r["n"] for r in rows if r["status"] == status) for status in COMPACT_COUNTS}
    return {
        "observed": sum(r["n"] for r in rows) - sum(total.values()),
        **total,
        "uncensored_traffic": sum(r["n"] for r in rows if r["mode"] != "compact"),
        "by_mode": by_mode,
    }


def _comparisons(decisions: list[Decision], stage: Stage) -> dict[str, dict]:
    """The comparison verdicts of the stage's last decision: estimate, interval, pairs and outcome, as judged."""
    judged = [
        d
        for d in decisions
        if stage.start < d.decided_at <= stage.end and d.phase_from == stage.phase and d.action != Action.PUBLISH_TABLE
    ]
    if not judged:
        return {}
    return {
        v["gate"]: {k: v[k] for k in ("value", "low", "high", "samples", "outcome", "method")}
        for v in judged[-1].reasons[1:]
        if v.get("metric") in COMPARISON_METRICS
    }


def _stage_figures(store: Store, stage: Stage, t0: float, decisions: list[Decision]) -> dict:
    evaluation = evaluate(store, Window(stage.start, stage.end), resamples=SUMMARY_RESAMPLES)
    report = evaluation.report()
    comparisons = _comparisons(decisions, stage)
    modes = {m: a["requests"] for m, a in report["acceptance"].items()}
    return {
        "stage": stage.label,
        "phase": stage.phase,
        "compact_fraction": stage.compact_fraction,
        "revision": stage.revision,
        "start_s": stage.start - t0,
        "end_s": stage.end - t0,
        "fault": stage.faulted,
        "request_rows": modes,
        "tokens_per_s": report["throughput"]["tokens_per_s"],
        # The gates' comparisons: treatment against control epochs of the same replicas at the same time.
        "comparisons": comparisons,
        "tokens_per_s_vs_control": comparisons.get("tokens_per_s_ratio", {}).get("value"),
        "mean_accepted": {m: a["mean_accepted"] for m, a in report["acceptance"].items()},
        "ece_by_depth": {d: c["ece"] for d, c in report["calibration"]["survival"].items()},
        "utilization": report["utilization"]["upper_bound"]["value"],
        "shadow_utilization": report["utilization"]["shadow"]["value"],
        "miss_rate": report["tiers"]["miss_rate"],
        "p99_ms": max((b["p99_ms"] for b in report["latency"].values()), default=None),
    }


def _decision_log(decisions: list[Decision], t0: float) -> list[dict]:
    """Policy changes, and the failed intervals that led to them (fallback judges for the record only)."""
    out = []
    for d in decisions:
        shown = d.action in CHANGES_POLICY or d.action == Action.PUBLISH_TABLE
        if shown or (d.outcome == Outcome.FAIL and d.phase_to != Phase.FALLBACK):
            out.append(
                {
                    "at_s": round(d.decided_at - t0, 1),
                    "action": d.action,
                    "from": d.phase_from,
                    "to": stage_label(d.phase_to, d.compact_fraction),
                    "revision": d.revision,
                    "rule": d.reasons[0].get("rule"),
                    "failing": [describe_verdict(v) for v in failing(d.reasons)],
                }
            )
    return out


def adaptive_figures(
    store: Store, decisions: list[Decision], ended_at: float, policy: RolloutPolicy, fault_at: float | None = None
) -> dict | None:
    """The cost tables' record in adaptive (None when the run never got there): per interval and arm the
    prediction error and mean window (``controller.cost_report``), the tables stored, the table decisions."""
    entered = [d.decided_at for d in decisions if d.action in CHANGES_POLICY and d.phase_to == Phase.ADAPTIVE]
    if not entered:
        return None
    spec, interval_s = policy.adaptive, policy.evaluation_interval_s
    report = cost_report.report(store, entered[0], ended_at, interval_s, spec.step_time, floor=True)
    return {
        **report,
        "figures": adaptive_targets(
            report["intervals"], None if fault_at is None else (fault_at - entered[0]) / interval_s
        ),
        "tables": [e.provenance() for e in cost_tables.entries(store)],
    }


def adaptive_targets(intervals: list[dict], fault_interval: float | None, good: float = 0.10) -> dict:
    """What the adaptive targets read: the static table's median per-interval error (control arm), the fitted
    tables' (treatment arm), the floor (a table refitted to each previous interval, unconstrained,
    ``cost_report``), and how many intervals the treatment took to come within ``good``, from the start of
    adaptive and from the fault (None: not within the run)."""

    def errors(arm: str, after: float = 0.0) -> list[tuple[int, float]]:
        return [(r["interval"], r["prediction_error"]) for r in intervals if r["arm"] == arm and r["interval"] >= after]

    def first_within(after: float) -> int | None:
        return next((i - math.ceil(after) for i, e in errors("treatment", after) if e <= good), None)

    def median(values: list[tuple[int, float]]) -> float | None:
        return statistics.median(e for _, e in values) if values else None

    floors = [r["floor_error"] for r in intervals if r["arm"] == "treatment" and r.get("floor_error") is not None]
    return {
        "floor_error": statistics.median(floors) if floors else None,
        "static_error": median(errors("control")),
        "fitted_error": median(errors("treatment", 1.0)),
        "intervals_to_within": first_within(0.0),
        "after_fault": None
        if fault_interval is None
        else {
            "static_error": median(errors("control", fault_interval)),
            "fitted_error": median(errors("treatment", fault_interval)),
            "intervals_to_within": first_within(fault_interval),
        },
        "within": good,
    }


def summarize(
    store: Store,
    started_at: float,
    ended_at: float,
    fault: str,
    fault_at: float | None,
    policy: RolloutPolicy | None = None,
) -> dict:
    """The demo's JSON summary (without the paths, which the caller adds)."""
    decisions = ledger.decisions(store)
    by_phase = _by_phase(store)
    return {
        "adaptive": adaptive_figures(store, decisions, ended_at, policy, fault_at) if policy is not None else None,
        "phases": phases_entered(decisions),
        "fault": fault,
        "fault_at_s": None if fault_at is None else round(fault_at - started_at, 1),
        "fallback_reason": fallback_reason(decisions),
        "tokens_per_s_by_phase": {p: f["tokens_per_s"] for p, f in by_phase.items()},
        "by_phase": by_phase,
        "stages": [_stage_figures(store, s, started_at, decisions) for s in stages_of(decisions, ended_at, fault_at)],
        "labels": _labels(store),
        "decisions": _decision_log(decisions, started_at),
        "counts": store.counts(),
    }


# -- text --------------------------------------------------------------------------------------------------


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(summary: dict) -> str:
    """The final summary as text: per stage figures, per-depth ECE, decisions, outcome, where the data is."""
    stages = summary["stages"]
    lines = [
        "",
        "Stages (tok/s: committed tokens per busy replica-second; x ctl: the same against the control epochs",
        "as the gate judged it; ECE: worst depth, uncensored traffic; util: cap-accept, or shadow's suggestion)",
        f"  {'stage':<20}{'from':>6}{'to':>6}{'tok/s':>8}{'x ctl':>8}{'ECE':>7}{'util':>7}{'miss':>7}{'p99 ms':>8}",
    ]
    for s in stages:
        worst = max(s["ece_by_depth"].values(), default=None)
        utilization = s["shadow_utilization"] if s["phase"] == "shadow" else s["utilization"]
        lines.append(
            f"  {s['stage']:<20}{s['start_s']:>6.0f}{s['end_s']:>6.0f}{_number(s['tokens_per_s'], '.0f'):>8}"
            f"{_number(s['tokens_per_s_vs_control'], '.2f'):>8}{_number(worst, '.3f'):>7}"
            f"{_number(utilization, '.2f'):>7}{_number(s['miss_rate'], '.1%'):>7}"
            f"{_number(s['p99_ms'], '.1f'):>8}"
        )
    lines += ["", "Comparison gates, treatment / control epochs: estimate [interval] over epoch pairs, as judged"]
    for s in stages:
        for gate, c in s["comparisons"].items():
            span = f"[{_number(c['low'], '.3f')}, {_number(c['high'], '.3f')}]"
            lines.append(f"  {s['stage']:<20}{gate:<20}{_number(c['value'], '.3f'):>7} {span:<16} "
                         f"n={c['samples']:<4} {c['outcome']}")  # fmt: skip
    depths = sorted({d for s in stages for d in s["ece_by_depth"]}, key=int)
    lines += [
        "",
        "Survival ECE per depth (uncensored traffic)",
        f"  {'stage':<20}" + "".join(f"{'d' + d:>7}" for d in depths),
    ]
    for s in stages:
        lines.append(f"  {s['stage']:<20}" + "".join(f"{_number(s['ece_by_depth'].get(d), '.3f'):>7}" for d in depths))
    lines += [
        "",
        "Committed tokens/s by phase: "
        + ", ".join(f"{p} {_number(v, '.0f')}" for p, v in summary["tokens_per_s_by_phase"].items()),
    ]
    labels = summary["labels"]
    lines.append(
        f"Depth labels: {labels['observed']:,} observed; compact: {labels['recovered']:,} recovered, "
        f"{labels['estimated']:,} estimated, {labels['censored']:,} censored"
    )
    lines += ["", "Decisions"]
    for d in summary["decisions"]:
        why = d["rule"] + (": " + "; ".join(d["failing"]) if d["failing"] else "")
        lines.append(f"  {d['at_s']:>6.1f}s  {d['action']:<8} -> {d['to']:<12} {why}")
    adaptive = summary.get("adaptive")
    if adaptive:
        lines += ["", f"Adaptive: step-time prediction error ({adaptive['step_time']} time) and mean compact window "
                  "per interval, treatment (fitted tables) / control (static)"]  # fmt: skip
        by = {(r["interval"], r["arm"]): r for r in adaptive["intervals"]}
        for i in sorted({k[0] for k in by}):
            t, c = by.get((i, "treatment"), {}), by.get((i, "control"), {})
            lines.append(
                f"  interval {i:>3}  error {_number(t.get('prediction_error'), '.1%'):>6} / "
                f"{_number(c.get('prediction_error'), '.1%'):>6}   window {_number(t.get('mean_window'), '.2f'):>5} / "
                f"{_number(c.get('mean_window'), '.2f'):>5}   {', '.join(t.get('tables') or [])}"
            )
        cv = adaptive["window_cv"]
        lines.append(f"  window CV across intervals: treatment {_number(cv.get('treatment'), '.3f')}, "
                     f"control {_number(cv.get('control'), '.3f')}")  # fmt: skip
    lines += ["", f"Phases: {' -> '.join(summary['phases'])}"]
    if summary["fallback_reason"]:
        lines.append(f"Fallback: {summary['fallback_reason']}")
    return "\n".join(lines)
