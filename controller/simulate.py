"""``sparkgate simulate``: how often the controller is wrong, measured over seeded simulated rollouts
(docs/design.md §6).

Each seed runs a simulated fleet (``controller.simulate_fleet``) on an accelerated clock through the real
code path: its step and request records are ingested into an in-memory DuckDB database (validation, labels,
recovery, sums), and the ``Controller`` that ``serve`` runs evaluates, judges, decides and writes its ledger
every ``evaluation_interval_s``, without HTTP. Seeds run in worker processes; each is determined by its seed.
The summary gives per scenario the rollback and detection rates and delays; ``--sweep`` draws a gate's
operating curve.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import click
import numpy as np

from sparkgate.collectors.store import Store
from sparkgate.policies.outputs import output_path, written_whole
from sparkgate.policies.rollout import RolloutPolicy, load_rollout_policy
from sparkgate.policies.vocabulary import Phase

from .simulate_fit import FIT_PATH
from .simulate_fleet import SCENARIOS, T0, Fleet, Scenario, emit_interval, max_drift
from .supervisor import Controller

# Rolled-back seeds listed in the summary (a faulty scenario rolls every seed back).
MAX_LISTED = 20
# Rollback rules that are evidence of a fault (the progress deadline is a lack of it).
EVIDENCE = frozenset({"failure limit", "critical gate failed", "gate failure limit"})


@dataclass
class Run:
    """One seed's rollout: what happened, by interval index (0-based: interval k's records are emitted, then
    the tick that ends it decides)."""

    onset: int | None = None  # the interval whose records the fault begins with
    rollback: int | None = None
    rollback_rule: str | None = None  # why: a gate's failure, or e.g. the progress deadline
    rollback_gates: tuple[str, ...] = ()  # the gates failing at the rollback (whether the fault's gate caught it)
    compact_at: int | None = None
    inconclusive: int = 0
    failed: int = 0  # failed intervals, rolled back or held (a healthy fleet's false alarms)
    intervals: int = 0
    cut: bool = False  # ran all ``max_intervals`` without rolling back or ending at the top


def run_seed(
    policy: RolloutPolicy, scenario: Scenario, seed: int, fleet: Fleet, max_intervals: int, late: int | None = None
) -> Run:
    """One seeded rollout, from baseline until it falls back or has held the top of the ladder a while.

    The scenario's change starts at the first canary interval, and the run ends once the rollout has held
    the top ``3 × consecutive_passes`` intervals; or with ``late``, that many intervals after the rollout
    reached the top (a fault in a long last stage), and the run lasts ``max_intervals`` unless it rolls back
    (a fault diluted in a long history may take long to catch)."""
    rng = np.random.default_rng(seed)
    policy = policy.replace(comparison={**policy.comparison.model_dump(), "seed": seed})
    run, now, step = Run(), [T0], [0]
    top = len(policy.stages()) - 1
    # An in-memory database: the same SQL and transactions, without a commit's disk sync per batch.
    # One DuckDB thread: seeds run one per core in worker processes.
    with Store(":memory:", threads=1) as store:
        # Serve's controller, resamples included: 200 cost no more CPU than 50 here (one seed: 8.2-8.4 s
        # against 7.6-9.1 s), and 50 made a healthy calibration look likelier to fail.
        ctl = Controller(store, policy, clock=lambda: now[0])
        for k in range(max_intervals):
            if run.onset is None and scenario.changes and _onset(ctl, run, k, late):
                run.onset = k
            emit_interval(store, ctl, fleet, scenario, rng, now[0], step, run.onset is not None)
            now[0] += policy.evaluation_interval_s
            decision = ctl.tick()
            run.intervals = k + 1
            if decision is None:
                continue
            run.inconclusive += decision.outcome == "inconclusive"
            run.failed += decision.outcome == "fail"
            if decision.phase_to == Phase.FALLBACK:
                run.rollback, run.rollback_rule = k, decision.reasons[0].get("rule")
                run.rollback_gates = tuple(r["gate"] for r in decision.reasons[1:]
                                           if r.get("outcome") == "fail" and not r.get("dry_run"))  # fmt: skip
                break
            if ctl.state.stage == top and run.compact_at is None:
                run.compact_at = k
            if late is None and run.compact_at is not None and k - run.compact_at >= 3 * policy.consecutive_passes:
                break
        else:
            run.cut = True
    return run


def _onset(ctl: Controller, run: Run, k: int, late: int | None) -> bool:
    if late is None:
        return ctl.state.compact_fraction > 0
    return run.compact_at is not None and k - run.compact_at > late


def run_seeds(
    policy: RolloutPolicy,
    scenario: Scenario,
    seeds: int,
    fleet: Fleet,
    max_intervals: int,
    workers: int = 1,
    progress: Callable[[str], object] = lambda _: None,
    late: int | None = None,
) -> list[Run]:
    """Seeds ``0 .. seeds - 1`` in ``workers`` processes; the runs in seed order (each is determined by its
    seed alone, so the result does not depend on ``workers``)."""
    if workers <= 1:
        runs = []
        for seed in range(seeds):
            runs.append(run_seed(policy, scenario, seed, fleet, max_intervals, late))
            progress(f"seed {seed + 1}/{seeds}")
        return runs
    # One BLAS thread per worker: the bootstrap's small products run several times slower when each of the
    # workers' BLAS pools spins up threads for cores the other workers hold.
    with (
        _environment(BLAS_THREADS),
        ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool,
    ):
        futures = [pool.submit(run_seed, policy, scenario, seed, fleet, max_intervals, late) for seed in range(seeds)]
        for done, _ in enumerate(as_completed(futures), 1):
            progress(f"{done}/{seeds} seeds")
        return [f.result() for f in futures]


BLAS_THREADS = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """``values`` set in this process's environment (which spawned children start with), then restored."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _quantile(values: list[int], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def _by_gate(runs: Iterable[Run]) -> dict[str, int]:
    """Rollbacks per gate failing at them (one rollback may count for several gates)."""
    counts: dict[str, int] = {}
    for run in runs:
        for gate in run.rollback_gates:
            counts[gate] = counts.get(gate, 0) + 1
    return dict(sorted(counts.items()))


def summarize(scenario: Scenario, runs: list[Run]) -> dict:
    """Rates over the seeds of one scenario (rates of all seeds; delays over those that rolled back)."""
    rolled = [(r, r.rollback) for r in runs if r.rollback is not None]
    # A detection is a rollback after the onset on the gates' evidence, not on the progress deadline. Its
    # delay is the intervals elapsed since the fault began, the onset's own included: a rollback at the tick
    # ending the onset interval, the first that can see the fault, is one interval after it.
    caught = [
        at - r.onset + 1 for r, at in rolled if r.onset is not None and at >= r.onset and r.rollback_rule in EVIDENCE
    ]
    early = sum(1 for r, at in rolled if r.onset is None or at < r.onset)
    rules: dict[str, int] = {}
    for r, _ in rolled:
        rules[str(r.rollback_rule)] = rules.get(str(r.rollback_rule), 0) + 1
    reached = [r.compact_at + 1 for r in runs if r.compact_at is not None]  # intervals taken, its own included
    intervals, failed = max(sum(r.intervals for r in runs), 1), sum(r.failed for r in runs)
    # Which seeds rolled back, when and why: ``run_seed`` replays any of them exactly.
    # "interval": the n-th interval, counted from 1, whose tick rolled back.
    rollbacks = [{"seed": i, "interval": r.rollback + 1, "rule": r.rollback_rule, "gates": list(r.rollback_gates)}
                 for i, r in enumerate(runs) if r.rollback is not None]  # fmt: skip
    horizon = [r.intervals for r in runs]
    return {
        "scenario": scenario.name,
        "seeds": len(runs),
        "rollback_rate": len(rolled) / len(runs),
        "detection_rate": len(caught) / len(runs) if scenario.faulty else None,
        "rolled_back_before_onset": early,
        "rollbacks_by_rule": rules,
        "rollbacks_by_gate": _by_gate(r for r, _ in rolled),
        "detection_delay_intervals": {"median": _quantile(caught, 0.5), "p95": _quantile(caught, 0.95)},
        # Seeds caught within k intervals of the onset (a delay of at most k), of all seeds: the targets' form.
        "detected_within": (
            {str(k): sum(d <= k for d in caught) / len(runs) for k in (1, 3, 5)} if scenario.faulty else None
        ),
        "intervals_to_top_of_ladder": {"median": _quantile(reached, 0.5), "reached": len(reached)},
        # What the rates cover: seeds whose fault began, seeds cut off at --max-intervals undecided, and how
        # long the seeds ran (a healthy run ends soon after the top: its rollback rate is for that horizon).
        "reached_onset": sum(r.onset is not None for r in runs) if scenario.faulty else None,
        "ended_at_max_intervals": sum(r.cut for r in runs),
        "intervals_per_seed": {"median": _quantile(horizon, 0.5), "max": max(horizon, default=0)},
        "inconclusive_share": sum(r.inconclusive for r in runs) / intervals,
        # Failed intervals over all intervals judged: on a healthy fleet, the false-alarm rate per look.
        "failed_share": failed / intervals,
        "failed_intervals": failed,
        "rollbacks": rollbacks[:MAX_LISTED],
    }


# The operating curve (``--sweep GATE=T1,T2,… --plot FILE``): per threshold of a gate, the false-rollback
# rate on a healthy fleet against how soon a fault is caught, over the same seeds.


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """``GATE=T1,T2,…`` as (gate name, thresholds); raises ``ValueError`` naming what is wrong."""
    name, _, values = text.partition("=")
    try:
        thresholds = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        thresholds = []
    if not name or not thresholds:
        raise ValueError(f"--sweep {text!r}: expected GATE=T1,T2,... (a gate name and numbers)")
    return name, thresholds


def operating_curve(
    policy: RolloutPolicy,
    gate: str,
    thresholds: list[float],
    fault: Scenario,
    seeds: int,
    fleet: Fleet,
    max_intervals: int,
    workers: int = 1,
    progress: Callable[[str], object] = lambda _: None,
    late: int | None = None,
) -> list[dict]:
    """Per threshold of ``gate``: the healthy fleet's rollback rate and the fault's detection figures (the
    fault starting ``late`` intervals into the top of the ladder, as ``run_seed`` has it)."""
    if gate not in {g.name for g in policy.gates}:
        raise ValueError(
            f"--sweep {gate!r}: no gate of that name in the policy ({', '.join(g.name for g in policy.gates)})"
        )
    points = []
    for threshold in thresholds:
        gates = [g.model_dump(mode="json") | ({"threshold": threshold} if g.name == gate else {}) for g in policy.gates]
        varied = policy.replace(gates=gates)
        figures = {}
        for scenario in (SCENARIOS["none"], fault):
            label = f"sweep {gate}={threshold:g} {scenario.name}"
            runs = run_seeds(varied, scenario, seeds, fleet, max_intervals, workers,
                             functools.partial(_labelled, progress, label), late)  # fmt: skip
            figures[scenario.name] = summarize(scenario, runs)
        points.append(curve_point(threshold, figures["none"], figures[fault.name]))
    return points


def curve_point(threshold: float, healthy: dict, fault: dict) -> dict:
    """One threshold's point from the two summaries. A false rollback is one on the gates' evidence: a
    healthy rollout the progress deadline ended (a gate too strict to pass, never failing) is counted apart,
    as a stall, since it is a lack of evidence, not a false alarm."""
    rules, seeds = healthy["rollbacks_by_rule"], healthy["seeds"]
    return {
        "threshold": threshold,
        "false_rollback_rate": sum(n for rule, n in rules.items() if rule in EVIDENCE) / seeds,
        "deadline_rollback_rate": sum(n for rule, n in rules.items() if rule not in EVIDENCE) / seeds,
        "detection_rate": fault["detection_rate"],
        "detection_delay_median": fault["detection_delay_intervals"]["median"],
    }


def _labelled(progress: Callable[[str], object], label: str, line: str) -> object:
    return progress(f"{label}: {line}")


def plot(points: list[dict], gate: str, fault: str, path: str | Path) -> None:
    """Left, the operating curve: detection delay against false-rollback rate, one point per threshold
    (thresholds that land on one point share its label). Right, the rates against the threshold: healthy
    rollbacks on the gates' evidence and those the progress deadline ended (a gate too strict to pass), and
    the fault's detection rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curve, rates) = plt.subplots(1, 2, figsize=(11, 4))
    shown = [p for p in points if p["detection_delay_median"] is not None]
    curve.plot([p["false_rollback_rate"] for p in shown], [p["detection_delay_median"] for p in shown], "o-")
    at: dict[tuple[float, float], list[str]] = {}
    for p in shown:
        stalled = f", stalled {p['deadline_rollback_rate']:.0%}" if p["deadline_rollback_rate"] else ""
        label = f"{p['threshold']:g}: caught {p['detection_rate']:.0%}{stalled}"
        at.setdefault((p["false_rollback_rate"], p["detection_delay_median"]), []).append(label)
    for xy, labels in at.items():
        curve.annotate("\n".join(labels), xy, xytext=(6, 0), textcoords="offset points", fontsize=8, va="center")
    curve.set_xlim(-0.02, max([0.1] + [x + 0.05 for x, _ in at]))  # a rate: never below 0
    curve.set_xlabel("false-rollback rate (healthy fleet, on the gates' evidence)")
    curve.set_ylabel(f"median detection delay, intervals ({fault})")
    curve.set_title(f"Operating curve of {gate}")
    thresholds = [p["threshold"] for p in points]
    for key, label in (("false_rollback_rate", "healthy: rolled back on evidence"),
                       ("deadline_rollback_rate", "healthy: ended by the progress deadline"),
                       ("detection_rate", f"{fault}: caught on evidence")):  # fmt: skip
        rates.plot(thresholds, [p[key] or 0.0 for p in points], "o-", label=label)
    rates.set_xlabel(f"{gate} threshold")
    rates.set_ylabel("share of seeds")
    rates.set_ylim(-0.05, 1.05)
    rates.legend(fontsize=8)
    rates.set_title("Rates by threshold")
    fig.tight_layout()
    with written_whole(path) as partial:
        fig.savefig(partial, dpi=120)
    plt.close(fig)


@click.command("simulate")
@click.option("--policy", "policy_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--scenario", type=click.Choice(sorted(SCENARIOS)), default="none", show_default=True)
@click.option("--seeds", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--max-intervals", default=80, show_default=True, type=click.IntRange(min=1))
@click.option("--drift", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The drift scenarios' worst-depth survival ECE added [default: the scenario's].")  # fmt: skip
@click.option("--workers", default=os.cpu_count() or 1, show_default=True, type=click.IntRange(min=1),
              help="Processes running seeds.")  # fmt: skip
@click.option("--regression", type=click.FloatRange(min=0), default=None,
              help="The latency scenario's slowdown of the treatment [default: the scenario's].")  # fmt: skip
@click.option("--table-gain", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Adaptive's treatment steps this fraction faster than its control's "
                   "(a fitted table that pays).")  # fmt: skip
@click.option("--late-onset", "late", type=click.IntRange(min=0), default=None,
              help="Start the scenario's change this many intervals after the rollout reaches the top of the ladder, "
                   "and run --max-intervals unless it rolls back [default: at the first canary interval].")  # fmt: skip
@click.option("--sweep", default=None, help="GATE=T1,T2,...: the operating curve of that gate (a faulty --scenario).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="PNG of the operating curve.")
@click.option("--fit", "fit_path", type=click.Path(exists=True, dir_okay=False), default=str(FIT_PATH),
              show_default=True, help="The fleet model fitted to the runtime (sparkgate simulate-fit).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def simulate(
    policy_path: str, scenario: str, seeds: int, max_intervals: int, drift: float | None, workers: int,
    regression: float | None, table_gain: float, late: int | None, sweep: str | None, plot_path: str | None,
    fit_path: str, as_json: bool,
) -> None:  # fmt: skip
    """Seeded simulated rollouts through the real controller: rollback and detection rates, delays."""
    policy, chosen, fleet = load_rollout_policy(policy_path), SCENARIOS[scenario], Fleet.fitted(fit_path)
    if drift is not None and chosen.drifting:
        if drift > (largest := max_drift(policy.gamma, fleet)):
            raise click.BadParameter(f"{drift:g}: this fleet model's largest is {largest:.3f}", param_hint="--drift")
        chosen = replace(chosen, ece=drift)
    if regression is not None and chosen.regression:
        chosen = replace(chosen, regression=regression)
    chosen = replace(chosen, table_gain=table_gain)
    if sweep is not None or plot_path is not None:
        if sweep is None or not chosen.faulty:
            raise click.UsageError("--sweep GATE=T1,T2,... and a faulty --scenario draw the operating curve")
        if plot_path:
            output_path(plot_path, "--plot")
        try:
            gate, thresholds = parse_sweep(sweep)
            points = operating_curve(policy, gate, thresholds, chosen, seeds, fleet, max_intervals, workers,
                                     lambda line: click.echo(line, err=True), late)  # fmt: skip
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if plot_path:
            plot(points, gate, chosen.name, plot_path)
        click.echo(json.dumps({"gate": gate, "scenario": chosen.name, "seeds": seeds, "late_onset": late,
                               "scenario_model": replace(chosen).__dict__, "operating_curve": points}))  # fmt: skip
        return
    started = time.perf_counter()
    runs = run_seeds(policy, chosen, seeds, fleet, max_intervals, workers,
                     lambda done: click.echo(f"simulate {scenario}: {done}", err=True), late)  # fmt: skip
    result = {
        **summarize(chosen, runs),
        "late_onset": late,
        "fleet": fleet.describe(),
        "scenario_model": replace(chosen).__dict__,
        "wall_s": round(time.perf_counter() - started, 1),
        "workers": workers,
    }
    click.echo(json.dumps(result) if as_json else json.dumps(result, indent=1))
