"""``sparkgate simulate``: seeded rollouts through the real controller, deterministic per seed; a healthy
fleet climbs the ladder and a calibration drift is caught after its onset."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.synth import worst_depth_ece
from sparkgate.controller.simulate import Run, run_seed, run_seeds, summarize
from sparkgate.controller.simulate_fleet import SCENARIOS, Fleet, drift_scale
from sparkgate.policies.rollout import DEFAULT_PATH, parse_rollout_policy
from sparkgate.policies.vocabulary import Arm, Phase

# Calibration, tier and consistency gates: what this fleet model feeds quickly (comparisons need many
# epoch pairs).
POLICY = {
    "phases": ["baseline", "shadow", "canary", "compact"],
    "canary_steps": [0.5],
    "consecutive_passes": 2,
    "failure_limit": 0,
    "gates": [
        # A pass needs the plug-in ECE's bound under the threshold: enough labels that its noise floor is small.
        {"metric": "survival_ece_debiased", "threshold": 0.025, "direction": "at_most", "min_samples": 4000},
        {"metric": "survival_ece_debiased_replica", "threshold": 0.035, "direction": "at_most", "min_samples": 2000},
        {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most", "min_samples": 100},
        {"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True},
    ],
}
FLEET = Fleet(steps_per_s=2.0)


def test_a_seed_gives_the_same_rollout_every_time_in_one_process_or_in_worker_processes():
    # Each seed runs twice: in this process, seed 1 after seed 0, and in a worker process. Equal runs mean
    # a run is its seed's alone: nothing carries over from the run before, and nothing depends on the process.
    policy = parse_rollout_policy(POLICY)
    alone = run_seeds(policy, SCENARIOS["drift-one"], 2, FLEET, 12, workers=1)
    assert [r.intervals > 0 for r in alone] == [True, True]
    assert run_seeds(policy, SCENARIOS["drift-one"], 2, FLEET, 12, workers=2) == alone


def test_a_healthy_fleet_climbs_and_a_drift_on_every_replica_is_caught_after_its_onset():
    policy = parse_rollout_policy(POLICY)
    healthy = [run_seed(policy, SCENARIOS["none"], seed, FLEET, 30) for seed in range(2)]
    assert all(r.rollback is None and r.compact_at is not None for r in healthy)
    assert summarize(SCENARIOS["none"], healthy)["rollback_rate"] == 0.0
    drifting = [run_seed(policy, SCENARIOS["drift-all"], seed, FLEET, 30) for seed in range(2)]
    found = summarize(SCENARIOS["drift-all"], drifting)
    assert found["detection_rate"] == 1.0 and found["rolled_back_before_onset"] == 0
    assert [r["seed"] for r in found["rollbacks"]] == [0, 1]  # each replayable by its seed
    assert found["detection_delay_intervals"]["p95"] <= 5


def test_delays_count_the_intervals_since_the_fault_began_and_the_horizon_is_reported():
    # The fault begins with interval 6's records (index 6); the tick that ends that interval is the first
    # that can see it, one interval after the onset: a delay of 1, not 0. So is the ladder's top reached in
    # the 17th interval when its tick is index 16.
    caught_first = Run(onset=6, rollback=6, rollback_rule="failure limit", rollback_gates=("a", "b"), intervals=7)
    caught_next = Run(onset=6, rollback=7, rollback_rule="failure limit", rollback_gates=("a",), intervals=8)
    never_reached = Run(onset=None, intervals=6, cut=True)  # ran out of intervals before the onset
    missed = Run(onset=6, compact_at=16, intervals=40, cut=True)
    found = summarize(SCENARIOS["drift-all"], [caught_first, caught_next, never_reached, missed])
    assert found["detection_delay_intervals"] == {"median": 1.5, "p95": 1.95}
    assert found["detected_within"] == {"1": 0.25, "3": 0.5, "5": 0.5}
    assert found["rollbacks"] == [{"seed": 0, "interval": 7, "rule": "failure limit", "gates": ["a", "b"]},
                                  {"seed": 1, "interval": 8, "rule": "failure limit", "gates": ["a"]}]  # fmt: skip
    assert found["rollbacks_by_gate"] == {"a": 2, "b": 1}  # which gate caught the fault, not only whether
    assert found["intervals_to_top_of_ladder"] == {"median": 17.0, "reached": 1}
    assert (found["reached_onset"], found["ended_at_max_intervals"]) == (3, 2)
    assert found["intervals_per_seed"] == {"median": 7.5, "max": 40}


def test_the_command_prints_the_rates_as_json():
    # The shipped policy on the fleet fitted to the runtime (the command's default; this file's POLICY is
    # tuned to the calibrated FLEET, and the fitted one's worst depth is beyond its 0.025).
    result = CliRunner().invoke(main, ["simulate", "--policy", str(DEFAULT_PATH), "--scenario", "none", "--seeds", "1",
                                       "--max-intervals", "6", "--json", "--workers", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(result.output.strip().splitlines()[-1])
    assert body["scenario"] == "none" and body["seeds"] == 1 and "inconclusive_share" in body
    # A healthy fleet over six intervals: judged, never failed, never rolled back.
    assert body["failed_intervals"] == 0 and body["failed_share"] == 0 and body["rollback_rate"] == 0
    assert 0 <= body["inconclusive_share"] < 1


def test_the_operating_curve_trades_false_rollbacks_for_detection_and_is_drawn(tmp_path):
    import yaml

    # The command's fleet is fitted to the runtime, whose own worst depth sits near 0.045: levels above it.
    fitted = {
        **POLICY,
        "gates": [
            {**g, "threshold": 0.08} if g["metric"] == "survival_ece_debiased" else g
            for g in POLICY["gates"]
            if g["metric"] != "survival_ece_debiased_replica"
        ],
    }
    fitted["gates"].append(
        {"metric": "survival_ece_debiased_replica", "threshold": 0.09, "direction": "at_most", "min_samples": 300}
    )
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(fitted))
    png = tmp_path / "curve.png"
    argv = ["simulate", "--policy", str(path), "--scenario", "drift-one", "--seeds", "1", "--max-intervals", "20",
            "--sweep", "survival_ece_debiased_replica=0.09,0.5", "--plot", str(png), "--workers", "1"]  # fmt: skip
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    points = {p["threshold"]: p for p in json.loads(result.output.strip().splitlines()[-1])["operating_curve"]}
    assert points[0.09]["false_rollback_rate"] == 0.0 and points[0.09]["detection_rate"] == 1.0
    assert points[0.5]["detection_rate"] == 0.0  # too loose to see the drift
    assert png.stat().st_size > 5_000
    bad = CliRunner().invoke(
        main, ["simulate", "--policy", str(path), "--scenario", "none", "--sweep", "survival_ece=1"]
    )
    assert bad.exit_code != 0 and "faulty --scenario" in bad.output
    unknown = CliRunner().invoke(
        main, ["simulate", "--policy", str(path), "--scenario", "drift-one", "--sweep", "nope=1"]
    )
    assert unknown.exit_code != 0 and "no gate of that name" in unknown.output
    (tmp_path / "file").write_text("a regular file")
    sweep = ["--scenario", "drift-one", "--sweep", "survival_ece=1", "--plot", str(tmp_path / "file" / "curve.png")]
    unwritable = CliRunner().invoke(main, ["simulate", "--policy", str(path), *sweep])
    assert unwritable.exit_code == 2 and "Invalid value for '--plot'" in unwritable.output
    assert "seeds" not in unwritable.output  # refused before the sweep ran a seed


def test_a_sweep_runs_the_late_onset_it_was_given_and_a_drift_no_scale_makes_is_refused(monkeypatch):
    # --sweep ignored --late-onset and drew an early onset's curve; a --drift past the largest the fleet's
    # confidences can drift was capped there while the output reported the size asked for.
    from sparkgate.controller import simulate as module

    asked = []

    def fake(policy, scenario, seeds, fleet, max_intervals, workers=1, progress=None, late=None):
        asked.append((scenario.name, late))
        return [Run(intervals=1)]

    monkeypatch.setattr(module, "run_seeds", fake)
    argv = ["simulate", "--policy", str(DEFAULT_PATH), "--scenario", "drift-all", "--seeds", "1", "--late-onset", "20",
            "--sweep", "survival_ece_drift=0.03"]  # fmt: skip
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert asked == [("none", 20), ("drift-all", 20)]
    body = json.loads(result.output.strip().splitlines()[-1])
    assert body["late_onset"] == 20 and body["scenario_model"]["ece"] == 0.05
    capped = CliRunner().invoke(main, ["simulate", "--policy", str(DEFAULT_PATH), "--scenario", "drift-all",
                                       "--drift", "0.5", "--seeds", "1"])  # fmt: skip
    assert (
        capped.exit_code == 2 and "Invalid value for --drift: 0.5: this fleet model's largest is 0.26" in capped.output
    )


def test_the_drift_scenarios_are_sized_in_worst_depth_ece():
    for fleet in (Fleet(), Fleet.fitted()):  # calibrated, and as calibrated as the runtime was
        base = worst_depth_ece(1.0, 7, model=fleet.runtime)
        for ece in (0.05, 0.10):
            drifted = worst_depth_ece(drift_scale(ece, 7, fleet), 7, model=fleet.runtime)
            assert drifted - base == pytest.approx(ece, abs=2e-3)
        assert drift_scale(0.10, 7, fleet) > drift_scale(0.05, 7, fleet) > 1.0
    assert worst_depth_ece(1.0, 7) < 1e-3 < 0.02 < worst_depth_ece(1.0, 7, model=Fleet.fitted().runtime)


@pytest.mark.parametrize("name, rule", [("tier-misses", "failure limit"), ("consistency", "critical gate failed")])
def test_tier_misses_and_a_consistency_mismatch_in_the_treatment_are_caught(name, rule):
    policy = parse_rollout_policy(POLICY)
    run = run_seed(policy, SCENARIOS[name], 0, FLEET, 20)
    assert run.onset is not None and run.rollback is not None and run.rollback >= run.onset
    assert run.rollback_rule == rule
    assert run.failed == (1 if rule == "failure limit" else 0)  # failure_limit 0; a critical interval is not "fail"


@pytest.mark.parametrize("name", ["load-swing", "stops-reporting"])
def test_a_load_swing_or_a_replica_that_stops_reporting_is_no_fault(name):
    policy = parse_rollout_policy(POLICY)
    run = run_seed(policy, SCENARIOS[name], 0, FLEET, 20)
    assert run.onset is not None and run.rollback is None and run.compact_at is not None


def test_a_late_onset_starts_the_fault_that_many_intervals_into_the_top_of_the_ladder_and_is_caught_after_it():
    policy = parse_rollout_policy(POLICY)
    run = run_seed(policy, SCENARIOS["consistency"], 0, FLEET, 30, late=3)
    assert run.compact_at is not None and run.onset == run.compact_at + 4  # the fourth interval at the top
    assert run.rollback is not None and run.rollback >= run.onset and run.rollback_rule == "critical gate failed"
    held = run_seed(policy, SCENARIOS["none"], 0, FLEET, 20, late=3)
    assert held.rollback is None and held.intervals == 20  # a late onset runs the whole horizon


def test_adaptive_control_epochs_serve_compact_as_a_replica_does_and_earlier_control_epochs_static():
    from sparkgate.collectors.schema import MODES
    from sparkgate.controller.simulate_fleet import _modes

    static = tuple(1.0 if str(m) == "static" else 0.0 for m in MODES)
    for phase in (Phase.CANARY, Phase.COMPACT):
        assert _modes(phase, 1.0, 0.05, Arm.CONTROL) == static
        assert _modes(phase, 1.0, 0.05, Arm.TREATMENT) != static
    assert _modes(Phase.ADAPTIVE, 1.0, 0.05, Arm.CONTROL) == _modes(Phase.ADAPTIVE, 1.0, 0.05, Arm.TREATMENT)
    assert _modes(Phase.ADAPTIVE, 1.0, 0.05, Arm.CONTROL) != static


@pytest.mark.parametrize("gain", [0.0, 0.25])
def test_a_table_gain_speeds_adaptive_treatment_steps_alone(gain):
    from sparkgate.collectors.store import Store
    from sparkgate.controller.simulate_fleet import T0, emit_interval
    from sparkgate.controller.supervisor import Controller

    policy = parse_rollout_policy({**POLICY, "phases": ["baseline", "shadow", "adaptive"]})
    scenario, rng, now, step = replace(SCENARIOS["none"], table_gain=gain), np.random.default_rng(0), [T0], [0]
    with Store(":memory:", threads=1) as store:
        ctl = Controller(store, policy, clock=lambda: now[0], resamples=20)
        adaptive = 0
        for _ in range(40):
            emit_interval(store, ctl, FLEET, scenario, rng, now[0], step, False)
            now[0] += policy.evaluation_interval_s
            ctl.tick()
            adaptive += ctl.state.phase == Phase.ADAPTIVE
            if adaptive > 4:
                break
        assert adaptive > 4
        cpu = store.query(
            "SELECT arm, avg(step_cpu_ms) AS ms FROM steps WHERE phase = 'adaptive' GROUP BY arm ORDER BY arm"
        ).to_pydict()
    assert cpu["arm"] == ["control", "treatment"]
    assert cpu["ms"][0] / cpu["ms"][1] == pytest.approx(1 + gain, rel=0.08)


def test_a_healthy_rollout_the_deadline_ended_is_a_stall_on_the_curve_not_a_false_rollback():
    """A threshold too strict to pass keeps a healthy gate inconclusive until the progress deadline: that
    rolled back 10 of 16 healthy seeds at survival_ece_drift 0.01, none of them on a failure."""
    from sparkgate.controller.simulate import Run, curve_point, summarize
    from sparkgate.controller.simulate_fleet import SCENARIOS

    healthy = [Run(rollback=65, rollback_rule="progress deadline"), Run(rollback=30, rollback_rule="failure limit"),
               Run(), Run()]  # fmt: skip
    fault = [Run(onset=5, rollback=7, rollback_rule="failure limit")] * 4
    point = curve_point(0.01, summarize(SCENARIOS["none"], healthy), summarize(SCENARIOS["drift-all"], fault))
    assert (point["false_rollback_rate"], point["deadline_rollback_rate"]) == (0.25, 0.25)
    assert (point["detection_rate"], point["detection_delay_median"]) == (1.0, 3.0)
