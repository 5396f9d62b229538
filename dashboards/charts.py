"""Altair charts for the pages; each takes plain DataFrames and knows nothing about sources."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
from altair.typing import ChartType

from sparkgate.policies.vocabulary import COMPARISON_METRICS, DRIFT_METRICS

# Ladder order top to bottom on the timeline, then the side states.
PHASE_ORDER = ["adaptive", "compact", "canary", "shadow", "baseline", "paused", "fallback"]
PHASE_COLORS = ["#2e7d32", "#558b2f", "#f9a825", "#1565c0", "#78909c", "#8e24aa", "#c62828"]
# z for a two-sided 95% interval.
_Z95 = 1.959963984540054


def utc_x(field: str, **kwargs) -> alt.X:
    """A time axis drawn in UTC, as every caption says: Vega-Lite draws times in the viewer's zone unless the
    scale is UTC."""
    return alt.X(f"{field}:T", title="time (UTC)", scale=alt.Scale(type="utc"), **kwargs)


def utc_tip(field: str) -> alt.Tooltip:
    return alt.Tooltip(f"{field}:T", formatType="utc", format="%Y-%m-%d %H:%M:%S UTC", title=f"{field} (UTC)")


def wilson(successes: float, n: int, z: float = _Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion: each reliability bin's observed rate is one."""
    if not n:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def reliability_frame(bins: list[dict]) -> pd.DataFrame:
    """Reliability bins (``CalibrationStats.reliability`` rows) with each observed rate's 95% interval."""
    frame = pd.DataFrame(bins, columns=["lo", "hi", "count", "mean_p", "freq_y"])
    intervals = [wilson(f * n, n) for f, n in zip(frame["freq_y"], frame["count"])]
    frame["freq_lo"] = [i[0] for i in intervals]
    frame["freq_hi"] = [i[1] for i in intervals]
    return frame


def reliability(frame: pd.DataFrame, title: str) -> ChartType:
    """Observed rate against mean prediction per bin, with intervals and the diagonal; bar widths
    below show bin counts."""
    diagonal = (
        alt.Chart(pd.DataFrame({"p": [0.0, 1.0]})).mark_line(strokeDash=[4, 4], color="gray").encode(x="p:Q", y="p:Q")
    )
    scale = alt.Scale(domain=[0, 1])
    base = alt.Chart(frame)
    points = base.mark_circle(size=70).encode(
        x=alt.X("mean_p:Q", scale=scale, title="mean predicted survival S_k"),
        y=alt.Y("freq_y:Q", scale=scale, title="observed rate of y_k"),
        tooltip=[
            "lo",
            "hi",
            "count",
            alt.Tooltip("mean_p", format=".4f"),
            alt.Tooltip("freq_y", format=".4f"),
            alt.Tooltip("freq_lo", format=".4f"),
            alt.Tooltip("freq_hi", format=".4f"),
        ],
    )
    bars = base.mark_rule().encode(x="mean_p:Q", y="freq_lo:Q", y2="freq_hi:Q")
    top = alt.layer(diagonal, bars, points).properties(height=300, width=340, title=title)
    counts = base.mark_bar().encode(
        x=alt.X("lo:Q", scale=scale, title="bin"),
        x2="hi:Q",
        y=alt.Y("count:Q", title="labels"),
        tooltip=["lo", "hi", "count"],
    )
    return alt.vconcat(top, counts.properties(height=90, width=340))


def lines(
    frame: pd.DataFrame, y: str, color: str, title: str, threshold: float | None = None, y_title: str | None = None
) -> ChartType:
    """A time series per ``color`` value (x = bucket ``start``), with an optional gate threshold rule."""
    chart = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=utc_x("start"),
            y=alt.Y(f"{y}:Q", title=y_title or y),
            color=alt.Color(f"{color}:N"),
            tooltip=[utc_tip("start"), f"{color}:N", alt.Tooltip(y, format=".4f"), "samples"],
        )
    )
    if threshold is not None:
        rule = alt.Chart(pd.DataFrame({"threshold": [threshold]})).mark_rule(color="#c62828", strokeDash=[6, 3])
        chart = alt.layer(chart, rule.encode(y="threshold:Q"))
    return chart.properties(height=260, title=title)


def with_versions(chart: ChartType, versions: pd.DataFrame) -> ChartType:
    """``chart`` with a vertical rule where each fitted cost table was published (tooltip: version, errors)."""
    if versions.empty:
        return chart
    marks = versions.assign(time=pd.to_datetime(versions["created_at"], unit="s", utc=True))
    rules = (
        alt.Chart(marks)
        .mark_rule(color="#6a1b9a", strokeDash=[2, 2])
        .encode(x=utc_x("time"), tooltip=["version", "parent", utc_tip("time"), "error_parent", "error_candidate"])
    )
    return alt.layer(chart, rules)


def timeline(segments: pd.DataFrame, changes: pd.DataFrame) -> ChartType:
    """Phase bands over time and a point per policy change (tooltip: action, rule, operator)."""
    y = alt.Y("phase:N", sort=PHASE_ORDER, title=None)
    color = alt.Color("phase:N", scale=alt.Scale(domain=PHASE_ORDER, range=PHASE_COLORS), legend=None)
    bands = (
        alt.Chart(segments)
        .mark_bar(height=18)
        .encode(
            x=utc_x("start"),
            x2="end:T",
            y=y,
            color=color,
            tooltip=["phase", "stage", "revision", utc_tip("start"), utc_tip("end")],
        )
    )
    points = (
        alt.Chart(changes)
        .mark_point(filled=True, size=80, color="black")
        .encode(x=utc_x("time"), y=y, tooltip=[utc_tip("time"), "revision", "action", "outcome", "rule", "operator"])
    )
    return alt.layer(bands, points).properties(height=220)


def bars(frame: pd.DataFrame, x: str, y: str, title: str, color: str | None = None) -> ChartType:
    """Bars of ``y`` per ``x`` (ordinal); with ``color``, one bar per colour side by side."""
    encoding = {"x": alt.X(f"{x}:O"), "y": alt.Y(f"{y}:Q"), "tooltip": list(frame.columns)}
    if color:
        encoding.update(color=alt.Color(f"{color}:N"), xOffset=alt.XOffset(f"{color}:N"))
    return alt.Chart(frame).mark_bar().encode(**encoding).properties(height=260, title=title)


def curves(frame: pd.DataFrame, title: str) -> ChartType:
    """Predicted vs observed per depth (``task``, ``source`` predicted / observed) for one kind."""
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("depth:O"),
            y=alt.Y("value:Q", scale=alt.Scale(domain=[0, 1]), title="probability"),
            color=alt.Color("task:N"),
            strokeDash=alt.StrokeDash(
                "source:N", scale=alt.Scale(domain=["predicted", "observed"], range=[[1, 0], [5, 3]])
            ),
            tooltip=["task", "depth", "source", alt.Tooltip("value", format=".4f"), "samples"],
        )
        .properties(height=260, title=title)
    )


def step_cost(frame: pd.DataFrame) -> ChartType:
    """Measured step time (median, p10-p90) against verify rows, with the cost table's prediction."""
    base = alt.Chart(frame)
    x = alt.X("verify_rows:Q", title="verify rows")
    spread = base.mark_rule(color="#1565c0").encode(x=x, y=alt.Y("p10_ms:Q", title="step ms"), y2="p90_ms:Q")
    measured = base.mark_circle(size=60, color="#1565c0").encode(
        x=x,
        y="p50_ms:Q",
        tooltip=["verify_rows", "cost_table_version", "steps", "p10_ms", "p50_ms", "p90_ms", "predicted_ms"],
    )
    predicted = base.mark_line(point=True, color="#ef6c00", strokeDash=[5, 3]).encode(
        x=x, y="predicted_ms:Q", detail="cost_table_version:N"
    )
    return alt.layer(spread, measured, predicted).properties(
        height=280, title="step time vs verify rows (blue: measured p50, p10-p90; orange: cost table)"
    )


def comparison_frame(verdicts: list[dict]) -> pd.DataFrame:
    """The comparison verdicts that have an interval, for ``charts.comparison_intervals`` (other gates
    judged by an interval, e.g. the debiased ECE, are on another scale)."""
    rows = [
        {k: v[k] for k in ("gate", "value", "low", "high", "threshold", "samples")} | {"verdict": v["outcome"]}
        for v in verdicts
        if v.get("metric") in (*COMPARISON_METRICS, *DRIFT_METRICS)
        and v.get("low") is not None
        and v.get("high") is not None
        and v["value"] is not None
    ]
    return pd.DataFrame(rows, columns=["gate", "value", "low", "high", "threshold", "samples", "verdict"])


def comparison_intervals(frame: pd.DataFrame) -> ChartType:
    """Each comparison gate's estimate and interval (treatment / control), with its threshold: the gate
    passes only when the whole bar is on the good side of the red tick. Columns: gate, value, low, high,
    threshold, verdict."""
    base = alt.Chart(frame).encode(y=alt.Y("gate:N", title=None))
    bars = base.mark_rule(strokeWidth=3).encode(
        x=alt.X("low:Q", title="treatment / control", scale=alt.Scale(zero=False)), x2="high:Q",
        color=alt.Color("verdict:N", scale=alt.Scale(domain=["pass", "fail", "inconclusive"],
                                                      range=["#2e7d32", "#c62828", "#9e9e9e"])),
    )  # fmt: skip
    points = base.mark_point(filled=True, color="black").encode(x="value:Q", tooltip=list(frame.columns))
    thresholds = base.mark_tick(color="#c62828", thickness=2, size=18).encode(x="threshold:Q")
    return (bars + points + thresholds).properties(title="Comparison gates: estimate, interval and threshold")


def latency_distributions(frame: pd.DataFrame) -> ChartType:
    """TTFT and TPOT histograms (log-spaced bins) per arm, one panel per measure. Columns: measure, arm,
    ms, requests."""
    return (
        alt.Chart(frame)
        .mark_line(point=True, interpolate="step-after")
        .encode(
            x=alt.X("ms:Q", scale=alt.Scale(type="log"), title="milliseconds"),
            y=alt.Y("requests:Q"),
            color=alt.Color("arm:N"),
            tooltip=list(frame.columns),
        )
        .properties(height=180)
        .facet(row=alt.Row("measure:N", title=None))
        .resolve_scale(x="independent")
        .properties(title="Request latency by switchback arm")
    )


def switchback(frame: pd.DataFrame) -> ChartType:
    """The switchback schedule as it ran: a band per replica and epoch, coloured by arm. Columns: replica_id,
    epoch, arm, start and end (datetimes), steps."""
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=utc_x("start", axis=alt.Axis(format="%H:%M:%S")),
            x2="end:T",
            y=alt.Y("replica_id:N", title=None),
            color=alt.Color(
                "arm:N",
                scale=alt.Scale(domain=["treatment", "control"], range=["#f9a825", "#1565c0"]),
                legend=alt.Legend(orient="top"),
            ),
            tooltip=[utc_tip(c) if c in ("start", "end") else c for c in frame.columns],
        )
        # A band of fixed height per replica: a fixed chart height squeezes a large fleet's rows together.
        .properties(height=alt.Step(24), title="Switchback epochs of this stage")
    )


def label_sources(frame: pd.DataFrame) -> ChartType:
    """Compact labels per depth, stacked by where they come from. Columns: depth, source, labels."""
    order = ["observed", "recovered", "estimated", "censored"]
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("depth:O", title="depth k"),
            y=alt.Y("labels:Q", title="labels"),
            color=alt.Color(
                "source:N",
                scale=alt.Scale(domain=order, range=["#1565c0", "#2e7d32", "#f9a825", "#9e9e9e"]),
                sort=order,
            ),
            order=alt.Order("source_order:Q"),
            tooltip=["depth", "source", "labels"],
        )
        .transform_calculate(source_order=f"indexof({order!r}, datum.source)")
        .properties(title="Compact labels per depth: observed, recovered, estimated, censored", height=220)
    )
