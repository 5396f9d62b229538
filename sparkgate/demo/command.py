"""``sparkgate demo``: a local fleet walks the whole rollout, takes a fault, and falls back by itself.

The demo starts three replica processes running the real runtime on the
default models (``sparkgate replica`` with an arrival process) under a mixed workload whose
arrival rate swings over time, waits for them to warm up, then starts the
controller service (``sparkgate serve``: policy and ingest API, gates, the
DuckDB file). It watches the controller walk ``baseline -> shadow -> canary
(5% -> 25% -> 50%) -> compact -> adaptive`` on evidence alone, printing a live
phase line and the gate table of every decision. Once the top of the ladder has
passed an interval it fires the fault on ``replica-c`` and waits for the
automatic fallback; ``--fault load-shift`` instead changes every replica's step
cost once adaptive has run ``Plan.shift_after_intervals`` and watches adaptive
refit its tables and hold. Then it stops the fleet, reads the figures back from the DuckDB file, exports Parquet
for the dashboard, and prints the summary (``--json``: one JSON object on
stdout; progress stays on stderr).

Exit status 0 when the run went as the scenario says (fallback after the fault;
the top held with ``--fault none`` or through ``load-shift``), 1 otherwise; the
summary says why.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import httpx
import yaml

from sparkgate.collectors.store import Store
from sparkgate.controller.gates import Verdict, interval_outcome, verdict_table
from sparkgate.policies.rollout import RolloutPolicy, load_rollout_policy
from sparkgate.policies.vocabulary import CHANGES_POLICY, Action

from .fleet import Fleet, FleetError, answers, free_port
from .summary import describe_verdict, failing, render, stage_label, summarize

DEMO_POLICY = Path(__file__).with_name("demo_rollout.yaml")
MARKER = ".sparkgate-demo"
# (replica id, mean arrivals per second). replica-c takes the fault, and the most traffic,
# as the busiest replica of a fleet tends to be the one whose drift matters.
REPLICAS = (("replica-a", 5.0), ("replica-b", 5.0), ("replica-c", 10.0))
FAULTY = "replica-c"
FAULT_TEXT = {
    "drift": "{r} now samples new requests at temperature {t} (it was greedy)",
    "cost-table": "{r} now runs with a cost table and graph tiers from an accelerator (forced)",
    "slow-verify": "{r} now verifies {x:.0%} slower in treatment epochs (control epochs untouched)",
    "load-shift": "every replica now gets 384-token prompts, not 96 (each step costs more: the table is stale)",
}
# Faults every replica takes at once (a fleet-wide change, not one bad replica).
FLEET_FAULTS = ("load-shift",)


@dataclass(frozen=True)
class FaultSize:
    """How large the faults that have a size are: passed to each replica as its flags of these names,
    with the replica's own defaults (``verify_runtime.faults.FaultSize``; a test keeps them equal)."""

    drift_temperature: float = 3.0
    slow_verify_extra: float = 0.25


def takes_fault(replica_id: str, fault: str) -> bool:
    """Whether ``replica_id`` is armed with ``fault`` and signalled when it fires."""
    return replica_id == FAULTY or fault in FLEET_FAULTS


@dataclass(frozen=True)
class Plan:
    """Timing of one run. Intervals are the policy's; everything else counts in intervals."""

    interval_s: float
    period_s: float  # load cycle of each replica
    fault_after_passes: int = 1  # passing intervals at the top of the ladder before the fault fires
    shift_after_intervals: int = 6  # a load shift waits this long in adaptive, so a fitted table is in force
    # Waiting this long for the fallback means the gates missed it. In adaptive a comparison guard's first
    # failure reverts the fitted tables, and the guard must gather its pairs again on the static ones.
    fault_timeout_intervals: int = 70
    shift_intervals: int = 12  # a load shift: intervals adaptive must hold through (and refit in)
    linger_intervals: int = 2  # traffic kept flowing after the last transition, so it shows in the figures
    hold_s: float = 0.0  # longer than the linger: the top of the ladder measured for longer (more switchback pairs)
    deadline_s: float = 540.0  # the whole run, so a wedged machine never leaves the demo hanging


def demo_policy(path: Path | None, quick: bool) -> RolloutPolicy:
    """The policy to run: ``path`` as written, or the demo policy (``quick``: shorter intervals, fewer passes)."""
    if path is not None:
        return load_rollout_policy(path)
    policy = load_rollout_policy(DEMO_POLICY)
    return policy.replace(evaluation_interval_s=2.0, consecutive_passes=2) if quick else policy


def prepare_out(out: Path) -> None:
    """Empty ``out`` for this run; refuse a non-empty directory an earlier demo did not make."""
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise click.UsageError(f"--out {out}: not empty and not made by sparkgate demo; pick another directory")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by sparkgate demo; emptied by the next run\n")


class Watch:
    """Follows the controller: prints each decision's gate table and a live phase line on stderr."""

    def __init__(self, url: str, policy: RolloutPolicy, t0: float, deadline_s: float):
        self.url, self.policy, self.t0, self.deadline_s = url, policy, t0, deadline_s
        self.http = httpx.Client(base_url=url, timeout=10.0)
        self.tty = sys.stderr.isatty()
        self.seen: set[tuple] = set()
        self.since: float | None = None
        self.last_line_at = 0.0
        self.status: dict = {}
        self.stage = ""  # label of the stage in force, from the decisions seen

    def close(self) -> None:
        self.http.close()

    def say(self, text: str) -> None:
        click.echo(("\r\x1b[K" if self.tty else "") + text, err=True)

    def poll(self) -> dict:
        """Fetch the status and the decisions since the last poll; print what happened."""
        self.status = self.http.get("/v1/status").raise_for_status().json()
        params = {"limit": 1000, **({"since": self.since} if self.since is not None else {})}
        for d in self.http.get("/v1/decisions", params=params).raise_for_status().json():
            key = (d["decided_at"], d["revision"], d["action"], d["outcome"])
            if key not in self.seen:
                self.seen.add(key)
                self.since = d["decided_at"]
                self._decision(d)
        self._line()
        return self.status

    def _decision(self, d: dict) -> None:
        at = f"{d['decided_at'] - self.t0:6.1f}s"
        rule, verdicts = d["reasons"][0], d["reasons"][1:]
        to = stage_label(d["phase_to"], d["compact_fraction"])
        if d["action"] in CHANGES_POLICY:
            came = f"{self.stage} -> " if self.stage else ""
            self.stage = to
            self.say(f"{at}  {d['action'].upper():<8} {came}{to} (revision {d['revision']}): {rule['rule']}")
            if verdicts:
                self.say(verdict_table(verdicts))
        elif d["action"] == Action.PUBLISH_TABLE:
            self.say(
                f"{at}  TABLE    {rule['version']} for group {rule['group']}: held-out step-time error "
                f"{rule['error_current']:.0%} -> {rule['error_candidate']:.0%}"
            )
        elif d["outcome"] == "fail" and d["phase_to"] != "fallback":  # fallback judges for the record only
            count = f"failure {rule.get('failures', '?')}, {self.policy.failure_limit} tolerated"
            self.say(
                f"{at}  interval failed in {to} ({count}): "
                + "; ".join(describe_verdict(v) for v in failing(d["reasons"]))
            )

    def _line(self) -> None:
        s, now = self.status, time.time()
        if not self.tty and now - self.last_line_at < 10:
            return
        self.last_line_at = now
        policy = s["policy"]
        gates = {g["gate"]: g for g in s["gates"]}
        figures = "  ".join(
            f"{name} {gates[key]['value']:.3f}"
            for name, key in (("ECE", "survival_ece"), ("util", "upper_bound_utilization"))
            if key in gates and gates[key]["value"] is not None
        )
        last = interval_outcome(Verdict(**g) for g in s["gates"]) if s["gates"] else "-"
        stage = stage_label(policy["phase"], policy["compact_fraction"])
        line = (
            f"[{now - self.t0:5.0f}s/{self.deadline_s:.0f}s] {stage}  rev {policy['revision']}"
            f"  passes {s['passes']}/{s['needed_passes']}"
            f"  failures {s['failures']}/{s['failure_limit']}  last interval: {last}  {figures}"
            f"  steps {self._steps():,}"
        )
        if self.tty:
            click.echo("\r\x1b[K" + line, err=True, nl=False)
        else:
            click.echo(line, err=True)

    def _steps(self) -> int:
        text = self.http.get("/metrics").text
        match = re.search(r"^sparkgate_ingested_steps_total (\S+)$", text, re.M)
        return int(float(match.group(1))) if match else 0


def _scenario(fleet: Fleet, watch: Watch, plan: Plan, fault: str, size: FaultSize) -> tuple[float | None, str, bool]:
    """Drive the run to its end; returns (when the fault fired, outcome text, whether it went as designed)."""
    fault_at = None
    top = len(watch.policy.stages()) - 1
    top_name = watch.policy.stages()[top].phase
    settled_at = None  # when the scenario reached its final state; lingers after that
    outcome, ok = "", False
    while True:
        time.sleep(0.5)
        fleet.check()
        status = watch.poll()
        now, phase = time.time(), status["policy"]["phase"]
        if now - watch.t0 > plan.deadline_s:
            return fault_at, f"stopped at the {plan.deadline_s:.0f} s deadline in {phase}", False
        if settled_at is None:
            if phase == "fallback":
                settled_at = now
                ok = fault_at is not None and fault not in FLEET_FAULTS
                outcome = "fell back automatically after the fault" if fault_at else "fell back before the fault"
            elif (
                fault in FLEET_FAULTS
                and fault_at is not None
                and now - fault_at > plan.shift_intervals * plan.interval_s
            ):
                settled_at, outcome, ok = now, f"{top_name} held through the {fault}", status["stage"] == top
            elif status["stage"] == top and status["passes"] >= plan.fault_after_passes:
                if fault == "none" and status["passes"] >= watch.policy.consecutive_passes:
                    settled_at, outcome, ok = now, f"{top_name} held with no fault", True
                elif (
                    fault != "none"
                    and fault_at is None
                    and (
                        fault not in FLEET_FAULTS
                        or now - status["entered_at"] >= plan.shift_after_intervals * plan.interval_s
                    )
                ):
                    for name in [r for r, _ in REPLICAS if takes_fault(r, fault)]:
                        fleet.signal(name, signal.SIGUSR1)
                    fault_at = time.time()
                    watch.say(
                        f"{fault_at - watch.t0:6.1f}s  FAULT    "
                        + FAULT_TEXT[fault].format(r=FAULTY, t=size.drift_temperature, x=size.slow_verify_extra)
                    )
            if (
                fault_at is not None
                and settled_at is None
                and fault not in FLEET_FAULTS
                and now - fault_at > plan.fault_timeout_intervals * plan.interval_s
            ):
                return fault_at, f"the gates did not catch the {fault} fault", False
        elif now - settled_at >= max(plan.linger_intervals * plan.interval_s, plan.hold_s):
            return fault_at, outcome, ok


def run_demo(
    out: Path, fault: str, quick: bool, policy_path: Path | None, size: FaultSize = FaultSize(), hold_s: float = 0.0
) -> dict:
    """One demo run; returns the JSON summary (``ok`` says whether it went as the scenario says). ``hold_s``
    keeps the fleet running that long after the scenario settles (the deadline grows by as much)."""
    started = time.time()
    policy = demo_policy(policy_path, quick)  # a bad policy file is refused before the last run's out is emptied
    prepare_out(out)
    policy_file = out / "rollout.yaml"
    policy_file.write_text(yaml.safe_dump(policy.to_dict(), sort_keys=False))
    period_s, deadline_s = (20.0, 320.0) if quick else (30.0, 540.0)
    plan = Plan(policy.evaluation_interval_s, period_s, hold_s=hold_s, deadline_s=deadline_s + hold_s)
    db = out / "demo.duckdb"
    fault_at, outcome, ok = None, "interrupted", False
    with Fleet(out / "logs") as fleet:
        click.echo(
            f"sparkgate demo: {len(REPLICAS)} replicas and a controller on 127.0.0.1, fault: {fault}; "
            f"logs in {out / 'logs'}",
            err=True,
        )
        port, metrics_ports = free_port(), {replica_id: free_port() for replica_id, _ in REPLICAS}
        url = f"http://127.0.0.1:{port}"
        # Replicas first: each loads the models and warms up, then opens /metrics and waits for the
        # controller, so the rollout's baseline starts with the whole fleet warm.
        for i, (replica_id, rate) in enumerate(REPLICAS):
            fleet.replica(
                replica_id,
                url,
                gamma=policy.gamma,
                wait_s=60,
                rate=rate,
                offset=i / len(REPLICAS),
                period_s=plan.period_s,
                seed=1000 * i,
                metrics_port=metrics_ports[replica_id],
                out_dir=out,
                spool_dir=out / "spool" / replica_id,  # a run's spool is its own, never a former run's
                fault=fault if takes_fault(replica_id, fault) else None,
                **asdict(size),
            )
        fleet.wait(
            lambda: all(answers(f"http://127.0.0.1:{p}/metrics") for p in metrics_ports.values()),
            300.0,
            "the replicas to load the models and warm up",
            *metrics_ports,
        )
        fleet.controller(db, policy_file, port)
        watch = Watch(url, policy, started, plan.deadline_s)
        try:
            click.echo(f"watch it live: sparkgate dashboard --db {db} --policy {policy_file}", err=True)
            fault_at, outcome, ok = _scenario(fleet, watch, plan, fault, size)
        except KeyboardInterrupt:
            watch.say("interrupted: stopping the fleet")
        finally:
            watch.close()
            ended = time.time()
            click.echo(("\n" if watch.tty else "") + "stopping the fleet", err=True)
    with Store(db) as store:
        summary = summarize(store, started, ended, fault, fault_at, policy)
        exported = store.export(out / "parquet")
        store.snapshot(out / "snapshot")
    summary.update(
        {
            "ok": ok,
            "outcome": outcome,
            "wall_s": round(time.time() - started, 1),
            "db": str(db),
            "parquet": str(out / "parquet"),
            "snapshot": str(out / "snapshot"),
            "exported_rows": exported,
            "policy": str(policy_file),
            "dashboard": f"sparkgate dashboard --db {db} --policy {policy_file}",
        }
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


@click.command()
@click.option(
    "--fault",
    type=click.Choice(["drift", "cost-table", "slow-verify", "load-shift", "none"]),
    default="drift",
    show_default=True,
    help="drift: a replica's sampling temperature changes; cost-table: a replica schedules with a "
    "cost table from other hardware; slow-verify: a replica's treatment verification gets slower "
    "(--slow-verify-extra); "
    "load-shift: every replica's steps get costlier, adaptive must refit and hold; "
    "none: the rollout ends at the top of the ladder (adaptive).",
)
@click.option("--quick", is_flag=True, help="Shorter intervals and fewer passes (about a minute; for CI).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object on stdout.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("sparkgate-demo"),
    show_default=True,
    help="Directory for the DuckDB file, Parquet, logs (emptied first).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Rollout policy YAML [default: the demo's own demo_rollout.yaml].",
)
@click.option(
    "--drift-temperature",
    default=FaultSize.drift_temperature,
    show_default=True,
    # The demo's replicas serve greedy: a drift to temperature 0 would change nothing for the gates to catch.
    type=click.FloatRange(min=0, min_open=True),
    help="Temperature of the drift fault.",
)
@click.option(
    "--slow-verify-extra",
    default=FaultSize.slow_verify_extra,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="How much slower the slow-verify fault makes treatment verification (0.25: 25%).",
)
@click.option(
    "--hold-s",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Keep the fleet running this many seconds after the scenario settles: the last stage's "
    "switchback comparisons gather that many more pairs (the run's deadline grows by as much).",
)
def demo(fault, quick, as_json, out, policy_path, drift_temperature, slow_verify_extra, hold_s):
    """Run a local fleet through the whole rollout, inject a fault, and show the automatic fallback."""

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a terminated demo still stops its fleet
    try:
        size = FaultSize(drift_temperature, slow_verify_extra)
        summary = run_demo(out.resolve(), fault, quick, policy_path, size, hold_s)
    except FleetError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(render(summary))
        click.echo(f"\n{'OK' if summary['ok'] else 'NOT AS PLANNED'}: {summary['outcome']} ({summary['wall_s']:.0f} s)")
        click.echo(
            f"DuckDB file: {summary['db']}\nParquet export: {summary['parquet']}\n"
            f"Open the dashboards: {summary['dashboard']}"
        )
    if not summary["ok"]:
        sys.exit(1)
