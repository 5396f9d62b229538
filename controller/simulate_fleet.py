"""The simulated fleet (``sparkgate simulate``, docs/design.md §6): the records one evaluation interval of a
simulated fleet produces, under the policy its controller serves and a scenario's fault.

The fleet serves what it is told: baseline and fallback static; shadow logs suggestions; canary and compact
serve compact windows to their fraction (``observe_fraction`` of it in cap_accept); in the serving phases
every replica alternates treatment and control switchback epochs on the payload's schedule, control epochs
static (adaptive's compact on the static table, as a replica serves them; the simulator fits no tables, so
there both arms serve alike), and reports greedy-replay checks. Rows are drawn as the runtime's were
(``Fleet.fitted``, ``controller.simulate_fit``): confidences from a sample of its rows, acceptance from its
own calibration; windows come from a survival-threshold scheduler; step time follows the rows verified,
with a lognormal per-step noise, a load factor both arms of an epoch pair share and noise each epoch draws
alone, in wall and CPU time; request latency is lognormal on the same factors. A scenario's change starts
when the rollout first serves the treatment (the first canary interval) and stays.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkgate.collectors.request_ingest import prepare_requests
from sparkgate.collectors.schema import MODES
from sparkgate.collectors.store import Store
from sparkgate.collectors.synth import RowModel, synthetic_wire, worst_depth_ece
from sparkgate.collectors.wire import from_wire
from sparkgate.policies.switchback import Switchback
from sparkgate.policies.vocabulary import SWITCHBACK_PHASES, Arm, CheckKind, Phase

from .simulate_fit import FIT_PATH, row_model
from .simulate_fit import load as load_fit
from .supervisor import Controller

T0 = 1.8e9
CHECKS_PER_INTERVAL = 4


@dataclass(frozen=True)
class Fleet:
    """The simulated fleet. Step time is ``step_ms_fixed + step_ms_per_row × verify rows`` times the noise:
    ``load_sd`` (log scale) an epoch's factor both arms of a pair share, ``noise_sd`` one each epoch draws
    alone, ``step_sd`` each step's own. Rows are drawn as ``runtime`` draws them (named by ``truth``; the
    default: calibrated, uniform in ``collectors.synth.TRUTH_RANGE``). ``fitted`` takes the step-time model,
    confidences and calibration from the runtime (``controller.simulate_fit``); the traffic (replicas, batch, steps per
    second, requests) stays the simulator's own, lower than a real replica's, so each interval holds less
    evidence than a real one would."""

    replicas: int = 3
    batch: int = 16
    steps_per_s: float = 2.0
    step_ms_fixed: float = 10.0
    step_ms_per_row: float = 10.0 / (16 * 8)
    step_sd: float = 0.2
    load_sd: float = 0.3
    noise_sd: float = 0.1
    # The replica's CPU time per step (what comparison.step_time: cpu reads): its own model and noise.
    cpu_ms_fixed: float = 10.0
    cpu_ms_per_row: float = 10.0 / (16 * 8)
    cpu_step_sd: float = 0.1
    cpu_noise_sd: float = 0.05
    requests_per_epoch: int = 12
    ttft_ms: float = 300.0
    tpot_ms: float = 30.0
    window_threshold: float = 0.1  # utilization about 0.93, above the default gate's 0.85
    truth: str = "uniform"
    runtime: RowModel = field(default=RowModel(), compare=False, repr=False)

    @classmethod
    def fitted(cls, path: str | Path = FIT_PATH) -> Fleet:
        model = load_fit(path)
        wall, cpu = model["wall"], model["cpu"]
        return cls(
            step_ms_fixed=wall["fixed_ms"],
            step_ms_per_row=wall["per_row_ms"],
            step_sd=wall["step_sd"],
            noise_sd=wall["noise_sd"],
            cpu_ms_fixed=cpu["fixed_ms"],
            cpu_ms_per_row=cpu["per_row_ms"],
            cpu_step_sd=cpu["step_sd"],
            cpu_noise_sd=cpu["noise_sd"],
            truth=f"fitted to {model['rows']} runtime rows",
            runtime=row_model(model),
        )

    def rows(self, modes: tuple[float, ...], confidence_scale: float = 1.0) -> RowModel:
        return replace(self.runtime, mode_weights=modes, window_threshold=self.window_threshold,
                       confidence_scale=confidence_scale)  # fmt: skip

    def describe(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "runtime"}


@dataclass(frozen=True)
class Scenario:
    """What goes wrong from the first canary interval on (the onset).

    Faults: ``ece`` adds that much to the worst depth's survival ECE of the confidences ``drifting``
    replicas report (overconfidence, ``drift_scale``); ``regression`` slows the treatment's steps and
    tokens by that fraction; ``tier_misses`` makes that fraction of the treatment's steps run eager;
    ``mismatches`` greedy-replay checks a replica reports per interval find a mismatch. No fault:
    ``load_swing`` swings the batch size (and step time with it) by that fraction over a slow cycle;
    ``silent`` replicas stop reporting at the onset. Not a change at the onset: ``table_gain`` makes
    adaptive's treatment steps that fraction faster than its control's from the stage's first interval (a
    fitted table that pays; the simulator fits none), the lead over the static-table control that a drift
    gate watches."""

    name: str
    ece: float = 0.0
    drifting: int = 0
    regression: float = 0.0
    tier_misses: float = 0.0
    mismatches: int = 0
    load_swing: float = 0.0
    silent: int = 0
    table_gain: float = 0.0

    @property
    def faulty(self) -> bool:
        return self.drifting > 0 or self.regression > 0 or self.tier_misses > 0 or self.mismatches > 0

    @property
    def changes(self) -> bool:
        """Whether anything changes at the onset (a fault, or one of the healthy changes)."""
        return self.faulty or self.silent > 0 or self.load_swing > 0


_SCALES: dict[tuple[float, int, str], float] = {}
# The largest confidence scale a drift may take: far past it every confidence is about 0 or 1.
MAX_SCALE = 4.0


def _added_by(gamma: int, fleet: Fleet) -> Callable[[float], float]:
    """The worst-depth survival ECE a confidence scale adds to ``fleet``'s rows, against scale 1."""
    base = worst_depth_ece(1.0, gamma, 50_000, model=fleet.runtime)
    return lambda scale: worst_depth_ece(scale, gamma, 50_000, model=fleet.runtime) - base


def max_drift(gamma: int, fleet: Fleet = Fleet()) -> float:
    """The largest worst-depth survival ECE a drift adds to ``fleet``'s rows (at ``MAX_SCALE``)."""
    return _added_by(gamma, fleet)(MAX_SCALE)


def drift_scale(ece: float, gamma: int, fleet: Fleet = Fleet()) -> float:
    """The confidence scale that adds ``ece`` to the worst-depth survival ECE of ``fleet``'s rows
    (``collectors.synth.worst_depth_ece``), by bisection: the drift scenarios are sized in the unit the
    gates judge. ``ValueError`` for a drift larger than any scale makes (``max_drift``)."""
    key = (ece, gamma, fleet.truth)
    if key not in _SCALES:
        added = _added_by(gamma, fleet)
        largest = added(MAX_SCALE)
        if ece > largest:
            raise ValueError(f"a drift of {ece:g}: this fleet model's largest is {largest:.3f} (worst-depth ECE)")
        low, high = 1.0, MAX_SCALE
        for _ in range(30):
            middle = (low + high) / 2
            low, high = (middle, high) if added(middle) < ece else (low, middle)
        _SCALES[key] = (low + high) / 2
    return _SCALES[key]


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("none"),
        Scenario("drift-all", ece=0.05, drifting=3),
        Scenario("drift-one", ece=0.10, drifting=1),
        Scenario("latency", regression=0.10),
        Scenario("tier-misses", tier_misses=0.05),
        Scenario("consistency", mismatches=1),
        Scenario("load-swing", load_swing=0.5),
        Scenario("stops-reporting", silent=1),
    )
}


def _modes(phase: str, fraction: float, observe: float, arm: str | None) -> tuple[float, ...]:
    """The serving modes' shares of one epoch's requests, as a replica serves them: a control epoch is static
    verification, except in adaptive, whose control serves compact on the static table (``Replica.follow``),
    which is what the treatment serves too while the simulator fits no tables."""
    weights: dict[str, float] = dict.fromkeys(map(str, MODES), 0.0)
    static_control = arm == Arm.CONTROL and phase != Phase.ADAPTIVE
    if static_control or phase in (Phase.BASELINE, Phase.FALLBACK, Phase.PAUSED):
        weights["static"] = 1.0
    elif phase == Phase.SHADOW:
        weights["shadow"] = 1.0
    else:
        weights["compact"], weights["cap_accept"] = fraction * (1 - observe), fraction * observe
        weights["static"] = 1.0 - fraction
    return tuple(weights[str(m)] for m in MODES)


def emit_interval(store: Store, ctl: Controller, fleet: Fleet, scenario: Scenario, rng, start: float, step: list[int],
              onset: bool) -> None:  # fmt: skip
    """Ingest every replica's records for one evaluation interval from ``start`` (``onset``: the scenario's
    change is in force)."""
    policy, state = ctl.policy, ctl.state
    spec, length = policy.comparison, policy.evaluation_interval_s
    switching = state.phase in SWITCHBACK_PHASES
    schedule = Switchback(spec.seed, spec.epoch_s, state.entered_at) if switching else None
    scale = drift_scale(scenario.ece, policy.gamma, fleet) if scenario.drifting else 1.0
    wires, lines, checks = [], [], []
    for r in range(fleet.replicas):
        if onset and r < scenario.silent:
            continue
        replica = f"sim-{r}"
        t = start
        while t < start + length - 1e-9:
            epoch = schedule.epoch(t) if schedule else None
            end = min(start + length, schedule.start(epoch + 1)) if schedule and epoch is not None else start + length
            arm = str(schedule.arm(replica, epoch)) if schedule and epoch is not None else None
            pair_load = _pair_load(spec.seed, replica, epoch, fleet.load_sd) if epoch is not None else 0.0
            treated = onset and arm == Arm.TREATMENT
            # A load swing: a slow cycle of the batch size, its step time following (both arms alike).
            swing = 1 + scenario.load_swing * math.sin(2 * math.pi * (t - T0) / (20 * length)) if onset else 1.0
            model = fleet.rows(_modes(state.phase, state.compact_fraction, policy.observe_fraction, arm),
                               scale if onset and r < scenario.drifting else 1.0)  # fmt: skip
            n = max(1, round((end - t) * fleet.steps_per_s))
            batch = max(1, round(fleet.batch * swing))
            wire = synthetic_wire(n, batch, policy.gamma, replica, step[0], int(rng.integers(1 << 31)), t, model=model)
            slow = swing * (1 + scenario.regression if treated else 1.0)
            if arm == Arm.TREATMENT and state.phase == Phase.ADAPTIVE:
                slow /= 1 + scenario.table_gain
            factor = math.exp(pair_load + rng.normal(0, fleet.noise_sd)) * slow
            cpu_factor = math.exp(pair_load + rng.normal(0, fleet.cpu_noise_sd)) * slow
            rows = _verify_rows(wire, policy.gamma)
            ms = factor * (fleet.step_ms_fixed + fleet.step_ms_per_row * rows) * np.exp(rng.normal(0, fleet.step_sd, n))
            cpu = cpu_factor * (fleet.cpu_ms_fixed + fleet.cpu_ms_per_row * rows)
            cpu *= np.exp(rng.normal(0, fleet.cpu_step_sd, n))
            hit = ~(rng.random(n) < scenario.tier_misses) if treated else np.ones(n, bool)
            wire = _with(wire, phase=str(state.phase), policy_revision=state.revision, epoch=epoch, arm=arm,
                         step_ms=ms, step_cpu_ms=cpu, ts=t + np.arange(n) * (end - t) / n, graph_hit=hit,
                         verify_rows=rows, tier_rows=rows,
                         miss_reason=np.array([None if h else "over_max_tier" for h in hit], object),
                         tier=np.where(hit, wire.column("tier").to_numpy(), -1))  # fmt: skip
            wires.append(wire)
            lines += _requests(fleet, replica, epoch, arm, state, t, end, factor, step[0], rng)
            step[0] += n
            t = end
        if switching:
            checks += _checks(replica, start + length, scenario.mismatches if onset and r == 0 else 0, step[0])
    store.ingest(from_wire(pa.concat_tables(wires)), "simulate")  # one transaction per interval, as a flush
    store.commit_requests(prepare_requests("\n".join(map(json.dumps, lines)).encode()), "simulate")
    if checks:
        store.record_consistency(checks)


def _verify_rows(wire: pa.Table, gamma: int) -> np.ndarray:
    """Target rows per step: w + 1 per compact row, γ + 1 per row verified in full."""
    rows = pc.list_flatten(wire.column("requests").combine_chunks())
    compact = pc.equal(rows.field("mode"), "compact").to_numpy(zero_copy_only=False)
    per_row = np.where(compact, rows.field("window").to_numpy(zero_copy_only=False) + 1, gamma + 1)
    lengths = pc.list_value_length(wire.column("requests")).to_numpy(zero_copy_only=False)
    return np.add.reduceat(per_row, np.r_[0, np.cumsum(lengths)[:-1]]).astype(np.int64)


def _checks(replica: str, at: float, mismatches: int, first: int) -> list[dict]:
    """Greedy-replay checks a replica reports in an interval (``CHECKS_PER_INTERVAL``), ``mismatches`` of
    them failed."""
    return [
        {
            "received_at": at - 1e-3,
            "replica_id": replica,
            "request_id": f"{replica}-check-{first}-{i}",
            "kind": str(CheckKind.GREEDY_REPLAY),
            "tokens": 16,
            "mismatch_at": 3 if i < mismatches else None,
            "expected": 1 if i < mismatches else None,
            "got": 2 if i < mismatches else None,
        }
        for i in range(CHECKS_PER_INTERVAL)
    ]


def _pair_load(seed: int, replica: str, epoch: int, sd: float) -> float:
    """The load factor an epoch pair shares (the same for epochs 2k and 2k + 1 of a replica)."""
    key = zlib.crc32(f"{seed}/{replica}/{epoch // 2}".encode())  # stable across processes, unlike hash()
    return float(np.random.default_rng(key).normal(0, sd))


def _requests(fleet, replica, epoch, arm, state, start, end, factor, first, rng) -> list[dict]:
    out = []
    for i in range(fleet.requests_per_epoch):
        arrival = start + (end - start) * (i + 0.1) / (fleet.requests_per_epoch + 1)
        ttft = fleet.ttft_ms * factor * math.exp(rng.normal(0, 0.3)) / 1000
        tpot = fleet.tpot_ms * factor * math.exp(rng.normal(0, 0.3)) / 1000
        tokens = 8
        finish = min(arrival + ttft + tpot * (tokens - 1), end - 1e-3)
        out.append({"schema_version": 2, "replica_id": replica, "request_id": f"{replica}-{first}-{i}",
                    "arrival_ts": arrival, "first_token_ts": min(arrival + ttft, finish), "finish_ts": finish,
                    "finish_reason": "length", "prompt_tokens": 32, "output_tokens": tokens, "mode": "compact",
                    "phase": str(state.phase), "policy_revision": state.revision, "epoch": epoch, "arm": arm,
                    "contract": None, "commit_offsets_ms": [(min(arrival + ttft, finish) - arrival) * 1000,
                                                            (finish - arrival) * 1000],
                    "commit_tokens": [1, tokens - 1]})  # fmt: skip
    return out


def _with(wire: pa.Table, **values) -> pa.Table:
    for name, value in values.items():
        field_ = wire.schema.field(name)
        column = value if isinstance(value, np.ndarray) else [value] * wire.num_rows
        wire = wire.set_column(wire.schema.get_field_index(name), field_, pa.array(column, field_.type))
    return wire
