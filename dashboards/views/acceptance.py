"""Acceptance: c_k and S_k curves per depth by task, accepted length over time, upper-bound
utilization (a gate), and how often each window length is chosen per mode."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sparkgate.controller.queries import Slice
from sparkgate.dashboards import charts, data, series
from sparkgate.dashboards.context import windowed_page

KINDS = {"conditional": "c_k (conditional, rows at risk)", "survival": "S_k (prefix survival, observed rows)"}


def curve_rows(report: dict, task: str) -> list[dict]:
    rows = []
    for kind in KINDS:
        for depth, figures in report["calibration"][kind].items():
            for source, column in (("predicted", "mean_p"), ("observed", "rate")):
                rows.append(
                    {
                        "kind": kind,
                        "task": task,
                        "depth": int(depth),
                        "source": source,
                        "value": figures[column],
                        "samples": figures["samples"],
                    }
                )
    return rows


def curves(ctx, report: dict) -> None:
    st.subheader("c_k and S_k per depth by task (uncensored)")
    tasks = data.values(ctx.source, ctx.token, "task", ctx.since, ctx.until) if ctx.is_store else []
    # With one task the whole window is that task: no second evaluation.
    rows = curve_rows(report, tasks[0] if len(tasks) == 1 else "all tasks")
    if len(tasks) > 1:
        for task in tasks:
            rows += curve_rows(ctx.figures(Slice(task=task))["report"], task)
    frame = pd.DataFrame(rows)
    if frame.empty:
        st.info("No uncensored labels in this window.")
        return
    for column, (kind, title) in zip(st.columns(2), KINDS.items()):
        column.altair_chart(charts.curves(frame[frame["kind"] == kind], title), width="stretch")
    st.caption("Solid: predicted (mean c_k or S_k); dashed: observed acceptance. A gap is miscalibration.")


def utilization(ctx, report: dict) -> None:
    st.subheader("Upper-bound utilization")
    gate = next((g for g in ctx.policy.gates if g.metric == "upper_bound_utilization"), None)
    cols = st.columns(3)
    for col, (key, label) in zip(
        cols,
        (("upper_bound", "Upper-bound utilization (cap_accept)"), ("shadow", "Shadow utilization (suggested windows)")),
    ):
        figure = report["utilization"][key]
        col.metric(
            label, "—" if figure["value"] is None else f"{figure['value']:.4f}", help=f"{figure['samples']:,} samples"
        )
    cols[2].metric(
        "Gate threshold",
        "—" if gate is None else f"≥ {gate.threshold:g}",
        help="In shadow the gate judges the shadow figure, otherwise the cap-accept one.",
    )
    st.caption(
        "Σ a / Σ min(a*, γ) over cap-accept samples: what compact windows delivered against the full "
        "block. Shadow: Σ min(a*, w_suggested) / Σ a*."
    )


def per_mode(report: dict) -> None:
    st.subheader("Per mode")
    frame = pd.DataFrame([{"mode": m, **figures} for m, figures in report["acceptance"].items()])
    if frame.empty:
        st.info("No request rows in this window.")
        return
    st.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.3f") for c in ("mean_window", "mean_accepted", "mean_committed")
        },
    )


def over_time(ctx) -> None:
    origin, width = ctx.buckets()
    frame = series.acceptance_series(ctx.source, ctx.token, ctx.since, ctx.until, origin, width)
    if frame.empty:
        return
    lengths = frame[frame["series"].str.startswith("mean accepted")]
    st.altair_chart(
        charts.lines(
            lengths,
            "value",
            "series",
            f"mean accepted length per mode ({width:g} s buckets)",
            y_title="accepted drafts",
        ),
        width="stretch",
    )
    gate = next((g.threshold for g in ctx.policy.gates if g.metric == "upper_bound_utilization"), None)
    util = frame[frame["series"].str.contains("utilization")]
    if not util.empty:
        st.altair_chart(
            charts.lines(util, "value", "series", "utilization over time", gate, "utilization"), width="stretch"
        )


def windows(figures: dict) -> None:
    st.subheader("Window lengths chosen per mode")
    frame = figures["windows"]
    if frame.empty:
        st.info("No request rows in this window.")
        return
    st.altair_chart(
        charts.bars(frame, "window", "share", "share of requests per window length", color="mode"), width="stretch"
    )
    st.dataframe(frame.pivot(index="mode", columns="window", values="requests").fillna(0).astype(int), width="stretch")


def render() -> None:
    page = windowed_page("Acceptance")
    if page is None:
        return
    ctx, figures = page
    report = figures["report"]
    utilization(ctx, report)
    curves(ctx, report)
    per_mode(report)
    if ctx.require_store("Accepted length over time and the window distributions"):
        over_time(ctx)
        windows(figures)


render()
