"""A replica process of ``sparkgate demo``: the runtime's own replica under a varying arrival rate.

Started by the demo as ``python -m controller.demo_member``. The serving loop is
``verify_runtime.replica.Replica`` unchanged (it follows the controller's
policy, posts step records, runs the consistency checks); this module adds what
a serving stack would otherwise supply around it:

- **Load.** Requests arrive as a Poisson process whose rate swings around
  ``--rate`` with period ``--period-s`` (replicas are offset by ``--offset``),
  so batch sizes, and with them the load buckets the latency gates compare,
  change over time. Arrivals beyond ``max_batch`` wait; past ``BACKLOG`` they
  are shed (counted), so an overloaded machine slows the demo, never wedges it.
- **Faults**, armed by ``--fault`` and fired by SIGUSR1: ``drift`` serves new
  requests at ``--drift-temperature`` (the drafter's confidences and their STS
  calibration were fitted on greedy traffic, so the survival ECE drifts);
  ``cost-table`` loads a cost table fitted on an accelerator, forced past the
  fingerprint check, with the graph tiers it was measured at: verification looks
  free to the scheduler, which verifies whole blocks, and every step over the
  table's 32-row tiers runs eager (a tier miss).
- **``/metrics``** on loopback: the collectors' series over the records this
  replica posted, the phase it serves, its arrival rate and shed requests.

This is the one controller module that imports the runtime (lazily, in the
child process); the controller service never imports it.
"""
from __future__ import annotations

import collections
import json
import logging
import math
import random
import signal
import time
from pathlib import Path
from typing import Callable, Iterator

import click
import httpx
from prometheus_client import Counter, Gauge, start_http_server

from collectors.batch import prepare
from collectors.metrics import Metrics
from collectors.wire import from_records

log = logging.getLogger("sparkgate.demo.replica")

FAULTS = ("none", "drift", "cost-table")
# Waiting requests kept beyond the running batch before new arrivals are shed.
BACKLOG = 64
WARMUP_REQUESTS = 8
# Every this many steps one live request's cache state is checked (as `sparkgate replica` does).
STATE_EVERY = 50
# Steps per Replica.serve call: between calls the loop applies faults and notices a stop.
SEGMENT_STEPS = 25
# A table measured on an accelerator: verifying a whole block costs about what one row does,
# so the scheduler verifies every draft, and that deployment captured graph tiers only up to
# 32 rows. The fingerprint names hardware this is not.
FOREIGN_COST_TABLE = {
    "bias_seconds": 0.006, "bs_probes": [1, 256], "alpha_seconds": [0.0, 0.002],
    "m_probes": [8, 32], "theta_seconds": [0.0, 0.0002],
    "meta": {"hardware": {"system": "Linux", "machine": "x86_64", "cpu": "Intel Xeon", "torch": "2.4.0+cu121",
                          "device": "NVIDIA A10G"},
             "model": "other-model", "tiers": [8, 16, 24, 32], "created_at": "2024-06-01T00:00:00+00:00",
             "version": "foreign-a10g"},
}


def swing(mean: float, amplitude: float, period_s: float, offset: float) -> Callable[[float], float]:
    """Requests per second at ``t`` seconds: ``mean`` swinging by ``amplitude`` (a fraction of it)."""
    if mean <= 0 or not 0 <= amplitude < 1 or period_s <= 0:
        raise ValueError(f"need rate > 0, 0 <= amplitude < 1, period > 0; got {mean}, {amplitude}, {period_s}")
    return lambda t: mean * (1 + amplitude * math.sin(2 * math.pi * (t / period_s + offset)))


class Arrivals:
    """The requests that have arrived by now, for ``Replica.serve``.

    ``next()`` hands out the oldest waiting request, or raises StopIteration when
    none is waiting: ``serve`` then steps the batch it has and asks again at the
    next step, which is exactly continuous batching under open-loop arrivals.
    """

    def __init__(self, source: Iterator, rate: Callable[[float], float], clock: Callable[[], float],
                 seed: int = 0, backlog: int = BACKLOG):
        self.source, self.rate, self.clock, self.backlog = source, rate, clock, backlog
        self.rng = random.Random(seed)
        self.start = clock()
        self.next_at = self.start + self._gap(self.start)
        self.waiting: collections.deque = collections.deque()
        self.temperature: float | None = None  # set: every request handed out from now on samples at it
        self.arrived = self.shed = 0

    def _gap(self, at: float) -> float:
        return self.rng.expovariate(max(self.rate(at - self.start), 1e-6))

    def _arrive(self) -> None:
        now = self.clock()
        while self.next_at <= now:
            self.arrived += 1
            if len(self.waiting) < self.backlog:
                self.waiting.append(next(self.source))
            else:
                self.shed += 1
            self.next_at += self._gap(self.next_at)

    def __iter__(self) -> "Arrivals":
        return self

    def __next__(self):
        self._arrive()
        if not self.waiting:
            raise StopIteration
        request = self.waiting.popleft()
        if self.temperature is not None:
            request.temperature = self.temperature
        return request

    def pending(self) -> bool:
        self._arrive()
        return bool(self.waiting)

    def until_next(self) -> float:
        return max(self.next_at - self.clock(), 0.0)


def tier_grid(table):
    """The graph tiers a replica captures: the rows its cost table was measured at (``meta.tiers``),
    so the table prices exactly the shapes the runtime runs; the runtime's default grid without them."""
    from verify_runtime.tiers import TierGrid

    return TierGrid(tuple(table.meta.tiers)) if table.meta.tiers else TierGrid()


class _Flags:
    """Set from signal handlers, read by the serving loop between segments."""

    stop = False
    fault = False


def _metered_client(url: str, metrics: Metrics):
    from verify_runtime.replica import ControllerClient

    class MeteredClient(ControllerClient):
        """Counts what it posted into this replica's Prometheus series."""

        def post_records(self, records):
            result = super().post_records(records)
            metrics.observe(prepare(from_records(records)), "replica")
            return result

    return MeteredClient(url)


def _fire(fault: str, node, arrivals: Arrivals, drift_temperature: float, out_dir: Path | None) -> str:
    """Apply the armed fault to the running replica; returns what was done, for the log."""
    if fault == "drift":
        arrivals.temperature = drift_temperature
        return f"drift: new requests sample at temperature {drift_temperature}"
    from policies.cost_model import FingerprintMismatch, load_cost_table
    from policies.cost_profile import hardware_fingerprint
    from policies.window import CostAwareScheduler
    from verify_runtime.profiler import step_version

    path = (out_dir or Path(".")) / "foreign_cost_table.json"
    path.write_text(json.dumps(FOREIGN_COST_TABLE, indent=2) + "\n")
    engine = node.engine
    try:
        table = load_cost_table(path, hardware=hardware_fingerprint(engine.device),
                                model=step_version(engine.model, engine.drafter))
        refused = "accepted"
    except FingerprintMismatch as exc:
        refused = f"refused ({exc}), forced"
        table = load_cost_table(path, force=True)
    node.scheduler = CostAwareScheduler(table)
    node.engine.runner.grid = tier_grid(table)
    node.engine.config.cost_table_version = table.meta.version
    if node.payload is not None and node.payload["phase"] != "fallback":
        node.engine.policy = node.scheduler
    return f"cost-table: {path} {refused}"


def _controller_policy(client, timeout_s: float) -> dict:
    """The controller's policy, waiting for the service to come up (the demo starts it after its replicas)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.policy()
        except httpx.HTTPError as exc:
            if time.monotonic() > deadline:
                raise click.ClickException(f"controller {client.url} unreachable for {timeout_s:.0f} s: {exc}")
            time.sleep(0.5)


def _warm_engine(replica_id: str, gamma: int, max_batch: int, seed: int):
    """(engine, cost table, where the table came from), after a few unrecorded steps: the first steps of a
    fresh process are slow, and the baseline the gates compare with must not be that cold start."""
    from verify_runtime.defaults import default_calibration, default_cost_table, default_drafter, default_target
    from verify_runtime.engine import Engine, EngineConfig
    from verify_runtime.replica import workload_requests

    target = default_target()
    drafter = default_drafter(target)
    table, source = default_cost_table(target, drafter)
    config = EngineConfig(gamma=gamma, max_batch=max_batch, replica_id=replica_id,
                          cost_table_version=table.meta.version or None)
    engine = Engine(target, drafter, config, calibrate=default_calibration(drafter), tiers=tier_grid(table))
    for request in workload_requests(f"{replica_id}-warmup", WARMUP_REQUESTS, 8, 0.0, seed):
        engine.submit(request)
    engine.run()
    engine.finished.clear()
    return engine, table, source


@click.command()
@click.option("--controller", "url", required=True, help="Controller base URL (waited for up to a minute).")
@click.option("--replica-id", required=True)
@click.option("--metrics-port", type=int, default=None,
              help="Serve /metrics on 127.0.0.1 at this port, once the replica is warm (a readiness signal).")
@click.option("--gamma", default=7, show_default=True, help="Must match the controller's policy.")
@click.option("--rate", default=6.0, show_default=True, help="Mean request arrivals per second.")
@click.option("--amplitude", default=0.6, show_default=True, help="Swing of the rate, as a fraction of it.")
@click.option("--period-s", default=20.0, show_default=True, help="Seconds per load cycle.")
@click.option("--offset", default=0.0, show_default=True, help="Where in the cycle this replica starts (0-1).")
@click.option("--max-batch", default=16, show_default=True)
@click.option("--max-new-tokens", default=48, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--fault", type=click.Choice(FAULTS), default="none", show_default=True,
              help="Fault to fire on SIGUSR1.")
@click.option("--drift-temperature", default=3.0, show_default=True)
@click.option("--out-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the cost-table fault writes the foreign table.")
@click.option("--threads", default=1, show_default=True, help="Torch threads (replicas share the machine).")
def member(url, replica_id, metrics_port, gamma, rate, amplitude, period_s, offset, max_batch, max_new_tokens,
           seed, fault, drift_temperature, out_dir, threads):
    """Serve the mixed workload under a varying arrival rate, following the controller; JSON counters at exit."""
    import torch

    from policies.window import CostAwareScheduler
    from verify_runtime.consistency import GreedyReplay
    from verify_runtime.replica import Replica, workload_requests

    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {replica_id} %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the log
    torch.set_num_threads(threads)
    flags = _Flags()
    signal.signal(signal.SIGTERM, lambda *_: setattr(flags, "stop", True))
    signal.signal(signal.SIGINT, lambda *_: setattr(flags, "stop", True))
    signal.signal(signal.SIGUSR1, lambda *_: setattr(flags, "fault", True))

    engine, table, table_source = _warm_engine(replica_id, gamma, max_batch, seed)
    metrics = Metrics()
    arrival_rate = Gauge("sparkgate_replica_arrival_rate", "Mean request arrivals per second now.",
                         registry=metrics.registry)
    shed = Counter("sparkgate_replica_shed_requests_total", "Arrivals dropped with the backlog full.",
                   registry=metrics.registry)
    if metrics_port is not None:
        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
    client = _metered_client(url, metrics)
    _controller_policy(client, 60.0)
    engine.step_id = client.next_step_id(replica_id)
    replay = GreedyReplay(engine.model, engine.drafter, gamma)
    node = Replica(engine, client, CostAwareScheduler(table), replay=replay, state_every=STATE_EVERY)
    node.poll(force=True)  # raises with a clear message when the policy's gamma is not this replica's
    load = swing(rate, amplitude, period_s, offset)
    arrivals = Arrivals(workload_requests(replica_id, 0, max_new_tokens, 0.0, seed), load, time.monotonic, seed)
    log.info("serving (cost table: %s; fault armed: %s)", table_source, fault)
    counted_shed = 0
    try:
        while not flags.stop:
            if flags.fault and fault != "none":
                log.info("fault fired: %s", _fire(fault, node, arrivals, drift_temperature, out_dir))
                fault = "none"
            arrival_rate.set(load(time.monotonic() - arrivals.start))
            if arrivals.pending() or engine.active or engine.queue:
                node.serve(arrivals, max_steps=node.stats["steps"] + SEGMENT_STEPS)
            else:
                node.poll()
                time.sleep(min(arrivals.until_next(), 0.05))
            shed.inc(arrivals.shed - counted_shed)
            counted_shed = arrivals.shed
            metrics.set_phase(node.payload["phase"])
    finally:
        try:
            node.flush()
        except httpx.HTTPError as exc:  # the controller went first: what it has is what the demo reports
            log.warning("final flush failed: %s", exc)
        client.close()
    click.echo(json.dumps({"replica_id": replica_id, "arrived": arrivals.arrived, "shed": arrivals.shed,
                           **node.stats}))


if __name__ == "__main__":
    member()
