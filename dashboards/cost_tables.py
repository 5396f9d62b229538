"""The adaptive phase's cost tables for the Tiers-and-cost page: the versions stored, and per time bucket
and switchback arm how well the table in force predicted step time, and the mean compact window.

The figures are the controller's own (``controller.cost_report``): each step is
predicted by the table it was served on at the rows it ran. In adaptive the
treatment arm serves the fitted tables and the control arm the static one.
"""

from __future__ import annotations

import duckdb
import pandas as pd
import streamlit as st

from sparkgate.collectors import cost_tables
from sparkgate.controller import cost_report


@st.cache_data(show_spinner=False, max_entries=8)
def versions(_source, token: str) -> pd.DataFrame:
    """Every stored table's provenance, oldest first (empty for a store that predates the table)."""
    try:
        entries = cost_tables.entries(_source)
    except duckdb.CatalogException:
        return pd.DataFrame()
    return pd.DataFrame([e.provenance() for e in entries])


@st.cache_data(show_spinner=False, max_entries=16)
def by_bucket(_source, token: str, since: float, until: float, width: float, step_time: str) -> pd.DataFrame:
    """Per time bucket and arm: ``prediction_error``, ``mean_window``, ``steps`` and the tables served, with
    the bucket's ``start`` as a timestamp (empty without cost tables)."""
    try:
        rows = cost_report.by_interval(_source, since, until + 1e-6, width, step_time)
    except duckdb.CatalogException:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["start"] = pd.to_datetime(since + frame["interval"] * width, unit="s", utc=True)
    frame["tables"] = frame["tables"].map(", ".join)
    frame["samples"] = frame["steps"]
    return frame
