"""Step-table aggregates for the tiers, cost and fleet pages (store sources only).

The ``steps`` table holds one row per verify step per replica (tens of
thousands for a 10M-label store), so these are single grouped queries; only
the aggregated rows leave DuckDB.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sparkgate.controller.served_steps import STEP_COLUMN

from .series import time_where

# Relative step-time prediction error is histogrammed in bins of this width, clipped to ±_ERROR_CLIP.
_ERROR_BIN = 0.05
_ERROR_CLIP = 1.0
# Records per second are measured over each replica's last this many seconds of data.
RATE_WINDOW_S = 60.0
# A step's predicted time: its table's prediction at the rows it ran, else (an engine that records only
# that, such as SGLang) the scheduler's price of its plan, which counts each request at its window.
PREDICTED = "coalesce(table_step_ms, predicted_step_ms)"


@st.cache_data(show_spinner=False, max_entries=16)
def tier_histogram(_source, token: str, since: float | None, until: float | None) -> pd.DataFrame:
    """Steps per captured tier (graph hits, by tier rows) and per miss reason (eager)."""
    where, params = time_where(since, until)
    return _source.query(
        f"""
        SELECT CASE WHEN NOT graph_hit THEN 'eager: ' || coalesce(miss_reason, 'unknown')
                    WHEN tier = -2 THEN 'not reported: ' || tier_rows::VARCHAR ELSE tier_rows::VARCHAR END AS tier,
               graph_hit, count(*) AS steps, avg(verify_rows) AS mean_verify_rows,
               avg(tier_rows - verify_rows) FILTER (WHERE graph_hit) AS mean_padding_rows
        FROM steps WHERE {where} GROUP BY ALL ORDER BY graph_hit DESC, min(tier_rows)""",
        params,
    ).to_pandas()


@st.cache_data(show_spinner=False, max_entries=16)
def step_cost(_source, token: str, since: float | None, until: float | None) -> pd.DataFrame:
    """Per verify-row count and cost table version: measured step time quantiles and the mean
    time the cost table predicted for those steps (``PREDICTED``)."""
    where, params = time_where(since, until)
    return _source.query(
        f"""
        SELECT verify_rows, coalesce(cost_table_version, '(none)') AS cost_table_version, count(*) AS steps,
               quantile_cont(step_ms, 0.1) AS p10_ms, quantile_cont(step_ms, 0.5) AS p50_ms,
               quantile_cont(step_ms, 0.9) AS p90_ms, avg({PREDICTED}) AS predicted_ms
        FROM steps WHERE {where} GROUP BY ALL ORDER BY verify_rows""",
        params,
    ).to_pandas()


@st.cache_data(show_spinner=False, max_entries=16)
def prediction_error(
    _source, token: str, since: float | None, until: float | None, step_time: str = "wall"
) -> tuple[pd.DataFrame, dict]:
    """Histogram of (measured − predicted) / measured step time and its summary (steps with a prediction,
    median and p90 absolute relative error, mean signed error), in adaptive's gate's definition
    (``controller.served_steps.relative_errors``): the table's prediction at the rows each step ran
    (``table_step_ms``, never the scheduler's price of its plan) against the step time adaptive measures
    (``step_time``: wall or CPU), so the page and the gate show one error."""
    where, params = time_where(since, until)
    measured = STEP_COLUMN[step_time]
    error = f"({measured} - table_step_ms) / {measured}"
    valid = f"{where} AND table_step_ms IS NOT NULL AND {measured} > 0"
    hist = _source.query(
        f"""
        SELECT (floor(greatest(least({error}, {_ERROR_CLIP - 1e-9}), {-_ERROR_CLIP}) / {_ERROR_BIN})
                * {_ERROR_BIN}) AS error, count(*) AS steps
        FROM steps WHERE {valid} GROUP BY 1 ORDER BY 1""",
        params,
    ).to_pandas()
    summary = _source.query(
        f"""
        SELECT count(*) AS steps, median(abs({error})) AS median_abs, quantile_cont(abs({error}), 0.9) AS p90_abs,
               avg({error}) AS bias
        FROM steps WHERE {valid}""",
        params,
    ).to_pylist()[0]
    return hist, summary


@st.cache_data(show_spinner=False, max_entries=8)
def fleet(_source, token: str) -> pd.DataFrame:
    """Per replica: the versions of its newest step, phase and revision it reported, last seen, steps,
    and steps / request rows per second over its last ``RATE_WINDOW_S`` of data (the steps after the first
    over the time they span, so a replica with seconds of data is not read as slow; None from one step);
    plus quarantined records."""
    return _source.query(f"""
        WITH last AS (SELECT replica_id, max(ts) AS last_seen FROM steps GROUP BY replica_id),
        recent AS (  -- steps between the first and last of the window: a replica that just started has seconds
            SELECT s.replica_id, (count(*) - 1) / nullif(max(s.ts) - min(s.ts), 0) AS steps_per_s,
                   avg(s.batch_size) AS batch
            FROM steps s JOIN last USING (replica_id)
            WHERE s.ts > last.last_seen - {RATE_WINDOW_S!r} GROUP BY s.replica_id),
        rejected AS (SELECT replica_id, count(*) AS quarantined FROM quarantine GROUP BY replica_id)
        SELECT s.replica_id, arg_max(s.model_version, s.ts) AS model_version,
               arg_max(s.drafter_version, s.ts) AS drafter_version, arg_max(s.sts_version, s.ts) AS sts_version,
               arg_max(s.cost_table_version, s.ts) AS cost_table_version, arg_max(s.contract, s.ts) AS contract,
               arg_max(s.phase, s.ts) AS phase,
               arg_max(s.policy_revision, s.ts) AS revision, max(s.ts) AS last_seen, count(*) AS steps,
               any_value(r.steps_per_s) AS steps_per_s,
               any_value(r.steps_per_s * r.batch) AS request_rows_per_s,
               coalesce(any_value(q.quarantined), 0) AS quarantined
        FROM steps s LEFT JOIN recent r USING (replica_id) LEFT JOIN rejected q USING (replica_id)
        GROUP BY s.replica_id ORDER BY s.replica_id""").to_pandas()


@st.cache_data(show_spinner=False, max_entries=8)
def switchback_epochs(_source, token: str, revision: int) -> pd.DataFrame:
    """Per replica and epoch of the newest revision up to ``revision`` that ran switchback epochs (after a
    rollback, the stage that was judged): the revision, the arm its steps were served in, the first and last
    step time and the steps (the switchback schedule as it ran)."""
    return _source.query(
        """WITH last AS (SELECT max(policy_revision) AS revision FROM steps
                         WHERE policy_revision <= ? AND epoch IS NOT NULL)
        SELECT s.policy_revision AS revision, s.replica_id, s.epoch, s.arm, min(s.ts) AS start, max(s.ts) AS end,
               count(*) AS steps
        FROM steps s JOIN last ON s.policy_revision = last.revision
        WHERE s.epoch IS NOT NULL GROUP BY ALL ORDER BY s.replica_id, s.epoch""",
        [revision],
    ).to_pandas()
