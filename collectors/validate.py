"""Validation of step records (docs/design.md §4), vectorised over a whole batch.

``validate_steps`` checks a batch in columnar form and returns, for every step,
the list of every problem found (never only the first), each naming the field
and the offending value. An empty list means the step may be stored. The same
code checks a single ``StepRecord`` (``validate``), so producer-side checks and
the collector can never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgate.collectors.schema import (
    HIDDEN_CHARS,
    MAX_ID_CHARS,
    MAX_UNIX_S,
    MISS_REASONS,
    MODES,
    NULLABLE_REQUEST_FIELDS,
    NULLABLE_STEP_FIELDS,
    READABLE_VERSIONS,
    RECORD_PHASES,
    REQUEST_TYPE,
    STEP_SCHEMA,
    TIER_UNREPORTED,
    Problem,
    StepRecord,
)
from sparkgate.collectors.wire import Flat, flatten, from_dicts
from sparkgate.policies.vocabulary import Arm, Phase

# Bounds the explode: a step yields batch rows x gamma depth labels.
MAX_GAMMA = 64
_TIMINGS = ("draft_ms", "schedule_ms", "verify_ms", "accept_ms", "step_ms")
_NON_NEGATIVE = ("step_id", "batch_size", "verify_rows", "tier_rows", "host_syncs", "policy_revision")
# A miss ran eager, in no tier; the runtime records it as tier -1.
NO_TIER = -1
# A token's place in its sequence: far above any context, far below where recovery's sums of positions overflow.
MAX_POSITION = 2**40


class _Report:
    """Collects problems per step; request-level problems are filed under their step."""

    def __init__(self, flat: Flat):
        self.flat = flat
        self.problems: list[list[Problem]] = [[] for _ in range(flat.steps.num_rows)]

    def steps(
        self,
        mask: np.ndarray,
        name: str,
        message: str | Callable[[int], str],
        value: Callable[[int], Any] | None = None,
    ) -> None:
        column = self.flat.steps.column(name)
        for index in np.flatnonzero(mask):
            i = int(index)
            text = message(i) if callable(message) else message
            self.problems[i].append(Problem(name, value(i) if value else column[i].as_py(), text))

    def requests(
        self,
        mask: np.ndarray,
        name: str,
        message: str | Callable[[int], str],
        value: Callable[[int], Any] | None = None,
    ) -> None:
        column = self.flat.requests.column(name)
        for index in np.flatnonzero(mask):
            j = int(index)
            text = message(j) if callable(message) else message
            got = value(j) if value else column[j].as_py()
            path = f"requests[{self.flat.slot[j]}].{name}"
            self.problems[self.flat.parent[j]].append(Problem(path, got, text))


def _bad_ids(column: pa.ChunkedArray) -> np.ndarray:
    """Ids too long to be keys (over ``MAX_ID_CHARS``) or holding control or bidirectional-format characters,
    which print as something else in a log, a table or a terminal."""
    too_long = pc.greater(pc.utf8_length(column), MAX_ID_CHARS)
    hidden = pc.match_substring_regex(column, HIDDEN_CHARS)
    return pc.fill_null(pc.or_(too_long, hidden), False).to_numpy(zero_copy_only=False)


def _check_id(file: Callable[..., None], column: pa.ChunkedArray, name: str) -> None:
    """The rules every id follows, filed by ``file`` (``_Report.steps`` or ``_Report.requests``)."""
    file(pc.fill_null(pc.equal(column, ""), False).to_numpy(zero_copy_only=False), name, "must not be empty")
    file(
        _bad_ids(column),
        name,
        f"at most {MAX_ID_CHARS} characters, none of them control or bidirectional-format characters",
        _shown_id(column),
    )


def _shown_id(column: pa.ChunkedArray) -> Callable[[int], Any]:
    """An id as a problem shows it: escaped (so hidden characters are visible), at most 80 characters."""

    def shown(i: int) -> str:
        text = ascii(column[i].as_py())[1:-1]
        return text if len(text) <= 80 else f"{text[:80]}… ({len(column[i].as_py())} chars)"

    return shown


def _ints(table: pa.Table, name: str) -> np.ndarray:
    return pc.fill_null(table.column(name), 0).to_numpy().astype(np.int64, copy=False)


def _floats(table: pa.Table, name: str, fill: float = 0.0) -> np.ndarray:
    return pc.fill_null(table.column(name), fill).to_numpy().astype(np.float64, copy=False)


def _nulls(table: pa.Table, name: str) -> np.ndarray:
    return pc.is_null(table.column(name)).to_numpy(zero_copy_only=False)


def _check_steps(report: _Report, gamma: np.ndarray, n_requests: np.ndarray) -> None:
    steps = report.flat.steps
    for name in STEP_SCHEMA.names:
        if name not in NULLABLE_STEP_FIELDS:
            report.steps(_nulls(steps, name), name, "missing (required field)")
    version = _ints(steps, "schema_version")
    report.steps(
        ~_nulls(steps, "schema_version") & ~np.isin(version, READABLE_VERSIONS),
        "schema_version",
        f"unknown schema_version; this collector reads {', '.join(map(str, READABLE_VERSIONS))}",
    )
    epoch_null, arm_null = _nulls(steps, "epoch"), _nulls(steps, "arm")
    report.steps(epoch_null != arm_null, "arm", "epoch and arm are set together or not at all")
    report.steps(~epoch_null & (_ints(steps, "epoch") < 0), "epoch", "must be >= 0")
    phase = pc.fill_null(steps.column("phase"), str(Phase.BASELINE))  # a missing one is named above
    report.steps(
        ~pc.is_in(phase, pa.array([str(p) for p in RECORD_PHASES])).to_numpy(zero_copy_only=False),
        "phase",
        f"expected one of {', '.join(RECORD_PHASES)}",
    )
    arm = pc.fill_null(steps.column("arm"), str(Arm.TREATMENT))
    report.steps(
        ~pc.is_in(arm, pa.array(list(Arm))).to_numpy(zero_copy_only=False), "arm", f"expected one of {', '.join(Arm)}"
    )
    _check_id(report.steps, steps.column("replica_id"), "replica_id")
    for name in _NON_NEGATIVE:
        report.steps(_ints(steps, name) < 0, name, "must be >= 0")
    report.steps(~_nulls(steps, "gamma") & ((gamma < 1) | (gamma > MAX_GAMMA)), "gamma", f"must be in [1, {MAX_GAMMA}]")
    batch = _ints(steps, "batch_size")
    report.steps(
        batch < n_requests, "batch_size", lambda i: f"smaller than the {n_requests[i]} request rows it carries"
    )
    ts = _floats(steps, "ts", 1.0)
    report.steps(~np.isfinite(ts) | (ts <= 0) | (ts > MAX_UNIX_S), "ts", "must be unix seconds in (0, 4102444800]")
    for name in _TIMINGS + ("predicted_step_ms", "table_step_ms", "step_cpu_ms"):
        ms = _floats(steps, name)
        report.steps(~np.isfinite(ms) | (ms < 0), name, "must be finite and >= 0")
    hit = pc.fill_null(steps.column("graph_hit"), True).to_numpy(zero_copy_only=False)
    reason_null = _nulls(steps, "miss_reason")
    known = pc.is_in(steps.column("miss_reason"), pa.array(MISS_REASONS)).to_numpy(zero_copy_only=False)
    report.steps(hit & ~reason_null, "miss_reason", "must be null when graph_hit is true")
    report.steps(~hit & ~known, "miss_reason", f"a tier miss needs a reason in {list(MISS_REASONS)}")
    report.steps(
        hit & (_ints(steps, "tier_rows") < _ints(steps, "verify_rows")),
        "tier_rows",
        "a graph hit needs tier_rows >= verify_rows",
    )
    tier = _ints(steps, "tier")
    report.steps(
        np.where(hit, (tier < 0) & (tier != TIER_UNREPORTED), tier < NO_TIER),
        "tier",
        f"must be >= 0 on a graph hit ({TIER_UNREPORTED}: the engine does not report it), "
        f">= {NO_TIER} (no tier) on a miss",
    )


def _check_windows(report: _Report, g: np.ndarray, mode: np.ndarray) -> None:
    reqs = report.flat.requests
    window, accepted = _ints(reqs, "window"), _ints(reqs, "accepted")
    suggested, suggested_null = _ints(reqs, "window_suggested"), _nulls(reqs, "window_suggested")
    report.requests((window < 0) | (window > g), "window", lambda j: f"outside [0, gamma={g[j]}]")
    report.requests((accepted < 0) | (accepted > window), "accepted", lambda j: f"outside [0, window={window[j]}]")
    report.requests(
        ~suggested_null & ((suggested < 0) | (suggested > g)),
        "window_suggested",
        lambda j: f"outside [0, gamma={g[j]}]",
    )
    full_block = np.isin(mode, ["static", "shadow"])
    report.requests(
        full_block & (window != g),
        "window",
        lambda j: f"{mode[j]} verifies the full block: window must equal gamma={g[j]}",
    )
    report.requests(
        (mode == "shadow") & suggested_null, "window_suggested", "shadow must log the scheduler's suggestion"
    )


def _check_full_accept(report: _Report, g: np.ndarray, mode: np.ndarray) -> None:
    reqs = report.flat.requests
    window, accepted = _ints(reqs, "window"), _ints(reqs, "accepted")
    full, full_null = _ints(reqs, "full_accept"), _nulls(reqs, "full_accept")
    censored = (mode == "compact") & (accepted == window) & (window < g)
    report.requests(
        censored & ~full_null, "full_accept", "must be null when censored (compact, accepted == window < gamma)"
    )
    report.requests(~censored & full_null, "full_accept", "missing: a* is observed for this row")
    known = ~censored & ~full_null
    cap = mode == "cap_accept"
    report.requests(known & ((full < 0) | (full > g)), "full_accept", lambda j: f"outside [0, gamma={g[j]}]")
    report.requests(
        known & ~cap & (full != accepted), "full_accept", lambda j: f"must equal accepted={accepted[j]} in {mode[j]}"
    )
    report.requests(
        known & cap & (np.minimum(full, window) != accepted),
        "full_accept",
        lambda j: f"cap_accept needs accepted == min(full_accept, window={window[j]}), accepted={accepted[j]}",
    )
    expected_trim = np.where(known, full - accepted, 0)
    report.requests(
        _ints(reqs, "cap_trim") != expected_trim,
        "cap_trim",
        lambda j: f"must be min(full_accept, gamma) - accepted = {expected_trim[j]}",
    )


def _check_lists(report: _Report, g: np.ndarray, accepted: np.ndarray) -> None:
    reqs = report.flat.requests
    for name in ("confidence", "survival"):
        column = reqs.column(name).combine_chunks()
        lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy().astype(np.int64)

        def wrong_length(j: int, lengths: np.ndarray = lengths) -> str:
            return f"length {lengths[j]} != gamma={g[j]}"

        def length_only(j: int, lengths: np.ndarray = lengths) -> str:
            return f"<{lengths[j]} values>"

        report.requests(~_nulls(reqs, name) & (lengths != g), name, wrong_length, value=length_only)
        owner = pc.list_parent_indices(column).to_numpy()
        values = pc.fill_null(pc.list_flatten(column), math.nan).to_numpy()
        bad = ~np.isfinite(values) | (values < 0) | (values > 1)
        rising = np.zeros_like(bad)
        if name == "survival":
            rising[1:] = (values[1:] > values[:-1]) & (owner[1:] == owner[:-1])
        starts = np.concatenate([[0], np.cumsum(lengths)])[owner]
        for e in np.flatnonzero(bad | rising):
            j = owner[e]
            path = f"requests[{report.flat.slot[j]}].{name}[{e - starts[e]}]"
            text = "must be a finite probability in [0, 1]" if bad[e] else "survival must be non-increasing with depth"
            report.problems[report.flat.parent[j]].append(Problem(path, float(values[e]), text))
    tokens = pc.fill_null(pc.list_value_length(reqs.column("committed_tokens")), 0).to_numpy()
    report.requests(
        ~_nulls(reqs, "committed_tokens") & (tokens != accepted + 1),
        "committed_tokens",
        lambda j: f"holds {tokens[j]} ids, accepted + 1 = {accepted[j] + 1}",
        value=lambda j: f"<{tokens[j]} ids>",
    )
    drafts = pc.fill_null(pc.list_value_length(reqs.column("draft_tokens")), 0).to_numpy()
    report.requests(
        ~_nulls(reqs, "draft_tokens") & (drafts != g),
        "draft_tokens",
        lambda j: f"holds {drafts[j]} ids, gamma = {g[j]}",
        value=lambda j: f"<{drafts[j]} ids>",
    )
    for name in ("committed_tokens", "draft_tokens"):
        column = reqs.column(name)
        ids = pc.fill_null(pc.list_flatten(column), -2).to_numpy(zero_copy_only=False)
        bad_ids = np.zeros(reqs.num_rows, bool)
        bad_ids[pc.list_parent_indices(column).to_numpy()[ids < -1]] = True
        report.requests(bad_ids, name, "token ids must be >= 0 (or -1 when not reported)")


def _check_recovery(report: _Report, g: np.ndarray, mode: np.ndarray) -> None:
    """The optional fields censored-label recovery reads (``collectors.recovery``)."""
    reqs = report.flat.requests
    position = _ints(reqs, "position")
    report.requests(
        ~_nulls(reqs, "position") & ((position < 0) | (position > MAX_POSITION)), "position", "must be in [0, 2^40]"
    )
    prob, prob_null = _floats(reqs, "next_accept_prob"), _nulls(reqs, "next_accept_prob")
    report.requests(
        ~prob_null & (~np.isfinite(prob) | (prob < 0) | (prob > 1)), "next_accept_prob", "must be in [0, 1]"
    )
    censored = (mode == "compact") & (_ints(reqs, "accepted") == _ints(reqs, "window")) & (_ints(reqs, "window") < g)
    report.requests(
        ~prob_null & ~censored,
        "next_accept_prob",
        "only a censored row (compact, accepted == window < gamma) has a next draft left unverified",
    )


def _check_requests(report: _Report, gamma: np.ndarray) -> None:
    reqs = report.flat.requests
    for name in (f.name for f in REQUEST_TYPE):
        if name not in NULLABLE_REQUEST_FIELDS:
            report.requests(_nulls(reqs, name), name, "missing (required field)")
    g = gamma[report.flat.parent]
    mode = pc.fill_null(reqs.column("mode"), "").to_numpy(zero_copy_only=False).astype(str)
    report.requests(~_nulls(reqs, "mode") & ~np.isin(mode, MODES), "mode", f"unknown mode; known: {list(MODES)}")
    _check_id(report.requests, reqs.column("request_id"), "request_id")
    temperature = _floats(reqs, "temperature")
    report.requests(~np.isfinite(temperature) | (temperature < 0), "temperature", "must be finite and >= 0")
    _check_windows(report, g, mode)
    _check_full_accept(report, g, mode)
    _check_lists(report, g, _ints(reqs, "accepted"))
    _check_recovery(report, g, mode)
    keys = pa.table({"p": report.flat.parent, "r": reqs.column("request_id")})
    counts = keys.group_by(["p", "r"]).aggregate([("p", "count")])
    repeated = counts.filter(pc.greater(counts.column("p_count"), 1))
    for p, rid in zip(repeated.column("p").to_pylist(), repeated.column("r").to_pylist()):
        report.problems[p].append(Problem("requests.request_id", rid, "appears more than once in the step"))


def _check_duplicates(report: _Report, stored: np.ndarray) -> None:
    """A step key already stored, or seen earlier in this batch on an otherwise valid step."""
    steps = report.flat.steps
    replica, step_id = steps.column("replica_id").to_pylist(), steps.column("step_id").to_pylist()
    seen: set[tuple[str, int]] = set()
    for i, key in enumerate(zip(replica, step_id)):
        if stored[i]:
            report.problems[i].append(
                Problem("step_id", key[1], f"duplicate (replica_id={key[0]!r}, step_id) already stored")
            )
        elif not report.problems[i]:
            if key in seen:
                report.problems[i].append(
                    Problem("step_id", key[1], f"duplicate (replica_id={key[0]!r}, step_id) earlier in this batch")
                )
            seen.add(key)


def validate_steps(flat: Flat, stored: np.ndarray | None = None) -> list[list[Problem]]:
    """Every problem of every step in ``flat``; ``stored[i]`` marks steps whose key is already stored."""
    report = _Report(flat)
    gamma = _ints(flat.steps, "gamma")
    n_requests = np.bincount(flat.parent, minlength=flat.steps.num_rows)
    _check_steps(report, gamma, n_requests)
    _check_requests(report, np.clip(gamma, 0, MAX_GAMMA))
    _check_duplicates(report, np.zeros(flat.steps.num_rows, bool) if stored is None else stored)
    return report.problems


def validate(record: StepRecord) -> list[Problem]:
    """Every problem of one record (empty when valid), by the same rules as the collector."""
    parsed = from_dicts([record.to_dict()])
    if parsed.rejected:
        return parsed.rejected[0].problems
    return validate_steps(flatten(parsed.wire))[0]
