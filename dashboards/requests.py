"""Request-record aggregates for the latency view (store sources only): what clients saw, by switchback arm.

TTFT and TPOT are read from ``request_records`` (one row per finished or
cancelled request, docs/design.md §4) within the window by finish time;
requests served across an epoch boundary carry no arm and show as ``spans
epochs``, outside switchback as ``no switchback``.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from .series import time_where

# TTFT and TPOT are histogrammed on a log scale: this many bins per factor of 10.
_BINS_PER_DECADE = 10


def _where(since: float | None, until: float | None) -> tuple[str, list]:
    where, params = time_where(since, until, column="finish_ts")
    return where + " AND finish_reason <> 'cancelled'", params


_ARM = "CASE WHEN arm IS NOT NULL THEN arm WHEN epoch IS NULL AND phase IN ('baseline', 'fallback', 'paused') " \
    "THEN 'no switchback' ELSE 'spans epochs' END"  # fmt: skip


@st.cache_data(show_spinner=False, max_entries=16)
def latency_by_arm(_source, token: str, since: float | None, until: float | None) -> pd.DataFrame:
    """Per arm: requests, cancelled aside, and TTFT / TPOT at p50 and p99 (ms)."""
    where, params = _where(since, until)
    return _source.query(
        f"""SELECT {_ARM} AS arm, count(*) AS requests,
               quantile_cont(ttft_ms, 0.5) AS ttft_p50_ms, quantile_cont(ttft_ms, 0.99) AS ttft_p99_ms,
               quantile_cont(tpot_ms, 0.5) AS tpot_p50_ms, quantile_cont(tpot_ms, 0.99) AS tpot_p99_ms
        FROM request_records WHERE {where} GROUP BY 1 ORDER BY 1""",
        params,
    ).to_pandas()


@st.cache_data(show_spinner=False, max_entries=16)
def latency_histogram(_source, token: str, since: float | None, until: float | None) -> pd.DataFrame:
    """Requests per (measure, arm, log-spaced bin of milliseconds), for the TTFT and TPOT distributions."""
    where, params = _where(since, until)
    bins = []
    for measure in ("ttft_ms", "tpot_ms"):
        bins.append(
            f"""SELECT '{measure.removesuffix("_ms").upper()}' AS measure, {_ARM} AS arm,
                   power(10, floor(log10(greatest({measure}, 0.01)) * {_BINS_PER_DECADE}) / {_BINS_PER_DECADE})
                       AS ms, count(*) AS requests
            FROM request_records WHERE {where} AND {measure} IS NOT NULL GROUP BY ALL"""
        )
    return _source.query(" UNION ALL ".join(bins) + " ORDER BY 1, 2, 3", params + params).to_pandas()
