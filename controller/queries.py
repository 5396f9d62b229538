"""Read queries against the store for one evaluation window and slice.

Every query takes the same ``Window`` (unix-second bounds on ``ts``) and
``Slice`` (task, temperature, load bucket, replica). Label and request rows
carry ``ts`` and ``replica_id``; task and temperature live on request rows and
the batch size on step rows, so those slices semi-join on (replica_id, step_id[,
request_id]). Step-level figures cannot be split by task or temperature (a step
mixes requests), so ``Slice.per_request`` tells callers to leave them out.

Enum codes: the store's ``verify_mode`` and ``label_status`` enums are declared
in the order of ``collectors.schema.MODES`` and ``STATUSES``, so ``enum_code``
gives the collectors' integer codes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from sparkgate.collectors import label_sums
from sparkgate.collectors.schema import TIER_UNREPORTED
from sparkgate.collectors.store import Store
from sparkgate.policies.binning import N_BINS
from sparkgate.policies.vocabulary import FULL_BLOCK_MODES

from .calibration import REQUEST_GROUPS

# Batch sizes are bucketed by powers of two: bucket b holds sizes [2^b, 2^(b+1)); a step that carried no
# request (batch 0, e.g. an SGLang record without reqs) sits in bucket 0, not in log2(0) = -inf.
LOAD_BUCKET_SQL = "floor(log2(greatest(batch_size, 1)))::INTEGER"


def load_bucket_label(bucket: int) -> str:
    return f"{2**bucket}-{2 ** (bucket + 1) - 1}"


@dataclass(frozen=True)
class Window:
    """Rows with ``since <= ts < until``; a None bound is open."""

    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"window.{name}={value!r}: expected finite unix seconds")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"window.since={self.since!r}: must be before until={self.until!r}")


@dataclass(frozen=True)
class Slice:
    """A subset of traffic; None fields do not filter. ``load_bucket`` is b for batch sizes [2^b, 2^(b+1))."""

    task: str | None = None
    temperature: float | None = None
    load_bucket: int | None = None
    replica_id: str | None = None

    @property
    def per_request(self) -> bool:
        """Whether the slice selects requests within steps (so step-level figures do not apply)."""
        return self.task is not None or self.temperature is not None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


SLICE_COLUMNS = {"task": "task", "temperature": "temperature", "load": "load_bucket", "replica": "replica_id"}


def time_bounds(alias: str, since: float | None, until: float | None, ts: str = "ts") -> tuple[list[str], list]:
    """SQL conditions (and params) keeping rows of ``alias`` with ``since <= ts < until``; a None bound is open."""
    clauses: list[str] = []
    params: list[object] = []
    if since is not None:
        clauses.append(f"{alias}.{ts} >= ?")
        params.append(since)
    if until is not None:
        clauses.append(f"{alias}.{ts} < ?")
        params.append(until)
    return clauses, params


def _where(table: str, window: Window, slice_: Slice, alias: str, ts: str = "ts") -> tuple[str, list]:
    """WHERE clause (with params) for ``table`` under ``alias``, time bounds on column ``ts``."""
    bounds, params = time_bounds(alias, window.since, window.until, ts)
    clauses: list[str] = ["TRUE", *bounds]
    if slice_.replica_id is not None:
        clauses.append(f"{alias}.replica_id = ?")
        params.append(slice_.replica_id)
    if slice_.load_bucket is not None and table == "steps":
        clauses.append(f"{LOAD_BUCKET_SQL} = ?")
        params.append(slice_.load_bucket)
    elif slice_.load_bucket is not None:
        clauses.append(
            f"({alias}.replica_id, {alias}.step_id) IN (SELECT (replica_id, step_id) FROM steps "
            f"WHERE {LOAD_BUCKET_SQL} = ?)"
        )
        params.append(slice_.load_bucket)
    request_filters = [(c, v) for c, v in (("task", slice_.task), ("temperature", slice_.temperature)) if v is not None]
    if request_filters and table == "requests":
        for column, value in request_filters:
            clauses.append(f"{alias}.{column} = ?")
            params.append(value)
    elif request_filters and table == "depth_labels":
        inner = " AND ".join(f"{c} = ?" for c, _ in request_filters)
        clauses.append(
            f"({alias}.replica_id, {alias}.step_id, {alias}.request_id) IN "
            f"(SELECT (replica_id, step_id, request_id) FROM requests WHERE {inner})"
        )
        params.extend(v for _, v in request_filters)
    return " AND ".join(clauses), params


@dataclass(frozen=True)
class LabelColumns:
    """Depth labels as numpy columns: mode and status codes, depth, S_k, c_k, request group, ``y`` (the
    label, 0 where unknown), whether the label is windowed (``label_sums.window_sql``) and its replica's
    index in the list ``label_columns`` was given (−1: not asked, or not listed)."""

    mode: np.ndarray
    depth: np.ndarray
    status: np.ndarray
    survival: np.ndarray
    confidence: np.ndarray
    group: np.ndarray
    y: np.ndarray
    in_window: np.ndarray
    replica: np.ndarray

    @property
    def depths(self) -> int:
        return int(self.depth.max()) if len(self.depth) else 0

    def __len__(self) -> int:
        return len(self.depth)

    def rows(self, start: int, stop: int) -> LabelColumns:
        """Rows ``start:stop`` (views, no copy)."""
        return LabelColumns(*(getattr(self, f)[start:stop] for f in self.__dataclass_fields__))

    def select(self, mask: np.ndarray) -> LabelColumns:
        """The rows where ``mask`` holds (copies)."""
        return LabelColumns(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def label_columns(
    store: Store,
    window: Window,
    slice_: Slice,
    phase: str | None = None,
    contract: SameContract | None = None,
    windowed: bool = False,
    replicas: Sequence[str] = (),
) -> LabelColumns:
    """The window's depth labels; ``phase`` (and ``contract``) keep those of steps recorded in that phase
    (under that contract): e.g. the shadow reference calibration is compared with. ``in_window`` is read
    only with ``windowed`` (a join to the request rows), else False; ``replica`` only with ``replicas``
    (the rows of every replica, each with its index there), else −1."""
    where, params = _in_phase(*_where("depth_labels", window, slice_, "l"), "l", phase, contract)
    replica, replica_params = "-1", list[object]()
    if replicas:
        replica, replica_params = "list_position(?::VARCHAR[], l.replica_id) - 1", [list(replicas)]
    in_window, join, join_params = "false", "", list[object]()
    if windowed:
        # The request rows of the same steps, bounded as the labels are (a label's ts is its step's).
        bounds, join_params = time_bounds("r", window.since, window.until, "ts")
        in_window, join = label_sums.windowed_sql(
            label_sums.window_sql(f"requests r WHERE {' AND '.join(['TRUE', *bounds])}")
        )
    table = store.query(
        "SELECT enum_code(l.mode)::TINYINT AS mode, l.depth, enum_code(l.status)::TINYINT AS status,"
        f" l.survival, l.confidence, (hash(l.request_id) % {REQUEST_GROUPS})::SMALLINT AS grp,"
        f" coalesce(l.label, false)::TINYINT AS y, {in_window} AS in_window, ({replica})::SMALLINT AS replica"
        f" FROM depth_labels l{join} WHERE {where}",
        [*replica_params, *join_params, *params],
    )
    columns = ("mode", "depth", "status", "survival", "confidence", "grp", "y", "in_window", "replica")
    return LabelColumns(*(table.column(c).to_numpy(zero_copy_only=False) for c in columns))


def _in_phase(
    where: str, params: list, alias: str, phase: str | None, contract: SameContract | None
) -> tuple[str, list]:
    """``where`` restricted to the rows of steps recorded in ``phase`` (under ``contract``), when given."""
    if phase is None:
        return where, params
    clause, extra = _contract_sql(contract, "s")
    where += (
        f" AND ({alias}.replica_id, {alias}.step_id) IN "
        f"(SELECT (replica_id, step_id) FROM steps s WHERE s.phase = ?{clause})"
    )
    return where, [*params, phase, *extra]


def estimated_bins(
    store: Store,
    window: Window,
    slice_: Slice,
    depths: int,
    phase: str | None = None,
    contract: SameContract | None = None,
) -> np.ndarray:
    """``[depths + 1, N_BINS, 3]``: per depth and equal-width bin of S_k, the estimated compact labels'
    count, sum of S_k and sum of P(y = 1)."""
    where, params = _in_phase(*_where("depth_labels", window, slice_, "l"), "l", phase, contract)
    rows = store.query(
        f"SELECT l.depth, least(floor(l.survival * {N_BINS}), {N_BINS - 1})::INTEGER AS b, count(*) AS n, "
        "sum(l.survival) AS p, sum(l.probability) AS y FROM depth_labels l "
        f"WHERE {where} AND l.status = 'estimated' GROUP BY ALL",
        params,
    ).to_pylist()
    out = np.zeros((depths + 1, N_BINS, 3))
    for r in rows:
        if r["depth"] <= depths:
            out[r["depth"], r["b"]] = (r["n"], r["p"], r["y"])
    return out


def request_histograms(
    store: Store,
    window: Window,
    slice_: Slice,
    width: int,
    phase: str | None = None,
    contract: SameContract | None = None,
) -> dict[str, np.ndarray]:
    """The collectors' request histograms ``accept_hist[mode, window, accepted]``, ``full_hist[mode,
    accepted, full_accept]`` and ``suggest_hist[mode, window_suggested, full_accept]``, ``width`` wide."""
    where, params = _in_phase(*_where("requests", window, slice_, "r"), "r", phase, contract)
    specs = {
        "accept_hist": ('"window"', "accepted", "TRUE"),
        "full_hist": ("accepted", "full_accept", "full_accept IS NOT NULL"),
        "suggest_hist": ("window_suggested", "full_accept", "window_suggested IS NOT NULL AND full_accept IS NOT NULL"),
    }
    out = {}
    for name, (x, y, condition) in specs.items():
        rows = store.query(
            f"SELECT enum_code(r.mode)::INTEGER AS m, r.{x} AS x, r.{y} AS y, count(*) AS n "
            f"FROM requests r WHERE {where} AND {condition} GROUP BY ALL",
            params,
        )
        hist = np.zeros((4, width, width), np.int64)
        columns = [rows.column(c).to_numpy().astype(np.int64) for c in ("m", "x", "y", "n")]
        hist[columns[0], columns[1], columns[2]] = columns[3]
        out[name] = hist
    return out


def full_accept_totals(
    store: Store, window: Window, slice_: Slice, phases: tuple[str, ...], contract: SameContract | None = None
) -> dict[str, tuple[int, int]]:
    """Per phase of ``phases`` with any: (sum of a*, rows) over the full-block request rows recorded in it,
    in one pass (the acceptance reference); ``contract`` restricts to one contract's steps."""
    where, params = _where("requests", window, slice_, "r")
    modes = ", ".join(f"'{m}'" for m in FULL_BLOCK_MODES)
    marks = ", ".join("?" * len(phases))
    clause, extra = _contract_sql(contract, "s")
    rows = store.query(
        f"SELECT s.phase, sum(r.full_accept)::BIGINT AS total, count(*) AS n FROM requests r "
        f"JOIN steps s ON r.replica_id = s.replica_id AND r.step_id = s.step_id "
        f"WHERE {where} AND r.full_accept IS NOT NULL AND r.mode::VARCHAR IN ({modes}) AND s.phase IN ({marks})"
        f"{clause} GROUP BY s.phase",
        [*params, *phases, *extra],
    ).to_pylist()
    return {r["phase"]: (int(r["total"]), int(r["n"])) for r in rows}


def steps_by_model(store: Store, window: Window, slice_: Slice, model: str) -> list[dict[str, Any]]:
    """Steps and replicas in the window, apart for records whose ``model_version`` is ``model`` (``matches``)."""
    where, params = _where("steps", window, slice_, "s")
    return store.query(
        "SELECT s.model_version = ? AS matches, count(*) AS steps, count(DISTINCT s.replica_id) AS replicas "
        f"FROM steps s WHERE {where} GROUP BY 1 ORDER BY 1",
        [model, *params],
    ).to_pylist()


@dataclass(frozen=True)
class SameContract:
    """Only steps measured under ``contract`` (None: steps whose producer reports none)."""

    contract: str | None

    def sql(self, alias: str) -> tuple[str, list]:
        return f" AND {alias}.contract IS NOT DISTINCT FROM ?", [self.contract]


def _contract_sql(contract: SameContract | None, alias: str) -> tuple[str, list]:
    return contract.sql(alias) if contract is not None else ("", [])


# What a step record says of its contract besides the fingerprint: what a change can be told by.
CONTRACT_FIELDS = ("model_version", "drafter_version", "gamma", "sts_version")


def contracts(store: Store, window: Window, slice_: Slice) -> list[dict[str, Any]]:
    """Per contract in the window, most steps first: its steps, replicas and the newest step's
    ``CONTRACT_FIELDS``."""
    where, params = _where("steps", window, slice_, "s")
    fields = ", ".join(f"arg_max(s.{f}, s.ts) AS {f}" for f in CONTRACT_FIELDS)
    return store.query(
        f"SELECT s.contract, count(*) AS steps, count(DISTINCT s.replica_id) AS replicas, {fields} "
        f"FROM steps s WHERE {where} GROUP BY s.contract ORDER BY steps DESC, s.contract",
        params,
    ).to_pylist()


def contract_fields(store: Store, contract: SameContract, phase: str | None = None) -> dict[str, Any] | None:
    """The newest step's ``CONTRACT_FIELDS`` of ``contract`` over all history, of the steps recorded in
    ``phase`` when given (None: there are none)."""
    clause, params = contract.sql("s")
    if phase is not None:
        clause, params = clause + " AND s.phase = ?", params + [phase]
    fields = ", ".join(f"arg_max(s.{f}, s.ts) AS {f}" for f in CONTRACT_FIELDS)
    rows = store.query(f"SELECT count(*) AS steps, {fields} FROM steps s WHERE TRUE{clause}", params).to_pylist()
    return rows[0] if rows and rows[0]["steps"] else None


# Steps served under the policy being judged: all but a switchback control epoch's (static verification, or
# in adaptive compact on the static table), whose layouts the treatment did not shape.
_TREATED = "s.arm IS DISTINCT FROM 'control'"


def step_buckets(
    store: Store, window: Window, slice_: Slice, phase: str | None = None, contract: SameContract | None = None
) -> pa.Table:
    """Per load bucket: steps, busy seconds, step-time quantiles, tier misses and padding (of every step, and
    of the treatment's: not a control epoch's), newest ts, committed tokens and verified rows. ``phase``
    restricts to steps recorded in that phase, ``contract`` to one contract."""
    where, params = _where("steps", window, slice_, "s")
    if phase is not None:
        where += " AND s.phase = ?"
        params = params + [phase]
    clause, extra = _contract_sql(contract, "s")
    where, params = where + clause, params + extra
    return store.query(
        f"""
        WITH s AS (SELECT *, {LOAD_BUCKET_SQL} AS bucket FROM steps s WHERE {where}),
        committed AS (
            SELECT s.bucket, sum(r.accepted + 1)::BIGINT AS tokens FROM requests r
            JOIN s ON r.replica_id = s.replica_id AND r.step_id = s.step_id GROUP BY s.bucket)
        SELECT s.bucket, count(*) AS steps, sum(step_ms) / 1000 AS busy_s,
               quantile_cont(step_ms, 0.5) AS p50_ms, quantile_cont(step_ms, 0.95) AS p95_ms,
               quantile_cont(step_ms, 0.99) AS p99_ms,
               count(*) FILTER (WHERE NOT graph_hit) AS misses,
               count(*) FILTER (WHERE tier <> {TIER_UNREPORTED}) AS tier_steps,
               count(*) FILTER (WHERE NOT graph_hit AND {_TREATED}) AS treated_misses,
               count(*) FILTER (WHERE tier <> {TIER_UNREPORTED} AND {_TREATED}) AS treated_tier_steps,
               coalesce(sum(tier_rows - verify_rows) FILTER (WHERE graph_hit), 0)::BIGINT AS padding_rows,
               coalesce(sum(tier_rows) FILTER (WHERE graph_hit), 0)::BIGINT AS hit_tier_rows,
               max(ts) AS newest, any_value(c.tokens) AS tokens, sum(verify_rows)::BIGINT AS verify_rows
        FROM s LEFT JOIN committed c USING (bucket) GROUP BY s.bucket ORDER BY s.bucket""",
        params,
    )


def miss_reasons(store: Store, window: Window, slice_: Slice) -> dict[str, int]:
    where, params = _where("steps", window, slice_, "s")
    rows = store.query(
        f"SELECT coalesce(miss_reason, 'unknown') AS reason, count(*) AS n FROM steps s "
        f"WHERE {where} AND NOT graph_hit GROUP BY 1 ORDER BY 1",
        params,
    )
    return dict(zip(rows.column("reason").to_pylist(), rows.column("n").to_pylist()))


def consistency_counts(store: Store, window: Window, slice_: Slice) -> dict[str, dict[str, int]]:
    """Per check kind: checks received in the window and how many found a mismatch (replica slice only:
    checks are reported per request after it finished)."""
    where, params = _where("consistency_checks", window, Slice(replica_id=slice_.replica_id), "c", "received_at")
    rows = store.query(
        f"SELECT kind, count(*) AS checks, count(mismatch_at) AS mismatches "
        f"FROM consistency_checks c WHERE {where} GROUP BY kind",
        params,
    )
    return {r["kind"]: {"checks": r["checks"], "mismatches": r["mismatches"]} for r in rows.to_pylist()}


def slice_values(store: Store, key: str, window: Window) -> list:
    """Distinct values of a slice key (``task``, ``temperature``, ``load``, ``replica``) in the window."""
    if key not in SLICE_COLUMNS:
        raise ValueError(f"by={key!r}: expected one of {', '.join(SLICE_COLUMNS)}")
    table, column = {
        "task": ("requests", "task"),
        "temperature": ("requests", "temperature"),
        "load": ("steps", LOAD_BUCKET_SQL),
        "replica": ("steps", "replica_id"),
    }[key]
    where, params = _where(table, window, Slice(), "t")
    rows = store.query(f"SELECT DISTINCT {column} AS v FROM {table} t WHERE {where} ORDER BY 1", params)
    return rows.column("v").to_pylist()
