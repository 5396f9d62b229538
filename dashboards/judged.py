"""What the gates judged, beside a page's own figures.

A page's figures are computed over the window the sidebar chooses (the current stage by default), while the
controller judges the newest evaluation intervals of the stage (reaching further back while the calibration
gates lack labels): the two differ whenever the stage is longer than the gates' window. So a page pairs its
figure with the stored verdict of the gates on that metric, from the newest decision that judged gates,
exactly as the controller recorded it."""

from __future__ import annotations

from collections.abc import Iterable

import streamlit as st

from .context import when
from .data import latest_verdicts


def verdicts_on(decisions: list[dict], metrics: Iterable[str]) -> tuple[dict | None, list[dict]]:
    """The newest decision that judged gates and its verdicts of gates on ``metrics`` (deciding ones first,
    in policy order)."""
    decision, verdicts = latest_verdicts(decisions)
    wanted = set(metrics)
    chosen = [v for v in verdicts if v.get("metric") in wanted]
    return decision, sorted(chosen, key=lambda v: bool(v.get("dry_run")))


def describe(verdict: dict, fmt: str = ".4f") -> str:
    """One verdict as a line: gate, value with its interval, the threshold, samples and the outcome."""
    value = "—" if verdict.get("value") is None else format(verdict["value"], fmt)
    low, high = verdict.get("low"), verdict.get("high")
    if low is not None or high is not None:
        value += " [" + ", ".join("open" if b is None else format(b, fmt) for b in (low, high)) + "]"
    bound = "≤" if verdict.get("direction") == "at_most" else "≥"
    dry = ", dry run" if verdict.get("dry_run") else ""
    return (f"{verdict['gate']}: {value} against {bound} {verdict['threshold']:g} over {verdict['samples']:,} "
            f"samples: {verdict['outcome']}{dry}")  # fmt: skip


def show(decisions: list[dict], metrics: Iterable[str], fmt: str = ".4f") -> None:
    """The gates' verdicts on ``metrics`` at their newest look, or why there are none."""
    decision, verdicts = verdicts_on(decisions, metrics)
    if decision is None or not verdicts:
        st.caption("No gate of this metric judged an interval yet: the figures above are the window's alone.")
        return
    lines = "\n".join(f"- {describe(v, fmt)}" for v in verdicts)
    st.markdown(f"**What the gates judged** at {when(decision['decided_at'])} (their own window, not this one):\n"
                f"{lines}")  # fmt: skip
