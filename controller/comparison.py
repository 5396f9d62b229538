"""Comparison gates (docs/design.md §6): treatment against a control measured at the same time.

Replicas alternate treatment and control switchback epochs (``policies.switchback``).
The unit of evidence is an epoch pair: epochs ``2k`` and ``2k + 1`` of one replica,
one of each arm, a few seconds apart, so load swings slower than a pair and
noisy neighbours hit both. Per pair and metric, ``d = ln(treatment / control)``;
the estimate is ``exp`` of the Hodges-Lehmann estimate of the d's center and the
interval the signed-rank interval for it (``policies.intervals``). Its one
assumption beyond independent pairs, that d is symmetric about its center, is
what the design makes true: the arm order inside a pair is a coin flip, so a
drift between a pair's two epochs enters d with a random sign, and two epochs'
own noise differ symmetrically; under a constant effect, d minus the effect is
symmetric at any noise distribution. It is about 1.5 times as efficient as the
sign test, which the interval used before. Too few pairs for an interval at the
level leaves it open, and the gate inconclusive.

A comparison's drift (``<metric>_drift``) is how its ratio moved between the window
before the newest one and the newest: ``exp`` of the Hodges-Lehmann shift between
the two windows' paired log ratios (every replica's pooled) with the rank-sum
interval for it (``policies.intervals.rank_sum_interval``), ``samples`` the lesser
window's pairs. Each window's pairs were measured against their own concurrent
control, so the drift is a difference of two controlled ratios: it sees a
treatment that got slower late in a stage without end even while it stays ahead
of its control by the gates' margin (a fitted cost table losing its lead over
the static one), which the ratio against the control cannot call a failure. A stage
shorter than one window has no window before it, and no drift.

A fleet of several replicas is judged twice, the error rate split between the
two: pooled (every replica's pairs together, at level ``1 - (1 - level) / 2``),
which is what catches a fleet-wide regression soonest, and per replica (each at
``1 - (1 - level) / 2R``, Bonferroni over the R replicas), because a regression
on one replica of many would barely move a pooled center. The fleet's bad-side
bound is the worst of those R + 1 intervals' (for a metric that is bad when
high, the greatest low), so a gate fails as soon as one interval is wholly on
the bad side; a healthy fleet fails a gate no more often than one comparison at
``level`` would (the R + 1 one-sided errors sum to one side of it). The good-side
bound is the pooled interval's, held back to the bad bound: a pass claims the
fleet's effect clears the threshold, which is what the pooled interval
measures (at ``1 - (1 - level) / 2``, so a fleet whose effect is on the bad side
passes less often than one comparison at ``level`` would). Requiring every
replica's Bonferroni interval to clear as well would ask each replica to show
the margin alone: on the demo fleet the tokens/s gate would need about 1,300
pairs (15 minutes of adaptive) where the pooled interval needs 300. A replica
with too few pairs for its own interval does not keep the pooled interval from
failing or passing the gate. ``samples`` is the fleet's pairs. The estimate is
the pooled one, the fleet's effect (the worst replica's center is biased away
from one even when nothing differs); the bounds are a decision rule over R + 1
intervals, so when one replica alone is off they need not hold the pooled
estimate, and the method names the interval the bad-side bound is from.

Fleets split by replica (the SGLang actuator gives each server one setting for the
stage) are compared as groups instead (``Groups``): a pair is a slice of
``epoch_s`` of the stage, the treatment servers' steps against the control
servers' in the same slice and load bucket. Noisy neighbours and load swings hit
both groups at once, as in a switchback pair; what a group design cannot remove is
a standing difference between the servers themselves, which is why the demo's own
replicas use switchback. One unit, so one interval at ``level``.

What an epoch contributes, after its first ``burn_in_s`` (the other arm's batch
is still draining) and only from the revision in force (a replica picks a new
policy up within its poll interval):
- ``p99_step_ratio``, ``tokens_per_s_ratio``: step records (p99 step time;
  committed tokens per busy second), compared load bucket by load bucket (batch
  sizes in powers of two) within the pair: under open-loop traffic an epoch's
  batch sizes are as random as its arrivals, and tokens per busy second grow
  several-fold with the batch, so unmatched epochs would compare load, not arms;
  ``comparison.step_time: cpu`` reads the replica's CPU time per step instead of
  wall time, for replicas that share a CPU (on a GPU wall time is the cost);
- ``tokens_per_s_ratio`` is adjusted for what each epoch's drafts promised (regression adjustment,
  as CUPED does with a pre-period metric): committed tokens per step vary with how far the drafts run
  far more than with CPU time (on the demo fleet a pair's log ratio has sd 0.27, of which the drafts'
  acceptance is most), and the drafted block's predicted accepted length, ``1 + Σ S_k`` over all γ
  positions, is fixed before the arm picks a window, under the one contract (and so the one survival
  calibration) the window is judged on. With ``z`` a pair's log ratio of that length's mean per request
  row (per row, not per step: how many requests a step holds is load, which an arm can move), matched
  bucket by bucket as d is, the pair's adjusted ``d − θ z`` keeps d's center (the arm order is a coin
  flip, so z is symmetric about zero) and sheds the part of its noise the drafts explain; ``θ`` is the
  regression of d on z through zero over the window's other pairs (leave one out, so no pair's own
  noise sets its own θ). A window where z's own signed-rank interval leaves zero (the arms drafted
  differently, so the adjustment would take a real effect away) or where a request carries no survival
  is not adjusted, and the method says which was done;
- ``p99_tpot_ratio``, ``p99_ttft_ratio``, ``goodput_ratio``: request records served
  wholly inside the epoch and not cancelled (goodput: those within both SLOs;
  both epochs of a pair last as long, so the ratio of counts per replica of the arm
  is the ratio of rates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from sparkgate.collectors.store import Store
from sparkgate.policies.intervals import rank_sum_interval, signed_rank_interval
from sparkgate.policies.rollout import Comparison
from sparkgate.policies.vocabulary import DRIFT_METRICS, Arm, FinishReason, Mode

from .measurement import Measurement
from .queries import LOAD_BUCKET_SQL

# Metrics whose ratio is bad when high (latencies); the others are bad when low (rates).
BAD_WHEN_HIGH = frozenset({"p99_step_ratio", "p99_tpot_ratio", "p99_ttft_ratio"})
# Metrics whose per-pair values are counts (good requests per replica), where an arm's 0 is a value.
COUNTS = frozenset({"goodput_ratio"})
# The one unit of a group design.
GROUPS = "groups"
# per_pair's cells of the covariate that tokens_per_s_ratio is adjusted for (not a metric of its own).
PREDICTED = "predicted_tokens"


@dataclass(frozen=True)
class Epochs:
    """Switchback: the epochs of ``revision``, whose epoch 0 began at ``origin``, since ``since``. A pair is
    epochs ``2k`` and ``2k + 1`` of one replica; replicas are compared apart."""

    revision: int
    origin: float
    since: float
    until: float | None = None  # records from here on are left out (None: none are)


@dataclass(frozen=True)
class Groups:
    """Replica groups at the same time, for fleets split by replica (SGLang servers take one verify setting
    each): a replica whose id starts with a prefix in ``arms`` serves that arm for the whole stage, which
    began at ``origin``. After ``burn_in_s`` (the push reaching every server, and records the poller read
    before it), the stage is cut into slices of ``epoch_s``; a pair is one slice, the treatment group's
    steps against the control group's, load bucket by load bucket, from the slice that begins at
    ``since`` (None: the first). The groups are one unit (``GROUPS``)."""

    origin: float
    arms: tuple[tuple[str, Arm], ...]
    until: float | None = None
    since: float | None = None


Design = Epochs | Groups


def window_start(first: float, period: float, now: float, window_s: float | None) -> float:
    """Where a comparison window of ``window_s`` ending at ``now`` begins: the start of the oldest whole
    pair in it, pairs being ``period`` long from ``first`` (``first`` itself for a window longer than the
    stage, or None). Aligned to a pair, so no pair is cut in two and compared by half its epochs."""
    if window_s is None or now - window_s <= first:
        return first
    return first + period * math.ceil((now - window_s - first) / period)


def measure(d: np.ndarray, level: float) -> Measurement:
    """One unit's (or the pooled fleet's) estimate and interval."""
    center, low, high = signed_rank_interval(d, level)
    if center is None:
        return Measurement(None, 0)
    method = f"signed-rank interval of the paired log ratio's center, {len(d)} pairs, {level:.2%}"
    return Measurement(
        math.exp(center),
        len(d),
        None if low is None else math.exp(low),
        None if high is None else math.exp(high),
        method,
    )


def _split(design: Design, spec: Comparison, alias: str, ts: str) -> tuple[str, str, list[object]]:
    """SQL selecting ``unit, pair, cmp_arm`` of a record under ``design``, the filter keeping the window's
    compared records, and their parameters (select's first)."""
    if isinstance(design, Epochs):
        where = (
            f"{alias}.policy_revision = ? AND {alias}.epoch IS NOT NULL AND {alias}.{ts} >= ? "
            f"AND {alias}.{ts} - (? + {alias}.epoch * ?) >= ?"
        )
        select = f"{alias}.replica_id AS unit, {alias}.epoch // 2 AS pair, {alias}.arm AS cmp_arm"
        params: list[object] = [design.revision, design.since, design.origin, spec.epoch_s, spec.burn_in_s]
        return select, where + _before(alias, ts, design.until), params + _bound(design.until)
    start = design.origin + spec.burn_in_s
    cases = " ".join(f"WHEN starts_with({alias}.replica_id, ?) THEN ?" for _ in design.arms)
    arm = f"CASE {cases} END" if design.arms else "NULL"
    select = f"'{GROUPS}' AS unit, floor(({alias}.{ts} - ?) / ?)::BIGINT AS pair, {arm} AS cmp_arm"
    params = [start, spec.epoch_s, *(x for prefix, arm_ in design.arms for x in (prefix, str(arm_)))]
    since = start if design.since is None else max(start, design.since)
    return select, f"{alias}.{ts} >= ?" + _before(alias, ts, design.until), [*params, since, *_bound(design.until)]


def _before(alias: str, ts: str, until: float | None) -> str:
    return "" if until is None else f" AND {alias}.{ts} < ?"


def _bound(until: float | None) -> list[float]:
    return [] if until is None else [until]


def per_pair(store: Store, design: Design, spec: Comparison) -> dict[str, dict]:
    """Per comparison metric: ``(value, weight)`` per (unit, pair, arm, load bucket) of the window. Step
    metrics are per load bucket, weighted by its steps; request metrics have one bucket (None), weight 1."""
    cost = "step_cpu_ms" if spec.step_time == "cpu" else "step_ms"
    select, where, params = _split(design, spec, "s", "ts")
    # Step metrics at matched load: within each arm of a pair, per batch-size bucket (a power of two); a
    # pair's value is its buckets' figures weighted by the steps both arms served in each, so it compares
    # the two arms at the batch sizes both served, not a busy epoch with an idle one.
    # A step with no measured time (0 or null: an engine that left it out) prices nothing: its tokens stay out
    # with it, or an arm's untimed steps would read as free.
    steps = store.query(
        f"""WITH s AS (SELECT s.replica_id, s.step_id, s.{cost} AS cost, {LOAD_BUCKET_SQL} AS bucket, {select}
                       FROM steps s WHERE {where} AND s.{cost} > 0),
        c AS (SELECT r.replica_id, r.step_id, sum(r.accepted + 1) AS tokens,
                     sum(coalesce(list_sum(r.survival), 0) + 1) AS predicted, count(*) AS rows,
                     bool_and(r.survival IS NOT NULL) AS has_predicted
              FROM requests r JOIN s ON r.replica_id = s.replica_id AND r.step_id = s.step_id GROUP BY ALL)
        SELECT s.unit, s.pair, s.cmp_arm, s.bucket, count(*) AS steps,
               quantile_cont(s.cost, 0.99) AS p99_step, sum(c.tokens) / nullif(sum(s.cost) / 1000, 0) AS tokens_per_s,
               CASE WHEN bool_and(c.has_predicted) THEN sum(c.predicted) / sum(c.rows) END AS predicted
        FROM s JOIN c ON c.replica_id = s.replica_id AND c.step_id = s.step_id
        WHERE s.cmp_arm IS NOT NULL GROUP BY ALL""",
        params,
    ).to_pylist()
    select, where, params = _split(design, spec, "r", "arrival_ts")
    # Goodput per replica of the arm: a group design's groups need not be the same size.
    requests = store.query(
        f"""WITH r AS (SELECT r.*, {select} FROM request_records r WHERE {where} AND r.finish_reason <> ?)
        SELECT unit, pair, cmp_arm, quantile_cont(tpot_ms, 0.99) AS p99_tpot, quantile_cont(ttft_ms, 0.99) AS p99_ttft,
               count(*) FILTER (WHERE ttft_ms <= ? AND coalesce(tpot_ms, 0) <= ?) / count(DISTINCT replica_id) AS good
        FROM r WHERE cmp_arm IS NOT NULL GROUP BY ALL""",
        [*params, str(FinishReason.CANCELLED), spec.ttft_slo_ms, spec.tpot_slo_ms],
    ).to_pylist()
    columns = {"p99_tpot_ratio": "p99_tpot", "p99_ttft_ratio": "p99_ttft", "goodput_ratio": "good"}
    out: dict[str, dict] = {
        metric: {(r["unit"], r["pair"], r["cmp_arm"], None): (float(r[c]), 1) for r in requests if r[c] is not None}
        for metric, c in columns.items()
    }
    keyed = [((r["unit"], r["pair"], r["cmp_arm"], r["bucket"]), r) for r in steps]
    for metric, c in (("p99_step_ratio", "p99_step"), ("tokens_per_s_ratio", "tokens_per_s")):
        out[metric] = {key: (float(r[c]), r["steps"]) for key, r in keyed if r[c] is not None}
    timed = [(key, r) for key, r in keyed if r["tokens_per_s"] is not None]
    if all(r["predicted"] is not None for _, r in timed):
        out[PREDICTED] = {key: (float(r["predicted"]), r["steps"]) for key, r in timed}
    return out


# Added to both arms' counts of good requests before their ratio (Haldane's correction): an epoch where no
# request met the SLOs is the worst goodput there is, and must weigh in, not drop out as ln(0).
COUNT_OFFSET = 0.5


def paired(per_pair: dict, offset: float = 0.0) -> dict[str, np.ndarray]:
    """Per unit: ``ln((treatment + offset) / (control + offset))`` of every pair where both are positive,
    matched load bucket by load bucket: a pair's log ratio is the mean over the buckets both arms served,
    weighted by the lesser weight of the two. ``offset`` > 0 (counts, where 0 is a value): every pair."""
    out: dict[str, list[float]] = {}
    by_pair: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for (unit, pair, arm, bucket), (t, tw) in per_pair.items():
        if arm != Arm.TREATMENT:
            continue
        control = per_pair.get((unit, pair, str(Arm.CONTROL), bucket))
        if control is None:
            continue
        c, cw = control
        if t + offset > 0 and c + offset > 0:
            by_pair.setdefault((unit, pair), []).append((math.log((t + offset) / (c + offset)), min(tw, cw)))
    for (unit, _), parts in sorted(by_pair.items()):
        weights = sum(w for _, w in parts)
        out.setdefault(unit, []).append(sum(d * w for d, w in parts) / weights)
    return {unit: np.array(d) for unit, d in out.items()}


def adjusted(d: dict[str, np.ndarray], z: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """Per unit, ``d - θ_i z`` pair by pair (the module docstring): ``θ_i`` the regression through zero of d
    on z over every unit's pairs but pair i. ``z`` holds the covariate's paired log ratios, pair for pair
    as ``d``. Returns the adjusted ratios and the θ of all the pairs (0 when z never varies)."""
    units = list(d)
    if set(z) != set(units):
        raise ValueError(f"ratios of units {sorted(units)} against the covariate's of {sorted(z)}")
    if not units:
        return {}, 0.0
    flat_d, flat_z = np.concatenate([d[u] for u in units]), np.concatenate([z[u] for u in units])
    if flat_d.shape != flat_z.shape:
        raise ValueError(f"{len(flat_d)} pairs of ratios against {len(flat_z)} of the covariate")
    dz, zz = float(flat_d @ flat_z), float(flat_z @ flat_z)
    others = zz - flat_z**2
    theta = np.divide(dz - flat_d * flat_z, others, out=np.zeros_like(flat_d), where=others > 1e-12)
    flat = flat_d - theta * flat_z
    split = np.cumsum([len(d[u]) for u in units])[:-1]
    return dict(zip(units, np.split(flat, split), strict=True)), (dz / zz if zz > 1e-12 else 0.0)


def fleet(by_unit: dict[str, np.ndarray], bad_when_high: bool, level: float) -> Measurement:
    """The fleet's estimate and bounds from each unit's paired log ratios (see the module docstring)."""
    if not by_unit:
        return Measurement(None, 0)
    if len(by_unit) == 1:
        unit, d = next(iter(by_unit.items()))
        m = measure(d, level)
        who = "treatment group against control group" if unit == GROUPS else f"one replica ({unit})"
        return Measurement(m.value, m.samples, m.low, m.high, f"{who}: {m.method}")
    alpha, units = 1 - level, len(by_unit)
    pooled = measure(np.concatenate(list(by_unit.values())), 1 - alpha / 2)
    parts = {unit: measure(d, 1 - alpha / (2 * units)) for unit, d in by_unit.items()}
    named = {"pooled": pooled, **{f"replica {unit}": m for unit, m in parts.items()}}
    pick = max if bad_when_high else min
    # The bad side fails on any interval that has one (an interval too short on pairs cannot fail). The good
    # side is the pooled interval's, the fleet's effect, which is the claim a pass makes; held back to the bad
    # bound, so that a replica whose own interval is wholly bad fails the gate even while the pool passes.
    bad_bounds = {name: m.low if bad_when_high else m.high for name, m in named.items()}
    closed = {name: b for name, b in bad_bounds.items() if b is not None}
    # Named in the method: with one replica alone off, the bad bound is its interval's and need not hold the
    # pooled estimate shown beside it.
    deciding = pick(closed, key=closed.__getitem__) if closed else None
    bad = closed[deciding] if deciding else None
    good = pooled.high if bad_when_high else pooled.low
    if good is not None and bad is not None:
        good = pick(good, bad)
    worst = pick(parts, key=lambda r: parts[r].value or 0.0)
    method = (
        f"pooled ({pooled.samples} pairs, at {1 - alpha / 2:.2%}) and per replica ({units}, each at "
        f"{1 - alpha / (2 * units):.2%}): signed-rank intervals of the paired log ratio's center over switchback "
        f"epoch pairs; the good-side bound the pooled interval's, the bad-side bound the worst of them (worst "
        f"replica {worst}" + (f"; the bad-side bound {deciding}'s)" if deciding else ")")
    )
    low, high = (bad, good) if bad_when_high else (good, bad)
    return Measurement(pooled.value, pooled.samples, low, high, method)


def drift(recent: dict[str, np.ndarray], before: dict[str, np.ndarray], level: float) -> Measurement:
    """How a ratio moved from the window ``before`` to the ``recent`` one (see the module docstring), from
    each window's paired log ratios per unit."""
    x = np.concatenate(list(recent.values())) if recent else np.empty(0)
    y = np.concatenate(list(before.values())) if before else np.empty(0)
    center, low, high = rank_sum_interval(x, y, level)
    if center is None:
        return Measurement(None, 0)
    method = (
        f"rank-sum interval of the shift in the paired log ratio, {len(x)} pairs of the newest window against "
        f"{len(y)} of the one before, {level:.2%}"
    )
    return Measurement(
        math.exp(center),
        min(len(x), len(y)),
        None if low is None else math.exp(low),
        None if high is None else math.exp(high),
        method,
    )


def comparisons(
    store: Store, design: Design, spec: Comparison, reference: Design | None = None
) -> dict[str, Measurement]:
    """Every comparison metric's estimate, bounds and pair count over the window; with the ``reference``
    window (the one before it), every metric's drift from it too."""
    recent, note = _paired(store, design, spec)
    out = {metric: fleet(d, metric in BAD_WHEN_HIGH, spec.level) for metric, d in recent.items()}
    tokens = out["tokens_per_s_ratio"]
    out["tokens_per_s_ratio"] = replace(tokens, method=f"{tokens.method}; {note}" if tokens.method else None)
    if reference is not None:
        before, _ = _paired(store, reference, spec)
        out.update({name: drift(recent[m], before[m], spec.level) for name, m in DRIFT_METRICS.items()})
    untreated = _untreated(store, design, spec)
    if untreated is not None:
        return {metric: Measurement(None, 0, error=untreated) for metric in out}
    return out


def _untreated(store: Store, design: Design, spec: Comparison) -> str | None:
    """Why a group design's treatment never ran, if it did not: its servers verified no row compact in the
    window. Servers take a verify setting and can ignore it (SGLang in static mode), and then the groups
    compare a fleet with itself; an error, which counts towards the error limit, not a pass."""
    if not isinstance(design, Groups):
        return None
    select, where, params = _split(design, spec, "s", "ts")
    (row,) = store.query(
        f"""WITH s AS (SELECT s.replica_id, s.step_id, {select} FROM steps s WHERE {where})
        SELECT count(*) AS rows, count(*) FILTER (WHERE r.mode = ?) AS compact
        FROM requests r JOIN s ON r.replica_id = s.replica_id AND r.step_id = s.step_id WHERE s.cmp_arm = ?""",
        [*params, str(Mode.COMPACT), str(Arm.TREATMENT)],
    ).to_pylist()
    if not row["rows"] or row["compact"]:
        return None
    return (
        f"the treatment group's servers verified none of their {row['rows']} rows compact: the verify setting "
        "took no effect (an SGLang server verifies compact only when launched with SGLANG_RAGGED_VERIFY_MODE="
        "compact)"
    )


def _paired(store: Store, design: Design, spec: Comparison) -> tuple[dict[str, dict[str, np.ndarray]], str]:
    """Per metric and unit, the window's paired log ratios (tokens per second adjusted where every request
    carries its survival), and what was done to tokens per second."""
    cells = per_pair(store, design, spec)
    predicted = cells.pop(PREDICTED, None)
    out = {metric: paired(values, COUNT_OFFSET if metric in COUNTS else 0.0) for metric, values in cells.items()}
    if predicted is None:
        return out, "not adjusted for the drafts' predicted length: a request in the window carries no survival"
    z = paired(predicted)
    # The adjustment keeps d's center only while the arm leaves the covariate alone; a window whose drafts
    # differ between the arms (an engine whose arms draft differently) is judged unadjusted.
    balance = measure(np.concatenate(list(z.values())), spec.level) if z else Measurement(None, 0)
    if balance.low is not None and balance.high is not None and not balance.low <= 1.0 <= balance.high:
        return out, (
            f"not adjusted: the drafts' predicted length differs between the arms "
            f"(×{balance.value:.3f} [{balance.low:.3f}, {balance.high:.3f}])"
        )
    out["tokens_per_s_ratio"], theta = adjusted(out["tokens_per_s_ratio"], z)
    return out, f"adjusted for the drafts' predicted length (θ {theta:.2f} over the window, leave-one-out per pair)"


def reference_window(design: Design, spec: Comparison) -> Design | None:
    """The window of ``comparison.window_s`` just before ``design``'s, whole pairs only, which its drift is
    measured from; None while the stage is no older than one window (there is nothing before it)."""
    if isinstance(design, Epochs):
        if design.since <= design.origin:
            return None
        since = window_start(design.origin, 2 * spec.epoch_s, design.since, spec.window_s)
        return Epochs(design.revision, design.origin, since, until=design.since)
    first = design.origin + spec.burn_in_s
    if design.since is None or design.since <= first:
        return None
    since = window_start(first, spec.epoch_s, design.since, spec.window_s)
    return Groups(design.origin, design.arms, until=design.since, since=since)
