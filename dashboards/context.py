"""What every page needs: the source, the rollout policy, the ledger and the chosen window.

``app.py`` builds one ``Context`` per script run (sidebar included) and pages
read it with ``current()``. Readers are cached per source token, so a new
snapshot generation or a changed DuckDB file is picked up on the next rerun.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from sparkgate.controller.queries import Slice
from sparkgate.policies.rollout import DEFAULT_PATH, RolloutPolicy, load_rollout_policy
from sparkgate.policies.vocabulary import CHANGES_POLICY

from . import data, series
from .source import ControllerClient, NoData, SourceError, SourceSpec, StoreReader

_KEY, _WINDOW_KEY = "sparkgate.context", "sparkgate.window"
STAGE, PREVIOUS, HOUR, DAY, ALL = (
    "Current stage",
    "Previous stage (what the last change judged)",
    "Last hour of data",
    "Last day of data",
    "All data",
)
_SPANS = {HOUR: 3600.0, DAY: 86400.0}


def parse_args(argv: list[str]) -> tuple[SourceSpec, Path]:
    """The app's own arguments (after ``--`` on the ``streamlit run`` line)."""
    parser = argparse.ArgumentParser(prog="sparkgate dashboard")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--db")
    group.add_argument("--snapshot-dir")
    group.add_argument("--controller")
    parser.add_argument("--policy", default=str(DEFAULT_PATH))
    args = parser.parse_args(argv)
    return SourceSpec(args.db, args.snapshot_dir, args.controller), Path(args.policy)


@st.cache_resource(show_spinner=False, max_entries=4)
def _reader(spec: SourceSpec, token: str) -> StoreReader | ControllerClient:
    return spec.open()


@st.cache_resource(show_spinner=False)
def _policy(path: Path) -> RolloutPolicy:
    return load_rollout_policy(path)


def when(ts: float | None) -> str:
    return "—" if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Context:
    spec: SourceSpec
    source: StoreReader | ControllerClient
    policy: RolloutPolicy
    overview: data.Overview | None  # None for the controller API
    ledger: dict
    since: float | None
    until: float | None
    window_label: str

    @property
    def token(self) -> str:
        return self.source.token

    @property
    def is_store(self) -> bool:
        return self.source.kind == "store"

    @property
    def phase(self) -> str:
        """The phase in force (``canary`` when the ledger is empty: the gate view most reports want)."""
        change = data.latest_change(self.ledger["decisions"])
        return change["phase_to"] if change else "canary"

    def figures(self, slice_: Slice = Slice()) -> dict:
        return data.window_figures(self.source, self.token, self.since, self.until, self.phase, slice_)

    def buckets(self) -> tuple[float, float]:
        """(origin, width) of the time buckets over the window (store sources)."""
        overview = self.overview
        lo = self.since if self.since is not None else overview.oldest if overview is not None else None
        hi = self.until if self.until is not None else overview.newest if overview is not None else None
        assert lo is not None and hi is not None, "only pages over stored steps (require_steps) ask for buckets"
        return lo, series.bucket_seconds(lo, hi)

    def require_store(self, what: str) -> bool:
        """False (after saying so) when ``what`` needs raw rows the controller API does not serve."""
        if self.is_store:
            return True
        st.info(
            f"{what} needs the stored rows: start the dashboard with `--snapshot-dir DIR` (the directory "
            "`sparkgate serve --snapshot-dir` publishes) or `--db FILE`."
        )
        return False

    def require_steps(self) -> bool:
        """False (after saying what to do) when the window holds no step records."""
        if self.overview is not None and self.overview.empty:
            st.info(
                "No step records yet. Point replicas at the controller (`sparkgate replica --controller URL`), "
                "poll an SGLang server (`sparkgate collect`) or ingest NDJSON (`sparkgate ingest`); the "
                "figures appear here after the next snapshot."
            )
            return False
        return True


def _windows(overview: data.Overview | None, decisions: list[dict]) -> dict[str, tuple]:
    """Window name -> (since, until), in the order offered; None bounds are open."""
    changes = [d["decided_at"] for d in decisions if d["action"] in CHANGES_POLICY]
    options = {}
    if changes:
        options[STAGE] = (changes[-1], None)
    # Two changes at one instant (an operator's action on the tick's) held a stage for no time at all: the
    # previous stage is the one before them that lasted.
    earlier = [c for c in changes if c < changes[-1]] if changes else []
    if earlier:
        options[PREVIOUS] = (earlier[-1], changes[-1])
    newest = overview.newest if overview is not None else time.time()
    for label, span in _SPANS.items():
        options[label] = (newest - span if newest is not None else None, None)
    options[ALL] = (None, None)
    return options


def _window(source, overview: data.Overview | None, decisions: list[dict]) -> tuple[float | None, float | None, str]:
    options = _windows(overview, decisions)
    labels = list(options)
    # Open on the first window holding steps: after a rollback the current stage may have none yet.
    default = next(
        (
            i
            for i, label in enumerate(labels)
            if overview is None or data.steps_in(source, source.token, *options[label])
        ),
        len(labels) - 1,
    )
    # The choice lives in session state of its own so that it survives page switches.
    chosen = st.session_state.get(_WINDOW_KEY)
    label = st.sidebar.radio(
        "Window",
        labels,
        index=labels.index(chosen) if chosen in labels else default,
        help="Rows with ts in the window. The gates judge the newest evaluation intervals of the current stage "
        "(further back while they lack labels), not this window: each page shows their stored verdicts beside "
        "its figures, and the gate table on the Rollout page shows exactly what they judged.",
    )
    st.session_state[_WINDOW_KEY] = label
    return (*options[label], label)


def build(argv: list[str]) -> Context | None:
    """Open the source and render the sidebar; None (after a message) when there is nothing to show."""
    spec, policy_path = parse_args(argv)
    try:
        source = _reader(spec, spec.token())
        policy = _policy(policy_path)
        overview = data.overview(source, source.token) if source.kind == "store" else None
        ledger = data.ledger_view(source, source.token, policy)
    except NoData as exc:
        st.info(str(exc))
        return None
    except (SourceError, ValueError, OSError) as exc:
        st.error(str(exc))
        return None
    st.sidebar.caption(f"Source: {source.label}")
    if overview is not None:
        st.sidebar.caption(
            f"Newest step: {when(overview.newest)} · {overview.counts['depth_labels']:,} depth "
            f"labels · {overview.counts['decisions']:,} decisions"
        )
    since, until, label = _window(source, overview, ledger["decisions"])
    if st.sidebar.button("Reload", help="Read the newest published data (a rerun does this too)."):
        st.rerun()
    if since is not None or until is not None:
        st.sidebar.caption(f"{when(since) if since else 'start'} → {when(until) if until else 'now'}")
    context = Context(spec, source, policy, overview, ledger, since, until, label)
    st.session_state[_KEY] = context
    return context


def current() -> Context:
    return st.session_state[_KEY]


def windowed_page(title: str) -> tuple[Context, dict] | None:
    """Open a page of figures over the selected window: (context, figures), or None
    (after saying so) when the window holds no steps yet."""
    ctx = current()
    st.title(title)
    st.caption(f"Window: {ctx.window_label}.")
    if not ctx.require_steps():
        return None
    return ctx, ctx.figures()
