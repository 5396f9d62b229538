"""Calibration: per-depth survival ECE as the gates see it (uncensored traffic), reliability
diagrams with bin counts and intervals, ECE over time, per STS version and per slice, and the
censored compact view, labelled as such and never gated."""

from __future__ import annotations

import streamlit as st

from sparkgate.controller.queries import SLICE_COLUMNS
from sparkgate.dashboards import charts, data, judged, series
from sparkgate.dashboards.context import windowed_page
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

# The gates on the full-block labels' calibration (policies.gate.METRICS), whose verdicts the page shows.
CALIBRATION_METRICS = ("survival_ece", "survival_ece_upper", "survival_ece_debiased", "survival_ece_debiased_replica",
                       "survival_ece_drift", "windowed_ece_drift", "windowed_ece_drift_replica")  # fmt: skip
UNCENSORED = f"Uncensored ({', '.join(FULL_BLOCK_MODES)}): gated"
COMPACT = "Compact (observed and recovered labels; the censored rest biases it): never gated"


def threshold(ctx, metric: str) -> float | None:
    return next((g.threshold for g in ctx.policy.gates if g.metric == metric and not g.promql), None)


def per_depth(ctx, report: dict) -> None:
    table = data.depth_table(report["calibration"]["survival"])
    st.subheader("Survival ECE per depth — " + UNCENSORED)
    if table.empty:
        st.info(
            "No uncensored labels in this window: the gates see no calibration data (inconclusive). "
            "Static, shadow and the cap-accept observation fraction produce them."
        )
        return
    worst = table.loc[table["ece"].idxmax()]
    cols = st.columns(2)
    cols[0].metric("Worst depth ECE (plug-in)", f"{worst['ece']:.4f}", help=f"depth {int(worst['depth'])}")
    cols[1].metric("Labels at depth 1", f"{int(table.iloc[0]['samples']):,}")
    # The shipped policies judge the debiased ECE and its drift, not this plug-in figure: show what they read.
    judged.show(ctx.ledger["decisions"], CALIBRATION_METRICS)
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.4f")
            for c in ("ece", "ece_lo", "ece_hi", "ece_equal_mass", "brier", "auroc", "mean_p", "rate")
        },
    )
    st.caption(
        "ece_lo / ece_hi: 95% bootstrap interval resampling requests (the controller's estimator). "
        "mean_p: mean predicted S_k; rate: observed rate of y_k."
    )


def reliability(figures: dict) -> None:
    st.subheader("Reliability diagram")
    view = st.radio("Traffic", [UNCENSORED, COMPACT], horizontal=True)
    bins_by_depth = figures["reliability"]["uncensored" if view == UNCENSORED else "compact"]
    depths = [d for d, bins in bins_by_depth.items() if bins]
    if not depths:
        st.info("No labels of this kind in the window.")
        return
    depth = st.selectbox("Depth k", depths)
    frame = charts.reliability_frame(bins_by_depth[depth])
    left, right = st.columns(2)
    left.altair_chart(charts.reliability(frame, f"depth {depth}: {view.split(':')[0].lower()}"), width="stretch")
    right.dataframe(
        frame,
        hide_index=True,
        width="stretch",
        column_config={
            c: st.column_config.NumberColumn(format="%.4f")
            for c in ("lo", "hi", "mean_p", "freq_y", "freq_lo", "freq_hi")
        },
    )
    right.caption("One row per non-empty bin: labels, mean predicted S_k, observed rate and its 95% Wilson interval.")


def compact_view(report: dict) -> None:
    st.subheader("Compact traffic — observed and recovered labels (not gated)")
    table = data.depth_table(report["calibration"]["compact"]["survival"])
    if table.empty:
        st.info("No compact traffic in this window.")
        return
    yield_ = report.get("label_yield") or {}
    if yield_.get("verify_rows"):
        left, right = st.columns(2)
        left.metric("Uncensored labels per verified row", f"{yield_['per_verify_row']:.3f}",
                    help="Labels known when their step was verified, per row the target ran (all modes).")  # fmt: skip
        right.metric("… with recovery", f"{yield_['per_verify_row_with_recovery']:.3f}",
                     help="Adding the labels recovered afterwards: what observe_fraction could give up.")  # fmt: skip
    st.altair_chart(charts.label_sources(data.label_sources(table)), width="stretch")
    st.caption(
        "Compact requests verify only their window: when all of it is accepted, deeper labels are not "
        "observed. The tokens a greedy request commits next settle them exactly (recovered); a sampled "
        "request's next depth gets its acceptance probability only (estimated, never counted as a label); "
        "the rest stay censored (the request finished first). ECE here is over observed and recovered "
        "labels; what stays censored still biases it, so it is shown for comparison and never gated."
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={c: st.column_config.NumberColumn(format="%.4f") for c in ("ece", "mean_p", "rate")},
    )


def over_time(ctx) -> None:
    st.subheader("Survival ECE per depth over time (uncensored)")
    origin, width = ctx.buckets()
    frame = series.calibration(ctx.source, ctx.token, ctx.since, ctx.until, origin, width)
    if frame.empty:
        st.info("No uncensored labels in this window.")
        return
    st.altair_chart(
        charts.lines(frame, "ece", "depth", f"{width:g} s buckets", threshold(ctx, "survival_ece"), "survival ECE"),
        width="stretch",
    )


def before_after_sts(ctx) -> None:
    st.subheader("Before vs after STS")
    frame = series.sts_versions(ctx.source, ctx.token, ctx.since, ctx.until)
    if not len(frame):
        st.info("No steps in this window: nothing announced an STS version.")
        return
    if frame["depth"].isna().all():
        version = frame["sts_version"].iloc[0]
        st.info(
            f"Every step in this window announced the same STS version, {version}: the comparison "
            "appears once a new STS version rolls out (`sparkgate calibrate`, then `serve --sts-version`)."
        )
        return
    st.caption("Survival ECE per depth for each STS version the replicas announced; (none) is uncalibrated.")
    st.dataframe(
        frame.pivot(index="sts_version", columns="depth", values="ece").rename(columns=lambda d: f"k={d}"),
        width="stretch",
        column_config={f"k={d}": st.column_config.NumberColumn(format="%.4f") for d in frame["depth"].unique()},
    )


def by_slice(ctx) -> None:
    st.subheader("Slices")
    key = st.selectbox(
        "Split the window by",
        ["(none)"] + list(SLICE_COLUMNS),
        help="Each slice is evaluated by the controller's code on its own; load is the batch-size "
        "bucket [2^b, 2^(b+1)).",
    )
    if key == "(none)":
        return
    frame = data.slices(ctx.source, ctx.token, key, ctx.since, ctx.until, ctx.phase)
    if frame.empty:
        st.info("No uncensored labels in this window.")
        return
    for values, caption in (("ece", "survival ECE"), ("samples", "labels")):
        st.caption(f"{caption} per {key} and depth")
        st.dataframe(
            frame.pivot(index=key, columns="depth", values=values).rename(columns=lambda d: f"k={d}"), width="stretch"
        )


def render() -> None:
    page = windowed_page("Calibration")
    if page is None:
        return
    ctx, figures = page
    report = figures["report"]
    per_depth(ctx, report)
    if ctx.require_store("The reliability diagram"):
        reliability(figures)
    compact_view(report)
    if ctx.is_store:
        over_time(ctx)
        before_after_sts(ctx)
        by_slice(ctx)
    st.subheader("Conditional ECE per depth (raw c_k over rows at risk)")
    st.dataframe(data.depth_table(report["calibration"]["conditional"]), hide_index=True, width="stretch")


render()
