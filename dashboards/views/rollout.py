"""Rollout: the phase in force, the latest gate verdicts, the timeline of decisions and what an
operator can run. Everything comes from the decisions ledger (or ``/v1/status``); nothing is written."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sparkgate.controller.address import DEFAULT_URL
from sparkgate.controller.measurement import span
from sparkgate.controller.rollout import TransitionError, command
from sparkgate.controller.rollout_state import RolloutState
from sparkgate.dashboards import charts, data, steps
from sparkgate.dashboards.context import current, when
from sparkgate.policies.vocabulary import CHANGES_POLICY, OPERATOR_ACTIONS, Action

SYMBOL = {"at_most": "≤", "at_least": "≥"}


def gate_table(verdicts: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "gate": v["gate"],
                "metric": v["metric"],
                "value": v["value"],
                "interval": span(v.get("low"), v.get("high")),
                "threshold": f"{SYMBOL.get(v['direction'], v['direction'])} {v['threshold']:g}",
                "samples": v["samples"],
                "min samples": v["min_samples"],
                "verdict": v["outcome"],
                "critical": v["critical"],
                "dry run": "dry run" if v["dry_run"] else "",
                "note": v["note"],
            }
            for v in verdicts
        ]
    )


PUBLISH = Action.PUBLISH_TABLE
# The command of each operator action, where it is not the action's own name.
COMMAND: dict[str, str] = {Action.REVERT_TABLE: "cost-table revert"}


def timeline_frames(decisions: list[dict], end: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    changes = [d for d in decisions if d["action"] in CHANGES_POLICY]
    segments = pd.DataFrame(
        [
            {
                "phase": d["phase_to"],
                "stage": f"{d['phase_to']} {d['compact_fraction']:.0%} compact",
                "revision": d["revision"],
                "start": pd.Timestamp(d["decided_at"], unit="s", tz="UTC"),
                "end": pd.Timestamp(max(nxt["decided_at"] if nxt else end, d["decided_at"]), unit="s", tz="UTC"),
            }
            for d, nxt in zip(changes, changes[1:] + [None])
        ]
    )
    points = pd.DataFrame(
        [
            {
                "time": pd.Timestamp(d["decided_at"], unit="s", tz="UTC"),
                "phase": d["phase_to"],
                "revision": d["revision"],
                "action": d["action"],
                "outcome": d["outcome"] or "",
                "rule": data.rule_of(d) + (f": {d['reasons'][0]['version']}" if d["action"] == PUBLISH else ""),
                "operator": d["operator"] or "",
            }
            # Cost-table versions sit on the timeline too: each publication is a point on the adaptive band.
            for d in decisions
            if d["action"] in CHANGES_POLICY or d["action"] == PUBLISH
        ]
    )
    return segments, points


def decision_table(decisions: list[dict], changes_only: bool) -> pd.DataFrame:
    rows = [d for d in reversed(decisions) if not changes_only or d["action"] in CHANGES_POLICY]
    return pd.DataFrame(
        [
            {
                "decided at": when(d["decided_at"]),
                "revision": d["revision"],
                "phase": f"{d['phase_from'] or '—'} → {d['phase_to']}",
                "action": d["action"],
                "outcome": d["outcome"] or "",
                "rule": data.rule_of(d),
                "operator": d["operator"] or "",
                # As the notices name them: a dry-run gate's failure decided nothing, so it is marked.
                "gates failed": ", ".join(
                    r["gate"] + (" (dry run)" if r.get("dry_run") else "")
                    for r in d["reasons"]
                    if r.get("outcome") == "fail"
                ),
            }
            for d in rows
        ]
    )


def allowed_actions(ctx, change: dict) -> list[str]:
    """The operator actions the controller's state machine accepts now (it raises for the others)."""
    status = ctx.ledger["status"] or {}
    state = RolloutState(
        change["revision"], change["phase_to"], status.get("stage"), change["compact_fraction"], change["decided_at"],
        static_only=bool(status.get("static_only")),  # a reverted stage refuses another revert
    )  # fmt: skip
    allowed: list[str] = []
    for action in OPERATOR_ACTIONS:
        try:
            command(ctx.policy, state, action, "operator", change["decided_at"])
        except TransitionError:
            continue
        allowed.append(action)
    return allowed


def render() -> None:
    ctx = current()
    st.title("Rollout")
    decisions = ctx.ledger["decisions"]
    change = data.latest_change(decisions)
    if change is None:
        st.info(
            "No rollout decisions yet. The controller records its first decision (start, in baseline) when "
            "`sparkgate serve --db FILE` starts on this store; its evaluations follow every interval."
        )
        return
    status = ctx.ledger["status"] or {}
    cols = st.columns(5)
    cols[0].metric("Phase", change["phase_to"])
    cols[1].metric("Revision", change["revision"])
    cols[2].metric("Compact fraction", f"{change['compact_fraction']:.0%}")
    if status:
        cols[3].metric("Passing intervals", f"{status['passes']} / {status['needed_passes']}")
        window = status.get("failure_window_s")  # a controller from before failure windows sends none
        counted = "Failed intervals" + (f" (last {window / 60:g} min)" if window else "")
        cols[4].metric(counted, f"{status['failures']} / limit {status['failure_limit']}")
    st.caption(f"In force since {when(change['decided_at'])} ({change['action']}: {data.rule_of(change)}).")
    if change["phase_to"] == "fallback":
        st.error(
            f"In fallback since {when(change['decided_at'])}: {data.rule_of(change)}. Replicas serve the "
            "fixed fallback window; only an operator's `resume` leaves fallback."
        )
    elif change["phase_to"] == "paused":
        st.warning("Paused: the rollout holds this stage; critical gates can still roll it back.")

    judged, verdicts = data.latest_verdicts(decisions)
    st.subheader("Latest evaluation")
    if judged is None:
        st.info("No evaluation has judged gates yet (the controller evaluates every interval).")
    else:
        st.caption(
            f"{when(judged['decided_at'])} · interval outcome **{judged['outcome']}** → "
            f"{judged['action']} ({data.rule_of(judged)}). Values and samples are exactly what the "
            "gates judged; dry-run gates are recorded but never act."
        )
        st.dataframe(
            gate_table(verdicts),
            hide_index=True,
            width="stretch",
            column_config={"value": st.column_config.NumberColumn(format="%.6g")},
        )
        compared = charts.comparison_frame(verdicts)
        if len(compared):
            st.altair_chart(charts.comparison_intervals(compared), width="stretch")
            st.caption(
                "Treatment over control measured at the same time: switchback epochs of the same replicas (a bar "
                "spans the pooled interval's good-side bound and the worst bad-side bound of the pooled and each "
                "replica's interval over their epoch pairs, beside the pooled estimate; the method names the "
                "interval a failing bound is from), or for a fleet "
                "split by server the "
                "treatment servers against the control servers, slice by slice. A gate passes only when the whole "
                "bar is on the good side of its threshold (red tick) and fails only when the whole bar is on the "
                "bad side."
            )

    if ctx.source.kind == "store":
        epochs = steps.switchback_epochs(ctx.source, ctx.token, change["revision"])
        if len(epochs):
            shown = epochs.assign(
                start=pd.to_datetime(epochs["start"], unit="s", utc=True),
                end=pd.to_datetime(epochs["end"], unit="s", utc=True),
            )
            st.altair_chart(charts.switchback(shown), width="stretch")
            st.caption(
                f"Revision {int(epochs['revision'].iloc[0])}: each replica alternates treatment and control epochs "
                "(control verifies every request static); the comparison gates pair each replica's epochs 2k and "
                "2k+1."
            )

    st.subheader("Timeline")
    end = max(ctx.overview.newest or 0.0, decisions[-1]["decided_at"]) if ctx.overview else decisions[-1]["decided_at"]
    segments, points = timeline_frames(decisions, end)
    st.altair_chart(charts.timeline(segments, points), width="stretch")
    changes_only = st.toggle("Policy changes only", value=True)
    st.dataframe(decision_table(decisions, changes_only), hide_index=True, width="stretch")

    st.subheader("Operator commands")
    url = ctx.source.url if ctx.source.kind == "controller" else DEFAULT_URL
    allowed = allowed_actions(ctx, change)
    st.caption(
        f"Allowed in {change['phase_to']}: {', '.join(allowed) or 'none'}. The dashboard never acts; "
        "run these where the operator token is available (`--token` or SPARKGATE_TOKEN)."
    )
    st.code(
        "\n".join(f'sparkgate {COMMAND.get(a, a)} --controller {url} --operator "$USER" --note "why"' for a in allowed)
        or "# no operator action applies",
        language="bash",
    )

    st.subheader("Policy")
    ladder = pd.DataFrame(
        [
            {
                "stage": i,
                "phase": s.phase,
                "compact fraction": s.compact_fraction,
                "current": "◀" if i == status.get("stage") else "",
            }
            for i, s in enumerate(ctx.policy.stages())
        ]
    )
    gates = pd.DataFrame(
        [
            {
                "gate": g.name,
                "metric": g.metric,
                "threshold": f"{SYMBOL[g.direction]} {g.threshold:g}",
                "min samples": g.min_samples,
                "critical": g.critical,
                "dry run": g.dry_run,
                "phases": ", ".join(g.phases),
            }
            for g in ctx.policy.gates
        ]
    )
    left, right = st.columns([1, 2])
    left.dataframe(ladder, hide_index=True, width="stretch")
    right.dataframe(gates, hide_index=True, width="stretch")
    st.caption(
        f"Advance after {ctx.policy.consecutive_passes} passing intervals; fallback after more than "
        f"{ctx.policy.failure_limit} failed ones, at once on a critical failure, or after "
        f"{ctx.policy.progress_deadline_s:g} s inconclusive. Observe fraction "
        f"{ctx.policy.observe_fraction:g}."
    )


render()
