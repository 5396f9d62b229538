"""Cached figures the controller decides on: its ledger and its window evaluation.

Every figure comes from the controller's own code run on a read-only source
(``controller.ledger.decisions`` / ``load_state``, ``controller.evaluate.evaluate``)
or from its API, so a number on a page is the number a gate judged. Results are
cached per source ``token`` (it changes when new data is published) and per
window; ``_source`` is left out of the cache key on purpose (Streamlit skips
arguments starting with an underscore), the token stands for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from sparkgate.collectors.schema import MODES
from sparkgate.controller import ledger, rollout_state
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.queries import SLICE_COLUMNS, Slice, Window, slice_values
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import CHANGES_POLICY, FULL_BLOCK_MODES

from .series import time_where

# The controller API answers change without a token to key on: keep them this long.
API_TTL_S = 10
MAX_DECISIONS = 2000


@dataclass(frozen=True)
class Overview:
    """How much the store holds and the time range of its steps (None bounds when empty)."""

    counts: dict[str, int]
    oldest: float | None
    newest: float | None

    @property
    def empty(self) -> bool:
        return not self.counts.get("steps")


@st.cache_data(show_spinner=False, max_entries=8)
def overview(_source, token: str) -> Overview:
    counts = {
        t: _source.query(f"SELECT count(*) AS n FROM {t}").column("n")[0].as_py()
        for t in ("steps", "requests", "depth_labels", "decisions", "quarantine")
    }
    span = _source.query("SELECT min(ts) AS lo, max(ts) AS hi FROM steps").to_pylist()[0]
    return Overview(counts, span["lo"], span["hi"])


@st.cache_data(show_spinner=False, max_entries=64)
def steps_in(_source, token: str, since: float | None, until: float | None) -> int:
    """Step records in the window."""
    where, params = time_where(since, until)
    return _source.query(f"SELECT count(*) AS n FROM steps WHERE {where}", params).column("n")[0].as_py()


@st.cache_data(show_spinner=False, max_entries=8, ttl=API_TTL_S)
def ledger_view(_source, token: str, policy: RolloutPolicy) -> dict:
    """``decisions`` (oldest first, as ``Decision.to_dict``: the newest ``MAX_DECISIONS``, and before them
    the policy change in force when holds have pushed it out, so a long stage keeps its policy) and
    ``status`` (the controller's stage counters: passes, failures and their limits, and whether adaptive was
    reverted to its static tables; None when the ledger cannot be replayed)."""
    if _source.kind == "controller":
        newest = _source.get("/v1/decisions", limit=MAX_DECISIONS)
        change = _source.get("/v1/decisions", limit=1, changes_only=True)
        return {"decisions": _with_change(newest, change), "status": _source.get("/v1/status")}
    newest = [d.to_dict() for d in ledger.decisions(_source, limit=MAX_DECISIONS)]
    change = [d.to_dict() for d in ledger.decisions(_source, limit=1, changes_only=True)]
    decisions = _with_change(newest, change)
    try:
        state = ledger.load_state(_source, policy)
    except LookupError:  # the ledger's stage is not in the policy file given to the dashboard
        state = None
    # As of the newest judged interval: a stored run is read long after it ended.
    status = None
    if state is not None:  # the fields of ``GET /v1/status`` the pages read, as the controller answers them
        status = rollout_state.stage_counters(policy, state, state.last_conclusive_at)
        status |= {"cost_tables": dict(state.tables), "static_only": state.static_only}
    return {"decisions": decisions, "status": status}


def _with_change(newest: list[dict], change: list[dict]) -> list[dict]:
    return newest if latest_change(newest) is not None or not change else change + newest


def latest_change(decisions: list[dict]) -> dict | None:
    """The decision that set the policy in force (the newest start/advance/rollback/operator action)."""
    return next((d for d in reversed(decisions) if d["action"] in CHANGES_POLICY), None)


def latest_verdicts(decisions: list[dict]) -> tuple[dict | None, list[dict]]:
    """The newest decision that judged gates, and its verdicts (reasons carrying a ``gate``)."""
    for d in reversed(decisions):
        gates = [r for r in d["reasons"] if "gate" in r]
        if gates:
            return d, gates
    return None, []


def rule_of(decision: dict) -> str:
    """The rule a decision applied (its first reason), with its details."""
    reason: dict[str, Any] = next((r for r in decision["reasons"] if "rule" in r), {})
    details = {k: v for k, v in reason.items() if k != "rule" and v not in ("", None)}
    return reason.get("rule", "") + (f" {json.dumps(details)}" if details else "")


@st.cache_data(show_spinner=False, max_entries=32, ttl=API_TTL_S)
def window_figures(
    _source, token: str, since: float | None, until: float | None, phase: str, slice_: Slice = Slice()
) -> dict:
    """The controller's report over the window (``Evaluation.report``) plus, from a store, the
    reliability bins per depth (gated and compact views) and the window-length histograms."""
    if _source.kind == "controller":
        return {"report": _source.get("/v1/report", since=since, until=until)}
    evaluation = evaluate(_source, Window(since, until), slice_)
    survival = evaluation.aggregate.survival
    depths = sorted(survival.samples(FULL_BLOCK_MODES) | survival.samples(("compact",)))
    reliability = {
        view: {d: survival.reliability(d, modes) for d in depths}
        for view, modes in (("uncensored", FULL_BLOCK_MODES), ("compact", ("compact",)))
    }
    return {
        "report": evaluation.report(phase),
        "reliability": reliability,
        "windows": window_lengths(evaluation.aggregate.accept_hist, evaluation.aggregate.suggest_hist),
    }


def window_lengths(accept_hist: np.ndarray, suggest_hist: np.ndarray) -> pd.DataFrame:
    """How often each window length was served per mode (``accept_hist`` summed over accepted), and
    how often shadow's scheduler suggested each length (``suggest_hist`` over a*)."""
    rows = []
    for m, mode in enumerate(MODES):
        for w, n in enumerate(accept_hist[m].sum(axis=1)):
            if n:
                rows.append({"mode": mode, "window": w, "requests": int(n)})
    for w, n in enumerate(suggest_hist[MODES.index("shadow")].sum(axis=1)):
        if n:
            rows.append({"mode": "shadow (suggested)", "window": w, "requests": int(n)})
    frame = pd.DataFrame(rows, columns=["mode", "window", "requests"])
    frame["share"] = frame["requests"] / frame.groupby("mode")["requests"].transform("sum")
    return frame


def depth_table(calibration: dict) -> pd.DataFrame:
    """A report's per-depth calibration (``{"1": {...}}``) as rows sorted by depth."""
    rows = [{"depth": int(d), **figures} for d, figures in calibration.items()]
    frame = pd.DataFrame(rows).sort_values("depth") if rows else pd.DataFrame(columns=["depth"])
    if "ece_interval" in frame:
        interval = frame.pop("ece_interval")
        frame["ece_lo"] = [i[0] if i else None for i in interval]
        frame["ece_hi"] = [i[1] if i else None for i in interval]
    return frame.reset_index(drop=True)


def label_sources(compact: pd.DataFrame) -> pd.DataFrame:
    """Compact labels per depth and source (observed, recovered, estimated, censored), long form, from
    ``depth_table`` of the report's compact view (whose ``samples`` are observed plus recovered)."""
    counts = compact.assign(observed=compact["samples"] - compact["recovered"])
    return counts.melt(
        id_vars="depth", value_vars=["observed", "recovered", "estimated", "censored"], var_name="source",
        value_name="labels",
    )  # fmt: skip


@st.cache_data(show_spinner=False, max_entries=32)
def values(_source, token: str, key: str, since: float | None, until: float | None) -> list:
    """The distinct values of slice ``key`` in the window (``controller.queries.slice_values``)."""
    return slice_values(_source, key, Window(since, until))


@st.cache_data(show_spinner=False, max_entries=16)
def slices(_source, token: str, key: str, since: float | None, until: float | None, phase: str) -> pd.DataFrame:
    """Survival ECE and samples per depth for each value of slice ``key`` (task, temperature, load,
    replica) over the window, each from the controller's evaluation of that slice."""
    rows = []
    for value in values(_source, token, key, since, until):
        report = window_figures(_source, token, since, until, phase, Slice(**{SLICE_COLUMNS[key]: value}))["report"]
        for d, figures in report["calibration"]["survival"].items():
            rows.append({key: value, "depth": int(d), "ece": figures["ece"], "samples": figures["samples"]})
    return pd.DataFrame(rows, columns=[key, "depth", "ece", "samples"])
