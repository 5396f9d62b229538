"""Chart helpers: the Wilson interval behind every reliability bin, and charts that build valid specs."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.dashboards import charts


@given(st.integers(1, 10_000), st.data())
def test_the_wilson_interval_holds_the_observed_rate_within_zero_and_one(n, data):
    k = data.draw(st.integers(0, n))
    lo, hi = charts.wilson(k, n)
    assert 0.0 <= lo <= k / n + 1e-12 and k / n - 1e-12 <= hi <= 1.0  # up to round-off at k = 0 or n
    mirrored = charts.wilson(n - k, n)  # failures are successes of the complement
    assert mirrored == pytest.approx((1 - hi, 1 - lo), abs=1e-12)
    wider = charts.wilson(k, n, z=3.0)
    assert wider[0] <= lo + 1e-12 and hi <= wider[1] + 1e-12


def test_the_interval_narrows_with_more_labels_and_is_undefined_without_any():
    widths = [hi - lo for lo, hi in (charts.wilson(0.3 * n, n) for n in (10, 100, 1000, 10_000))]
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.02
    assert charts.wilson(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)  # the textbook 95% case
    assert all(math.isnan(v) for v in charts.wilson(0, 0))


def test_reliability_frames_carry_intervals_and_every_chart_builds():
    bins = [
        {"lo": 0.0, "hi": 0.5, "count": 40, "mean_p": 0.3, "freq_y": 0.25},
        {"lo": 0.5, "hi": 1.0, "count": 0, "mean_p": 0.0, "freq_y": 0.0},
    ]
    frame = charts.reliability_frame(bins)
    assert list(frame.columns) == ["lo", "hi", "count", "mean_p", "freq_y", "freq_lo", "freq_hi"]
    assert (frame.loc[0, "freq_lo"], frame.loc[0, "freq_hi"]) == charts.wilson(10, 40)
    assert math.isnan(frame.loc[1, "freq_lo"])
    start = pd.to_datetime([0, 60], unit="s")
    series = pd.DataFrame({"start": start, "ece": [0.01, 0.02], "depth": [1, 1], "samples": [5, 6]})
    segments = pd.DataFrame(
        {"phase": ["baseline", "shadow"], "stage": [0, 1], "revision": [1, 2], "start": start, "end": start}
    )
    changes = pd.DataFrame(
        {"time": start, "revision": [1, 2], "action": ["start", "advance"], "outcome": [None, "pass"]}
        | {"rule": ["start", "consecutive passes"], "operator": [None, None]}
    )
    steps = pd.DataFrame(
        {"verify_rows": [8, 16], "cost_table_version": ["ct"] * 2, "steps": [3, 4]}
        | {"p10_ms": [1.0, 2.0], "p50_ms": [1.5, 2.5], "p90_ms": [2.0, 3.0], "predicted_ms": [1.4, 2.6]}
    )
    comparisons = charts.comparison_frame(
        [
            {"gate": "p99_tpot_ratio", "metric": "p99_tpot_ratio", "value": 1.02, "low": 0.97, "high": 1.08,
             "threshold": 1.1, "samples": 12, "outcome": "pass"},
            {"gate": "survival_ece", "metric": "survival_ece", "value": 0.02, "low": None, "high": None,
             "threshold": 0.05, "samples": 9, "outcome": "pass"},
            {"gate": "survival_ece_debiased", "metric": "survival_ece_debiased", "value": 0.01, "low": -0.01,
             "high": 0.03, "threshold": 0.03, "samples": 9, "outcome": "pass"},
        ]
    )  # fmt: skip
    # Only comparisons with an interval are drawn: the debiased ECE's bounds are on another scale.
    assert list(comparisons["gate"]) == ["p99_tpot_ratio"]
    built = [
        charts.reliability(frame, "depth 1"),
        charts.lines(series, "ece", "depth", "ECE", threshold=0.05),
        charts.timeline(segments, changes),
        charts.bars(pd.DataFrame({"tier": ["8", "16"], "steps": [3, 4]}), "tier", "steps", "tiers"),
        charts.curves(
            pd.DataFrame({"depth": [1], "value": [0.5], "task": ["code"], "source": ["observed"], "samples": [9]}), "c"
        ),
        charts.step_cost(steps),
        charts.comparison_intervals(comparisons),
        charts.switchback(
            pd.DataFrame(
                {"replica_id": ["r0"] * 2, "epoch": [0, 1], "arm": ["treatment", "control"]}
                | {"start": start, "end": start, "steps": [4, 5]}
            )
        ),
        charts.latency_distributions(
            pd.DataFrame({"measure": ["TTFT", "TPOT"], "arm": ["control"] * 2, "ms": [100.0, 20.0], "requests": [3, 3]})
        ),
    ]
    # What each chart draws: its marks, and the (channel, field) pairs they encode.
    drawn = {
        "reliability": ({"bar", "circle", "line", "rule"}, {("x", "mean_p"), ("y", "freq_y"), ("y", "freq_lo"),
                        ("y2", "freq_hi"), ("y", "count"), ("x", "p"), ("y", "p")}),
        "lines": ({"line", "rule"}, {("x", "start"), ("y", "ece"), ("color", "depth"), ("y", "threshold")}),
        "timeline": ({"bar", "point"}, {("x", "start"), ("x2", "end"), ("y", "phase"), ("x", "time")}),
        "bars": ({"bar"}, {("x", "tier"), ("y", "steps")}),
        "curves": ({"line"}, {("x", "depth"), ("y", "value"), ("color", "task"), ("strokeDash", "source")}),
        "step_cost": ({"circle", "line", "rule"}, {("x", "verify_rows"), ("y", "p50_ms"), ("y", "p10_ms"),
                      ("y2", "p90_ms"), ("y", "predicted_ms")}),
        "comparison_intervals": ({"point", "rule", "tick"}, {("y", "gate"), ("x", "value"), ("x", "low"),
                                 ("x2", "high"), ("x", "threshold"), ("color", "verdict")}),
        "switchback": ({"bar"}, {("y", "replica_id"), ("x", "start"), ("x2", "end"), ("color", "arm")}),
        "latency_distributions": ({"line"}, {("x", "ms"), ("y", "requests"), ("color", "arm")}),
    }  # fmt: skip
    for name, chart in zip(drawn, built, strict=True):
        spec = chart.to_dict()
        assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
        marks, fields = _drawn(spec)
        assert (marks, fields >= drawn[name][1]) == (drawn[name][0], True), name
    rows = [r for chart in built[:2] for data in chart.to_dict()["datasets"].values() for r in data]
    assert {"threshold": 0.05} in rows  # the ECE threshold is drawn as a rule at its value
    compared = next(iter(built[6].to_dict()["datasets"].values()))
    assert [(r["gate"], r["low"], r["value"], r["high"], r["threshold"]) for r in compared] == [
        ("p99_tpot_ratio", 0.97, 1.02, 1.08, 1.1)
    ]


def _drawn(spec: dict) -> tuple[set[str], set[tuple[str, str]]]:
    """A spec's mark types and encoded (channel, field) pairs, through its layers, concatenations and facets."""
    marks, fields = set(), set()
    if "mark" in spec:
        marks.add(spec["mark"] if isinstance(spec["mark"], str) else spec["mark"]["type"])
    for channel, encoding in spec.get("encoding", {}).items():
        if isinstance(encoding, dict) and "field" in encoding:
            fields.add((channel, encoding["field"]))
    parts = [*spec.get("layer", []), *spec.get("hconcat", []), *spec.get("vconcat", [])]
    for part in [*parts, *([spec["spec"]] if "spec" in spec else [])]:
        more_marks, more_fields = _drawn(part)
        marks |= more_marks
        fields |= more_fields
    return marks, fields


def _temporal(spec: dict) -> list[tuple[str, dict]]:
    """Every temporal (channel, encoding) of a spec, tooltips included, through its layers."""
    out = []
    for channel, encoding in spec.get("encoding", {}).items():
        for e in encoding if isinstance(encoding, list) else [encoding]:
            if isinstance(e, dict) and e.get("type") == "temporal":
                out.append((channel, e))
    for part in spec.get("layer", []):
        out += _temporal(part)
    return out


def test_every_time_axis_and_tooltip_is_drawn_in_utc():
    """Captions say UTC; without a UTC scale Vega-Lite drew times in the viewer's own zone."""
    start = pd.to_datetime([0, 60], unit="s", utc=True)
    built = [
        charts.lines(pd.DataFrame({"start": start, "ece": [0.1, 0.2], "depth": [1, 1], "samples": [1, 1]}), "ece",
                     "depth", "t"),
        charts.timeline(pd.DataFrame({"phase": ["shadow"] * 2, "stage": [1, 1], "revision": [2, 2], "start": start,
                                      "end": start}),
                        pd.DataFrame({"time": start, "revision": [1, 2], "action": ["start", "advance"],
                                      "outcome": [None, "pass"], "rule": ["a", "b"], "operator": [None, None]})),
        charts.switchback(pd.DataFrame({"replica_id": ["r0"] * 2, "epoch": [0, 1], "arm": ["treatment", "control"],
                                        "start": start, "end": start, "steps": [1, 2]})),
    ]  # fmt: skip
    for chart in built:
        times = _temporal(chart.to_dict())
        assert times
        for channel, encoding in times:
            if channel == "tooltip":
                assert encoding.get("formatType") == "utc", encoding
            elif channel == "x":
                assert encoding.get("scale", {}).get("type") == "utc", encoding
