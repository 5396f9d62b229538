"""Tiers and cost: graph-tier histogram, miss rate by reason and padding over time, step time
against verify rows with the cost table's prediction, the prediction error, and adaptive's cost
table versions with each arm's prediction error and window over time."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sparkgate.dashboards import charts, cost_tables, judged, requests, series, steps
from sparkgate.dashboards.context import windowed_page


def summary(ctx, report: dict) -> None:
    tiers = report.get("tiers")
    if tiers is None:
        st.info("No step figures in this window.")
        return
    cols = st.columns(4)
    cols[0].metric(
        "Tier miss rate",
        "—" if tiers["miss_rate"] is None else f"{tiers['miss_rate']:.2%}",
        help=f"{tiers['steps']:,} steps in this window",
    )
    cols[1].metric("Steps", f"{tiers['steps']:,}")
    cols[2].metric(
        "Padding ratio",
        "—" if tiers["padding_ratio"] is None else f"{tiers['padding_ratio']:.2%}",
        help="(tier rows − verify rows) / tier rows over graph hits",
    )
    cols[3].metric(
        "Misses",
        f"{sum(tiers['misses'].values()):,}",
        help=", ".join(f"{r}: {n}" for r, n in tiers["misses"].items()) or "none",
    )
    judged.show(ctx.ledger["decisions"], ["tier_miss_rate"])
    if tiers["misses"]:
        st.dataframe(
            pd.DataFrame(
                [{"reason": r, "steps": n, "share of steps": n / tiers["steps"]} for r, n in tiers["misses"].items()]
            ),
            hide_index=True,
        )


def histogram(ctx) -> None:
    st.subheader("Tier histogram")
    frame = steps.tier_histogram(ctx.source, ctx.token, ctx.since, ctx.until)
    if frame.empty:
        st.info("No steps in this window.")
        return
    frame["kind"] = frame["graph_hit"].map({True: "graph", False: "eager (miss)"})
    st.altair_chart(
        charts.bars(frame, "tier", "steps", "steps per captured tier (rows) and per miss reason", color="kind"),
        width="stretch",
    )


def over_time(ctx) -> None:
    origin, width = ctx.buckets()
    frame = series.tier_series(ctx.source, ctx.token, ctx.since, ctx.until, origin, width)
    if frame.empty:
        return
    gate = next((g.threshold for g in ctx.policy.gates if g.metric == "tier_miss_rate"), None)
    misses = frame[frame["series"].str.startswith("miss rate")]
    st.altair_chart(
        charts.lines(misses, "value", "series", f"miss rate by reason ({width:g} s buckets)", gate, "miss rate"),
        width="stretch",
    )
    padding = frame[frame["series"] == "padding ratio"]
    if not padding.empty:
        st.altair_chart(
            charts.lines(padding, "value", "series", "padding ratio", y_title="padding / tier rows"), width="stretch"
        )


def cost(ctx) -> None:
    st.subheader("Step time and the cost table")
    frame = steps.step_cost(ctx.source, ctx.token, ctx.since, ctx.until)
    if frame.empty:
        st.info("No steps in this window.")
        return
    st.altair_chart(charts.step_cost(frame), width="stretch")
    step_time = ctx.policy.adaptive.step_time
    hist, error = steps.prediction_error(ctx.source, ctx.token, ctx.since, ctx.until, step_time)
    if not error["steps"]:
        st.info("No step carries its cost table's prediction at the rows it ran (table_step_ms) in this window.")
        return
    cols = st.columns(3)
    cols[0].metric("Median |error|", f"{error['median_abs']:.1%}",
                   help=f"{error['steps']:,} steps; {step_time} step time, as adaptive's gate reads it")  # fmt: skip
    cols[1].metric("p90 |error|", f"{error['p90_abs']:.1%}")
    cols[2].metric("Bias (mean signed error)", f"{error['bias']:+.1%}", help="positive: steps slower than predicted")
    st.altair_chart(
        charts.bars(
            hist.assign(error=hist["error"].round(2)),
            "error",
            "steps",
            f"(measured − predicted) / measured {step_time} step time, clipped to ±100%",
        ),
        width="stretch",
    )


def adaptive(ctx) -> None:
    """Cost table versions, and per bucket each arm's prediction error and mean compact window."""
    versions = cost_tables.versions(ctx.source, ctx.token)
    if versions.empty:
        return
    st.subheader("Cost table versions (adaptive)")
    st.dataframe(
        versions[["version", "parent", "source", "fitted_steps", "error_parent", "error_candidate"]],
        hide_index=True,
        width="stretch",
    )
    origin, width = ctx.buckets()
    until = ctx.until if ctx.until is not None else ctx.overview.newest
    step_time = ctx.policy.adaptive.step_time
    frame = cost_tables.by_bucket(ctx.source, ctx.token, origin, until, width, step_time)
    if frame.empty:
        return
    fitted = versions[versions["source"] == "online"]
    gate = next((g.threshold for g in ctx.policy.gates if g.metric == "cost_prediction_error"), None)
    title = f"median |predicted − measured| / measured ({step_time} time), by arm; rules: versions published"
    st.altair_chart(
        charts.with_versions(charts.lines(frame, "prediction_error", "arm", title, gate, "relative error"), fitted),
        width="stretch",
    )
    st.altair_chart(
        charts.with_versions(charts.lines(frame, "mean_window", "arm", "mean compact window, by arm"), fitted),
        width="stretch",
    )
    st.caption(
        "Each step is predicted by the table it was served on, at the rows it ran. In adaptive the treatment "
        "arm serves the fitted tables and the control arm the static one, at the same time."
    )


def latency(report: dict) -> None:
    st.subheader("Latency by load bucket")
    rows = [{"batch sizes": b, "window": "this window", **f} for b, f in report.get("latency", {}).items()]
    baseline = (report.get("baseline") or {}).get("latency", {})
    rows += [{"batch sizes": b, "window": "baseline", **f} for b, f in baseline.items()]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


def request_latency(ctx) -> None:
    st.subheader("Request latency by arm")
    table = requests.latency_by_arm(ctx.source, ctx.token, ctx.since, ctx.until)
    if not len(table):
        st.info("No request records in this window (replicas post one per finished request).")
        return
    st.dataframe(table, hide_index=True, width="stretch")
    st.altair_chart(
        charts.latency_distributions(requests.latency_histogram(ctx.source, ctx.token, ctx.since, ctx.until)),
        width="stretch",
    )
    st.caption(
        "What clients saw: time to first token (queueing included) and time per output token after it, for "
        "requests served inside one switchback epoch, by that epoch's arm; the comparison gates judge the "
        "same records pair by pair (Rollout page)."
    )


def render() -> None:
    page = windowed_page("Tiers and cost")
    if page is None:
        return
    ctx, figures = page
    report = figures["report"]
    summary(ctx, report)
    if ctx.require_store("The tier histogram, time series and cost plots"):
        histogram(ctx)
        over_time(ctx)
        cost(ctx)
        adaptive(ctx)
        request_latency(ctx)
    latency(report)


render()
