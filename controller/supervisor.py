"""The controller proper: evaluate, judge, decide, persist, then act.

``Controller.tick`` runs one evaluation interval: metrics over the window since
the stage began (at most ``lookback_s``, its start floored to the ingest-time
sums' 10 s buckets), a verdict per gate of the phase, one
decision from the state machine, written to the ledger *before* the new state is
adopted and the actuators are told. Operator actions (``act``) take the same
path. A new controller over an existing store resumes from its ledger.

Thread safety: the evaluation (the slow part) runs without the lock; the decision
is taken under it, and dropped if an operator changed the policy meanwhile (its
window no longer describes the stage in force).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import duckdb

from sparkgate.collectors.label_sums import SUM_BUCKET_S
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.policies.adaptive import ADAPTIVE_METRICS
from sparkgate.policies.gate import Gate
from sparkgate.policies.payload import PolicyPayload, SwitchbackSpec
from sparkgate.policies.rollout import RolloutPolicy
from sparkgate.policies.vocabulary import (
    CHANGES_POLICY,
    COMPARISON_METRICS,
    DRIFT_METRICS,
    SWITCHBACK_PHASES,
    Arm,
    Phase,
)

from . import contract, ledger, lookback, promql, rollout
from .calibration_gates import look_index
from .comparison import Design, Epochs, Groups, comparisons, reference_window, window_start
from .evaluate import evaluate, optional_reads
from .exporter import ControllerMetrics
from .gates import Verdict, error_verdict, judge_all, judge_baseline
from .measurement import Measurement
from .metrics import Evaluation
from .queries import SameContract, Slice, Window
from .references import References
from .rollout_state import Decision, RolloutState, apply, stage_counters
from .window_cache import WindowCache

log = logging.getLogger(__name__)

# Gates look back this many evaluation intervals (bounded by the stage's start).
LOOKBACK_INTERVALS = 5


def lookback_start(now: float, lookback_s: float) -> float:
    """Where a window reaching ``lookback_s`` back from ``now`` starts: on the sums' bucket grid (up to
    ``SUM_BUCKET_S`` earlier), so it has no first part-bucket to read from the rows, a sixth of a compact
    tick (docs/benchmarks.md)."""
    return math.floor((now - lookback_s) / SUM_BUCKET_S) * SUM_BUCKET_S


# Told each policy the fleet is to serve; what it returns is ignored.
Actuator = Callable[[PolicyPayload], object]
# Told each decision once it is persisted (e.g. a Notifier); must return at once.
Observer = Callable[[Decision], object]
# For fleets split by replica: each replica group's arm under a payload, by replica id prefix
# (e.g. SGLangActuator.arms); the comparison gates then compare groups, not switchback epochs.
GroupArms = Callable[[PolicyPayload], tuple[tuple[str, Arm], ...]]


@dataclass(frozen=True)
class Versions:
    """Versions the policy payload announces to replicas."""

    cost_table_version: str | None = None
    sts_version: str | None = None


class Controller:
    """Rollout state over a store; ``tick`` and ``act`` are the only ways it changes."""

    def __init__(
        self,
        store: Store,
        policy: RolloutPolicy,
        *,
        metrics: Metrics | None = None,
        actuators: Sequence[Actuator] = (),
        observers: Sequence[Observer] = (),
        groups: GroupArms | None = None,
        prometheus_url: str | None = None,
        versions: Versions = Versions(),
        lookback_s: float | None = None,
        resamples: int = 200,
        clock: Callable[[], float] = time.time,
        collector_errors: Callable[[], list[str]] = list,
    ):
        self.store, self.policy, self.versions, self.clock = store, policy, versions, clock
        self.actuators, self.prometheus_url, self.resamples = list(actuators), prometheus_url, resamples
        self.observers, self.groups, self.collector_errors = list(observers), groups, collector_errors
        self.lookback_s = policy.evaluation_interval_s * LOOKBACK_INTERVALS if lookback_s is None else lookback_s
        self.exporter = ControllerMetrics(metrics) if metrics is not None else None
        self.last_verdicts: list[Verdict] = []
        self._lock = threading.Lock()
        self._pushing = threading.Lock()
        self.references = References()  # shadow's references, read again only when their labels change
        self.window_cache = WindowCache()  # the window's whole buckets, slid from tick to tick
        self.state = self._resume()
        if self.exporter is not None:
            self.exporter.state(self.state)
        # A decision persisted just before a restart (a rollback) is served now, not one interval later.
        self._actuate()

    def _resume(self) -> RolloutState:
        try:
            state = ledger.load_state(self.store, self.policy)
        except LookupError as exc:
            last, newest = ledger.last_change(self.store), ledger.newest(self.store)
            assert last is not None and newest is not None, "load_state raises only over a stored change"
            # The pinned contract goes on with the fallback, so a change of it after a resume is evaluated again.
            orphan = RolloutState(last.revision, last.phase_to, None, last.compact_fraction, last.decided_at,
                                  contract=newest.contract)  # fmt: skip
            return self._commit(
                orphan,
                rollout.fall_back(self.policy, orphan, self.clock(), "stage not in the policy file", note=str(exc)),
            )
        if state is None:
            return self._commit(None, rollout.start(self.policy, self.clock()))
        return state

    def _commit(self, state: RolloutState | None, decision: Decision) -> RolloutState:
        """Persist ``decision`` first, then adopt it (the caller holds the lock, or is the constructor)."""
        ledger.record(self.store, decision)
        new = apply(state, decision)
        self.state = new
        if self.exporter is not None:
            self.exporter.decision(decision)
            self.exporter.state(new)
        for observer in self.observers:
            try:
                observer(decision)
            except Exception:
                log.exception("observer %r failed at revision %s", observer, decision.revision)
        return new

    # -- policy served to replicas --------------------------------------------
    def policy_payload(self, state: RolloutState | None = None) -> PolicyPayload:
        """``GET /v1/policy`` (docs/design.md §6): the payload of ``state``, by default the one in force."""
        state = state or self.state
        spec = self.policy.comparison
        switchback = (
            SwitchbackSpec(seed=spec.seed, epoch_s=spec.epoch_s, origin=state.entered_at)
            if state.phase in SWITCHBACK_PHASES
            else None
        )
        return PolicyPayload(
            revision=state.revision,
            phase=state.phase,
            compact_fraction=state.compact_fraction,
            observe_fraction=self.policy.observe_fraction,
            fallback_window=self.policy.fallback_window_value,
            gamma=self.policy.gamma,
            cost_table_version=self.versions.cost_table_version,
            cost_tables=dict(state.tables),
            sts_version=self.versions.sts_version,
            switchback=switchback,
        )

    def _actuate(self) -> None:
        # One push at a time, each reading the state as it starts: a tick's push that began before an
        # operator's abort can then never land after the abort's own.
        with self._pushing:
            payload = self.policy_payload()
            for actuator in self.actuators:
                try:
                    actuator(payload)
                except Exception:
                    log.exception("actuator %r failed at revision %s", actuator, payload.revision)

    # -- one interval ------------------------------------------------------------
    def window(self, state: RolloutState, now: float) -> Window:
        since, until = max(state.entered_at, lookback_start(now, self.lookback_s)), self._until(now)
        # A bound at the very instant the stage began reads nothing (Window needs since < until).
        return Window(since=since, until=None if until is None else max(until, since + 1e-6))

    def gate_window(self, state: RolloutState, now: float) -> Window:
        """The gates' window: ``window``, reaching further back while the stage's calibration gates lack
        labels (``controller.lookback``). The cost tables' fits read the plain window."""
        plain = self.window(state, now)
        need = lookback.LabelNeed.of(self._judged(state)[1]) if state.stage is not None else lookback.LabelNeed()
        if plain.since is None or not need:
            return plain
        since = lookback.gate_since(
            self.store,
            entered_at=state.entered_at,
            since=plain.since,
            now=now if plain.until is None else min(now, plain.until),
            step_s=self.policy.evaluation_interval_s,
            max_lookback_s=self.policy.max_lookback_s,
            need=need,
            contract=None if state.contract is None else SameContract(state.contract),
        )
        return plain if since >= plain.since else Window(since, plain.until)

    def _until(self, now: float) -> float | None:
        """Where reads stop: open for the live controller (nothing is newer than now but clock skew); a
        replay (``controller.backtest``) bounds them at the time it replays."""
        return None

    def judge(self, state: RolloutState, evaluation: Evaluation, now: float) -> list[Verdict]:
        """Verdicts of the gates of the stage's phase (paused: the paused stage's; fallback: every gate,
        for the record). In baseline the one check is whether the reference is large enough."""
        stale = self._stale(evaluation, now)
        phase, gates = self._judged(state)
        if phase == "baseline":
            steps = sum(evaluation.baseline.column("steps").to_pylist()) if evaluation.baseline is not None else 0
            return [judge_baseline(self.policy, steps, stale)]
        looks = look_index(state.evaluations + 1, self.policy.evaluation_interval_s, self.lookback_s)
        measured = evaluation.measurements(phase, looks)
        windowed = {g.name for g in gates if g.measured_as in measured}  # the gates judged on the gate window
        # Comparisons read the pairs of the stage's last comparison.window_s, far longer than the other gates'
        # window: pairs are the scarce evidence, and every one was measured against its own concurrent control.
        comparing = [g for g in gates if g.metric in (*COMPARISON_METRICS, *DRIFT_METRICS) and not g.promql]
        if comparing:  # two queries otherwise unread (two more for the window before, which drifts read)
            design, spec = self._design(state, now), self.policy.comparison
            drifts = any(g.metric in DRIFT_METRICS for g in comparing)
            measured.update(_read_apart(comparing, lambda: comparisons(
                self.store, design, spec, reference_window(design, spec) if drifts else None)))  # fmt: skip
            if isinstance(design, Groups) and {arm for _, arm in design.arms} != set(Arm):
                # Every server serves one arm in this stage (e.g. shadow: all verify in full), so there is no
                # effect to measure: the gates are recorded, and cannot hold the stage back.
                gates = tuple(g.model_copy(update={"dry_run": True}) if g in comparing else g for g in gates)
        adaptive = [g for g in gates if g.metric in ADAPTIVE_METRICS and not g.promql]
        measured.update(_read_apart(adaptive, lambda: self._adaptive_measurements(state, gates, now)))
        at = self._until(now)  # a replay asks Prometheus for the time it replays
        measured.update({g.measured_as: self._promql(g.promql, g.direction, at) for g in gates if g.promql})
        return _widened(judge_all(gates, measured, stale), windowed, evaluation.window, self.window(state, now))

    def _adaptive_measurements(self, state: RolloutState, gates: Sequence[Gate], now: float) -> dict[str, Measurement]:
        """The adaptive gates' inputs, read only when a gate of the stage asks for them."""
        metrics = {g.metric for g in gates if not g.promql} & set(ADAPTIVE_METRICS)
        if not metrics:
            return {}
        from . import adaptation  # torch (cost tables) loads only in adaptive: the commands start without it

        return adaptation.measurements(self.store, state, metrics, self.window(state, now), self.policy)

    def _judged(self, state: RolloutState) -> tuple[str, tuple[Gate, ...]]:
        """The phase whose gates judge ``state`` (paused: the paused stage's) and those gates (fallback: every
        gate, for the record)."""
        if state.stage is None:
            return state.phase, self.policy.gates
        phase = self.policy.stages()[state.stage].phase
        return phase, self.policy.gates_for(phase)

    def _design(self, state: RolloutState, now: float) -> Design:
        """The comparisons' pairs: those of the stage's last ``comparison.window_s``, whole pairs only."""
        until, spec = self._until(now), self.policy.comparison
        if self.groups is None:
            since = window_start(state.entered_at, 2 * spec.epoch_s, now, spec.window_s)
            return Epochs(state.revision, state.entered_at, since, until)
        slices = window_start(state.entered_at + spec.burn_in_s, spec.epoch_s, now, spec.window_s)
        return Groups(state.entered_at, self.groups(self.policy_payload(state)), until, slices)

    def _stale(self, evaluation: Evaluation, now: float) -> str | None:
        if evaluation.as_of is None:
            return "no steps in the window"
        age = now - evaluation.as_of
        return (
            f"newest step is {age:.0f} s old (stale_after_s {self.policy.stale_after_s:g})"
            if age > self.policy.stale_after_s
            else None
        )

    def _promql(self, query: str, direction: str, at: float | None) -> Measurement:
        if self.prometheus_url is None:
            return Measurement(None, 0)
        try:
            return promql.query(self.prometheus_url, query, direction, at=at)
        except promql.PromQLError as exc:
            log.warning("gate query failed: %s", exc)
            return Measurement(None, 0, error=str(exc))

    def tick(self) -> Decision | None:
        """One evaluation interval; returns the decision taken (None if an operator acted meanwhile)."""
        state, now = self.state, self.clock()
        evaluation: Evaluation | None = None
        try:
            window = self.gate_window(state, now)  # reads the store too (the labels per depth)
            reading = contract.read(self.store, window, state.contract)
            evaluation = evaluate(
                self.store,
                window,
                Slice(),
                self.resamples,
                contract=reading.reference(),
                **optional_reads(self._judged(state)[1] if state.stage is not None else ()),
                references=self.references,
                window_cache=self.window_cache,
                baseline=self._judged(state)[0] == Phase.BASELINE,  # its gate counts baseline's steps
            )
            verdicts = self.judge(state, evaluation, now)
        except duckdb.Error as exc:  # the store could not be read: an error interval, not "no data"
            log.exception("evaluation failed at revision %s", state.revision)
            reading, verdicts = contract.ContractReading(state.contract), [error_verdict(f"store: {exc}")]
        except Exception as exc:
            # Anything else (a bug, a source's unexpected reply) is an error interval too: counted towards
            # error_limit, where escaping the tick would retry it for ever with the stage frozen and unrecorded.
            log.exception("evaluation failed at revision %s", state.revision)
            reading = contract.ContractReading(state.contract)
            verdicts = [error_verdict(f"{type(exc).__name__}: {exc}")]
        # A collector that cannot read its source leaves records out: an error, whatever the gates read.
        verdicts += [error_verdict(error, "collector") for error in self.collector_errors()]
        with self._lock:
            if self.state.revision != state.revision:
                return None
            decision = rollout.decide(self.policy, state, verdicts, now, reading)
            self._commit(state, decision)
            self.last_verdicts = verdicts
        if self.exporter is not None:
            self.exporter.evaluation(evaluation, verdicts)
        if decision.action not in CHANGES_POLICY:
            self._adapt(now)
        self._actuate()
        return decision

    # -- adaptive: fitted cost tables ----------------------------------------------
    def _adapt(self, now: float) -> list[Decision]:
        """In adaptive (before any revert), the table each replica group's update rule publishes: stored,
        then its decision persisted, then adopted."""
        state = self.state
        if state.phase != Phase.ADAPTIVE or state.static_only:
            return []
        from . import adaptation  # as in _adaptive_measurements

        published: list[Decision] = []
        for update in adaptation.updates(self.store, self.policy.adaptive, state, self.window(state, now), now):
            assert update.entry is not None, "updates yields published tables only"
            with self._lock:
                if self.state.revision != state.revision:
                    return published  # an operator acted meanwhile: that stage is over
                detail = {k: v for k, v in update.reasons.items() if k != "rule"}
                decision = rollout.publish_table(self.state, now, update.group, update.entry.version, detail)
                self._commit(self.state, decision)
            published.append(decision)
        return published

    def act(self, action: str, operator: str, note: str = "", revision: int | None = None) -> Decision:
        """An operator action (raises ``rollout.TransitionError`` when the phase does not allow it, or when
        ``revision`` is given and no longer in force)."""
        with self._lock:
            if revision is not None and revision != self.state.revision:
                raise rollout.TransitionError(
                    f"{action}: revision {revision} is no longer in force (revision {self.state.revision} is)"
                )
            decision = rollout.command(self.policy, self.state, action, operator, self.clock(), note)
            self._commit(self.state, decision)
        self._actuate()
        return decision

    def status(self) -> dict:
        """``GET /v1/status``: the policy in force, counters of the stage, and the last verdicts."""
        state = self.state
        return {
            "policy": self.policy_payload().model_dump(mode="json"),
            **stage_counters(self.policy, state, self.clock()),
            "contract": state.contract,
            "ladder": [{"phase": s.phase, "compact_fraction": s.compact_fraction} for s in self.policy.stages()],
            "gates": [v.to_dict() for v in self.last_verdicts],
            "cost_tables": dict(state.tables),
            "static_only": state.static_only,
        }


def _widened(verdicts: list[Verdict], gates: set[str], read: Window, plain: Window) -> list[Verdict]:
    """``verdicts``, those of the ``gates`` judged on the window noting how much further back than the
    lookback it read (so a decision's reasons show a verdict resting on older labels)."""
    if read.since is None or plain.since is None or read.since >= plain.since:
        return verdicts
    note = f"window widened {plain.since - read.since:.0f} s beyond the lookback for labels"
    return [replace(v, note=f"{v.note}; {note}") if v.gate in gates else v for v in verdicts]


def _read_apart(gates: Sequence[Gate], read: Callable[[], dict[str, Measurement]]) -> dict[str, Measurement]:
    """``read()``, the measurements only ``gates`` ask for; a store that cannot answer it is an error of
    those gates alone, so a dry-run gate's read never decides the interval nor hides the others' verdicts."""
    try:
        return read()
    except duckdb.Error as exc:
        log.exception("a read of gates %s failed", [g.name for g in gates])
        return {g.measured_as: Measurement(None, 0, error=f"store: {exc}") for g in gates}
