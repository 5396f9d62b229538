"""Fleet: each replica's versions (model, drafter, STS, cost table) and joint contract, the phase and
revision it last reported, when it was last seen and how fast its records arrive."""

from __future__ import annotations

import time

import streamlit as st

from sparkgate.dashboards import charts, steps
from sparkgate.dashboards.context import current, when

VERSIONS = ("contract", "model_version", "drafter_version", "sts_version", "cost_table_version")


def ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def render() -> None:
    ctx = current()
    st.title("Fleet")
    if not ctx.require_store("The fleet view") or not ctx.require_steps():
        return
    frame = steps.fleet(ctx.source, ctx.token)
    # Silent against the fleet's newest step, not the wall clock: a stored run read later is not all silent.
    # Whether the whole fleet went quiet is the newest step's age, shown beside it.
    newest = float(frame["last_seen"].max())
    stale = frame["last_seen"] < newest - ctx.policy.stale_after_s
    cols = st.columns(4)
    cols[0].metric("Replicas", len(frame))
    cols[1].metric(
        "Silent replicas",
        int(stale.sum()),
        help=f"no step for more than stale_after_s = {ctx.policy.stale_after_s:g} s before the fleet's newest",
    )
    cols[2].metric("Newest step", f"{ago(max(0.0, time.time() - newest))} ago", help=when(newest))
    cols[3].metric("Steps per second (fleet)", f"{frame['steps_per_s'].sum():.1f}")
    mixed = [v for v in VERSIONS if frame[v].nunique(dropna=False) > 1]
    if "contract" in mixed:
        st.warning("Replicas are on different contracts: the controller judges nothing until they agree.")
    if mixed:
        st.warning(f"Replicas disagree on {', '.join(mixed)}: figures mix versions.")
    if len(set(frame["revision"])) > 1:
        st.warning("Replicas last reported different policy revisions: some have not picked up the newest policy.")
    shown = frame.assign(
        last_seen=frame["last_seen"].map(when),
        silent_for=[ago(newest - seen) if silent else "" for seen, silent in zip(frame["last_seen"], stale)],
    )
    shown[list(VERSIONS)] = shown[list(VERSIONS)].fillna("(none)")
    st.dataframe(
        shown,
        hide_index=True,
        width="stretch",
        column_config={
            "steps_per_s": st.column_config.NumberColumn("steps/s", format="%.2f"),
            "request_rows_per_s": st.column_config.NumberColumn("request rows/s", format="%.1f"),
        },
    )
    st.altair_chart(charts.bars(frame, "replica_id", "steps_per_s", "steps per second per replica"), width="stretch")
    st.caption(
        f"Rates are measured over each replica's last {steps.RATE_WINDOW_S:g} s of data; versions and "
        "phase are those of its newest step; quarantined counts its rejected records."
    )


render()
