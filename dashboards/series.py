"""Time series over a window, pre-aggregated in SQL per time bucket (store sources only).

A 10M-label store cannot be evaluated once per bucket in an interactive page,
so label and request rows are summed per (bucket, ...) in DuckDB and the sums are
handed to the same estimators the controller uses: ``CalibrationStats`` for
ECE, ``Aggregate`` for utilization and ``controller.metrics.acceptance`` for
accepted lengths. Step-level figures (tier misses, padding) are cheap enough to
take from the controller's own per-window queries bucket by bucket.

Binning matches the controller's exactly: it bins ``p`` into ``FINE_BINS`` fine
bins by truncating ``p * FINE_BINS`` and sums ``FINE_PER_BIN`` of them per
equal-width bin (``controller.calibration``); the SQL below does the same
arithmetic on the same doubles.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from sparkgate.collectors.aggregate import Aggregate, CalibrationStats
from sparkgate.collectors.schema import MODES
from sparkgate.controller import queries
from sparkgate.controller.calibration import FINE_BINS, FINE_PER_BIN
from sparkgate.controller.metrics import acceptance, step_report
from sparkgate.controller.queries import Slice, Window

BUCKETS = 24
MODE_CODES = {mode: i for i, mode in enumerate(MODES)}
_NICE_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def _stats_sql(alias: str = "") -> str:
    """Select list of the per-(mode, depth, bin) sums behind ``CalibrationStats`` for survival labels."""
    p, y = f"{alias}survival", f"({alias}status = 'accepted')"
    return (
        f"{alias}mode::VARCHAR AS mode, {alias}depth::INTEGER AS d, "
        f"(least(floor({p} * {FINE_BINS}), {FINE_BINS - 1})::BIGINT // {FINE_PER_BIN})::INTEGER AS bin, "
        f"count(*) AS n, sum({p}) AS sum_p, count(*) FILTER (WHERE {y}) AS sum_y, "
        f"sum(power({p} - {y}::DOUBLE, 2)) AS sum_sq"
    )


def bucket_seconds(since: float, until: float, buckets: int = BUCKETS) -> float:
    """The smallest round width giving at most ``buckets`` buckets over [since, until]."""
    span = max(until - since, 1.0)
    return float(next((w for w in _NICE_S if span / w <= buckets), span / buckets))


def time_where(since: float | None, until: float | None, alias: str = "", column: str = "ts") -> tuple[str, list]:
    """WHERE clause (and params) keeping rows with since <= ``column`` < until; a None bound is open."""
    clauses, params = ["TRUE"], []
    if since is not None:
        clauses.append(f"{alias}{column} >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{alias}{column} < ?")
        params.append(until)
    return " AND ".join(clauses), params


def _bucketed(source, sql: str, since: float | None, until: float | None, origin: float, width: float) -> pd.DataFrame:
    """Run ``sql`` (with ``{bucket}`` and ``{where}`` placeholders) and return a DataFrame."""
    where, params = time_where(since, until)
    bucket = f"floor((ts - {origin!r}) / {width!r})::BIGINT"
    return source.query(sql.format(bucket=bucket, where=where), params).to_pandas()


def _start(origin: float, width: float, b: int) -> pd.Timestamp:
    return pd.Timestamp(origin + b * width, unit="s", tz="UTC")


@st.cache_data(show_spinner=False, max_entries=16)
def calibration(
    _source, token: str, since: float | None, until: float | None, origin: float, width: float
) -> pd.DataFrame:
    """Survival ECE and samples per (bucket, depth) over the gated (uncensored) modes."""
    frame = _bucketed(
        _source,
        f"""
        SELECT {{bucket}} AS b, {_stats_sql()}
        FROM {_source.plain("depth_labels")} WHERE {{where}} AND status != 'censored' GROUP BY ALL""",
        since,
        until,
        origin,
        width,
    )
    rows = []
    for b, part in frame.groupby("b"):
        stats = calibration_stats(part)
        samples = stats.samples()
        rows += [
            {"start": _start(origin, width, b), "depth": d, "ece": ece, "samples": samples[d]}
            for d, ece in stats.ece().items()
        ]
    return pd.DataFrame(rows, columns=["start", "depth", "ece", "samples"])


def calibration_stats(part: pd.DataFrame) -> CalibrationStats:
    """``CalibrationStats`` from rows of (mode, d, bin, n, sum_p, sum_y, sum_sq)."""
    stats = CalibrationStats.empty(int(part["d"].max()))
    index = (part["mode"].map(MODE_CODES).to_numpy(), part["d"].to_numpy(), part["bin"].to_numpy())
    for name, column in (("count", "n"), ("sum_p", "sum_p"), ("sum_y", "sum_y"), ("sum_sq", "sum_sq")):
        array = getattr(stats, name)
        np.add.at(array, index, part[column].to_numpy().astype(array.dtype))
    return stats


@st.cache_data(show_spinner=False, max_entries=16)
def sts_versions(_source, token: str, since: float | None, until: float | None) -> pd.DataFrame:
    """Survival ECE per depth for each STS version the steps announced (null: no STS). With one
    version there is nothing to compare: one row per depth is returned without touching the labels."""
    where, params = time_where(since, until)
    announced = (
        _source.query(f"SELECT DISTINCT coalesce(sts_version, '(none)') AS v FROM steps WHERE {where}", params)
        .column("v")
        .to_pylist()
    )
    if len(announced) < 2:
        return pd.DataFrame({"sts_version": announced, "depth": None, "ece": None, "samples": None})
    where, params = time_where(since, until, "l.")
    frame = _source.query(
        f"""
        SELECT coalesce(s.sts_version, '(none)') AS version, {_stats_sql("l.")}
        FROM {_source.plain("depth_labels")} l JOIN steps s USING (replica_id, step_id)
        WHERE {where} AND l.status != 'censored' GROUP BY ALL""",
        params,
    ).to_pandas()
    rows = []
    for version, part in frame.groupby("version"):
        stats = calibration_stats(part)
        samples = stats.samples()
        rows += [
            {"sts_version": version, "depth": d, "ece": ece, "samples": samples[d]} for d, ece in stats.ece().items()
        ]
    return pd.DataFrame(rows, columns=["sts_version", "depth", "ece", "samples"])


_HISTOGRAMS = {
    "accept_hist": ('"window"', "accepted", "TRUE"),
    "full_hist": ("accepted", "full_accept", "full_accept IS NOT NULL"),
    "suggest_hist": ("window_suggested", "full_accept", "window_suggested IS NOT NULL AND full_accept IS NOT NULL"),
}


@st.cache_data(show_spinner=False, max_entries=16)
def acceptance_series(
    _source, token: str, since: float | None, until: float | None, origin: float, width: float
) -> pd.DataFrame:
    """Per bucket: mean accepted and committed length per mode, upper-bound and shadow utilization
    (the bucketed form of ``controller.queries.request_histograms``, judged by ``Aggregate``)."""
    parts = {
        name: _bucketed(
            _source,
            f"""
        SELECT {{bucket}} AS b, mode::VARCHAR AS mode, {x}::INTEGER AS x, {y}::INTEGER AS y, count(*) AS n
        FROM {_source.plain("requests")} WHERE {{where}} AND {condition} GROUP BY ALL""",
            since,
            until,
            origin,
            width,
        )
        for name, (x, y, condition) in _HISTOGRAMS.items()
    }
    width_hist = 1 + max([int(max(p["x"].max(), p["y"].max())) for p in parts.values() if len(p)] + [0])
    rows = []
    for b in sorted(set().union(*(set(p["b"]) for p in parts.values()))):
        hists = {}
        for name, part in parts.items():
            hist = np.zeros((len(MODES), width_hist, width_hist), np.int64)
            part = part[part["b"] == b]
            modes = part["mode"].map(MODE_CODES).to_numpy()
            hist[modes, part["x"].to_numpy(), part["y"].to_numpy()] = part["n"].to_numpy()
            hists[name] = hist
        empty = CalibrationStats.empty(width_hist - 1)
        aggregate = Aggregate(empty, empty, **hists)
        start = _start(origin, width, b)
        rows += [
            {
                "start": start,
                "series": f"mean accepted ({mode})",
                "value": figures["mean_accepted"],
                "samples": figures["requests"],
            }
            for mode, figures in acceptance(aggregate).items()
        ]
        for series, value, samples in (
            (
                "upper-bound utilization (cap_accept)",
                aggregate.upper_bound_utilization(),
                hists["full_hist"][MODES.index("cap_accept")].sum(),
            ),
            (
                "shadow utilization (suggested)",
                aggregate.shadow_utilization(),
                hists["suggest_hist"][MODES.index("shadow")].sum(),
            ),
        ):
            if value is not None:
                rows.append({"start": start, "series": series, "value": value, "samples": int(samples)})
    return pd.DataFrame(rows, columns=["start", "series", "value", "samples"])


@st.cache_data(show_spinner=False, max_entries=16)
def tier_series(
    _source, token: str, since: float | None, until: float | None, origin: float, width: float
) -> pd.DataFrame:
    """Per bucket: the controller's ``step_report`` tiers (miss rate, misses per reason, padding ratio)."""
    occupied = _bucketed(
        _source, "SELECT DISTINCT {bucket} AS b FROM steps WHERE {where} ORDER BY 1", since, until, origin, width
    )["b"]
    rows = []
    for b in occupied:
        lo, hi = origin + b * width, origin + (b + 1) * width
        window = Window(lo if since is None else max(lo, since), hi if until is None else min(hi, until))
        tiers = step_report(
            queries.step_buckets(_source, window, Slice()), queries.miss_reasons(_source, window, Slice())
        )["tiers"]
        start = _start(origin, width, b)
        rows.append(
            {
                "start": start,
                "series": "miss rate (all reasons)",
                "value": tiers["miss_rate"],
                "samples": tiers["steps"],
            }
        )
        rows += [
            {"start": start, "series": f"miss rate ({reason})", "value": n / tiers["steps"], "samples": tiers["steps"]}
            for reason, n in tiers["misses"].items()
        ]
        if tiers["padding_ratio"] is not None:
            rows.append(
                {"start": start, "series": "padding ratio", "value": tiers["padding_ratio"], "samples": tiers["steps"]}
            )
    return pd.DataFrame(rows, columns=["start", "series", "value", "samples"])
