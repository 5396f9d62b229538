"""``sparkgate replica``: serve the mixed workload with the runtime, following a controller's policy.

The serving loop is ``replica.Replica`` (it follows the policy, posts step
records, runs the consistency checks). Around it this command supplies what a
serving stack otherwise would, so it doubles as a load generator to point at
any controller:

- **Load.** Without ``--rate`` the replica serves ``--requests`` requests (0:
  until stopped) as fast as its batch allows, a closed loop. With ``--rate``
  requests arrive open-loop (``arrivals.Arrivals``) at a rate that swings with
  ``--amplitude`` and ``--period-s``, replicas offset by ``--offset``.
- **Faults**, armed by ``--fault`` and fired by SIGUSR1 (``faults``).
- **``/metrics``** on 127.0.0.1 with ``--metrics-port``: the collectors' series
  over the records this replica posted, the phase it serves, its arrival rate
  and shed requests. It starts once the engine is warm, so it doubles as a
  readiness signal.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import httpx
from prometheus_client import Counter, Gauge, start_http_server

from sparkgate.collectors.metrics import Metrics
from sparkgate.policies.cli_types import HttpUrl
from sparkgate.policies.outputs import output_path
from sparkgate.policies.window import CostAwareScheduler, FixedWindow, WindowPolicy

from .admission import positions_needed
from .arrivals import Arrivals, swing
from .cli_checks import SEED, RecordId, check_gamma, check_positions, workload_prompt_len
from .consistency import GreedyReplay
from .controller_client import MeteredClient, wait_for_policy
from .drafters import Drafter
from .engine import Engine, EngineConfig, Request
from .faults import LOAD_SHIFT_PROMPT_LEN, SLOW_VERIFY_EXTRA, Fault, FaultSize, fire
from .model import Transformer
from .replica import Replica, workload_requests
from .spool import Spool, left_behind
from .tiers import measured_grid

log = logging.getLogger("sparkgate.replica")
WARMUP_REQUESTS = 8
# Steps per Replica.serve call: between calls the loop fires faults and notices a stop.
SEGMENT_STEPS = 25


@dataclass
class Flags:
    """Set from signal handlers, read by the serving loop between segments."""

    stop: bool = False
    fault: bool = False


def warm_engine(
    replica_id: str,
    target: Transformer,
    drafter: Drafter,
    gamma: int,
    max_batch: int,
    seed: int,
    window: int | None,
    cost_table: Path | None,
    sts: Path | None = None,
) -> tuple[Engine, WindowPolicy, str]:
    """(engine, the scheduler it serves outside fallback, where its cost table came from), after a few
    unrecorded requests: a fresh process's first steps are slow, and the baseline the gates compare
    with must not be that cold start."""
    from .defaults import default_calibration, default_cost_table

    table, source = default_cost_table(target, drafter, cost_table)
    scheduler: WindowPolicy = FixedWindow(window) if window is not None else CostAwareScheduler(table)
    config = EngineConfig(
        gamma=gamma, max_batch=max_batch, replica_id=replica_id, cost_table_version=table.meta.version or None
    )
    engine = Engine(
        target, drafter, config, calibrate=default_calibration(drafter, sts), tiers=measured_grid(table.meta.tiers)
    )
    for request in workload_requests(f"{replica_id}-warmup", WARMUP_REQUESTS, 8, 0.0, seed):
        engine.submit(request)
    engine.run()
    engine.finished.clear()
    return engine, scheduler, source


@click.command()
@click.option(
    "--controller",
    "url",
    default="http://127.0.0.1:8470",
    show_default=True,
    envvar="SPARKGATE_CONTROLLER",
    type=HttpUrl(),
    help="Controller base URL.",
)
@click.option("--replica-id", default=None, type=RecordId(), help="Replica name [default: replica-HOST-PID].")
@click.option("--wait-s", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Keep retrying an unreachable controller this long.")  # fmt: skip
@click.option(
    "--gamma",
    default=None,
    type=click.IntRange(1),
    help="Draft length [default: the policy's]; given, the engine warms up before the controller answers.",
)
@click.option("--requests", "count", default=0, show_default=True, type=click.IntRange(min=0),
              help="Requests to serve (0: until stopped).")  # fmt: skip
@click.option("--max-new-tokens", default=48, show_default=True, type=click.IntRange(min=1))
@click.option("--max-batch", default=16, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--cancel-fraction",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Share of requests whose client cancels them partway (a stable hash of the id).",
)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="0 is greedy (consistency checks need it).")  # fmt: skip
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option(
    "--window",
    default=None,
    type=click.IntRange(min=0),
    help="Serve compact with this fixed window instead of the cost-aware scheduler.",
)
@click.option(
    "--cost-table",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Cost table for the scheduler [default: shipped or profiled here].",
)
@click.option(
    "--sts",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="STS temperatures for the drafter [default: shipped]; a file fitted for another drafter is refused.",
)
@click.option(
    "--consistency-fraction",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Fraction of greedy compact requests replayed in static.",
)
@click.option(
    "--state-every",
    default=50,
    show_default=True,
    type=click.IntRange(min=0),
    help="Check one active request's cache state every this many steps (0: never).",
)
@click.option("--poll-s", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between policy polls (0: every step).")  # fmt: skip
@click.option(
    "--rate",
    default=None,
    type=click.FloatRange(0, min_open=True),
    help="Open-loop arrivals: mean requests per second [default: closed loop].",
)
# Below 1, so the swing never takes the rate to 0 (no arrivals) or below.
@click.option("--amplitude", default=0.6, show_default=True, type=click.FloatRange(0, 1, max_open=True),
              help="Swing of --rate, as a fraction of it.")  # fmt: skip
@click.option("--period-s", default=20.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds per load cycle of --rate.")  # fmt: skip
@click.option("--offset", default=0.0, show_default=True,
              help="Where in the load cycle this replica starts, in cycles (0-1; it repeats).")  # fmt: skip
@click.option(
    "--fault",
    type=click.Choice([f.value for f in Fault]),
    default=Fault.NONE.value,
    show_default=True,
    help="Fault to fire on SIGUSR1 (drift needs --rate).",
)
@click.option("--drift-temperature", default=3.0, show_default=True, type=click.FloatRange(min=0),
              help="The drift fault's sampling temperature for new requests (0: greedy).")  # fmt: skip
@click.option(
    "--slow-verify-extra",
    default=SLOW_VERIFY_EXTRA,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="The slow-verify fault's extra verify time in treatment epochs, a fraction of the call's.",
)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the cost-table fault writes the foreign table.",
)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve /metrics on 127.0.0.1 at this port.")  # fmt: skip
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where records wait while the controller is unreachable [default: the cache's spool/REPLICA-ID].",
)
@click.option("--spool-mb", default=256, show_default=True, type=click.IntRange(1), help="Spool size bound.")
@click.option(
    "--threads",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Torch threads; replicas usually share a machine, and extra threads only contend.",
)
def replica(
    url: str,
    replica_id: str | None,
    wait_s: float,
    gamma: int | None,
    count: int,
    max_new_tokens: int,
    max_batch: int,
    cancel_fraction: float,
    temperature: float,
    seed: int,
    window: int | None,
    cost_table: Path | None,
    sts: Path | None,
    consistency_fraction: float,
    state_every: int,
    poll_s: float,
    rate: float | None,
    amplitude: float,
    period_s: float,
    offset: float,
    fault: str,
    drift_temperature: float,
    slow_verify_extra: float,
    out_dir: Path | None,
    metrics_port: int | None,
    spool_dir: Path | None,
    spool_mb: int,
    threads: int,
) -> None:
    """Serve the mixed workload with the runtime, following the controller's policy; counters as JSON at exit."""
    import torch

    from .defaults import CACHE_DIR, default_drafter, default_target

    armed, size = Fault(fault), FaultSize(drift_temperature, slow_verify_extra)
    if armed in (Fault.DRIFT, Fault.LOAD_SHIFT) and rate is None:
        raise click.UsageError(f"--fault {armed} changes the requests that arrive: it needs --rate")
    load = swing(rate, amplitude, period_s, offset) if rate is not None else None
    replica_id = replica_id or f"replica-{socket.gethostname()}-{os.getpid()}"
    named_spool = spool_dir
    spool_dir = output_path(spool_dir or CACHE_DIR / "spool" / replica_id, "--spool-dir", directory=True)
    if armed is Fault.COST_TABLE:  # it writes the foreign table there when it fires, mid-run
        output_path(out_dir or Path("."), "--out-dir", directory=True)
    prompt_len = LOAD_SHIFT_PROMPT_LEN if armed is Fault.LOAD_SHIFT else workload_prompt_len()
    target = default_target()
    drafter = default_drafter(target)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {replica_id} %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request would drown the log
    torch.set_num_threads(threads)
    flags = Flags()
    signal.signal(signal.SIGTERM, lambda *_: setattr(flags, "stop", True))
    signal.signal(signal.SIGINT, lambda *_: setattr(flags, "stop", True))
    signal.signal(signal.SIGUSR1, lambda *_: setattr(flags, "fault", True))

    metrics = Metrics()
    client = MeteredClient(url, metrics)
    try:
        gamma_hint = "--gamma"
        if gamma is None:
            gamma, gamma_hint = wait_for_policy(client, wait_s).gamma, "the policy gamma"
        check_gamma(gamma, drafter, gamma_hint)
        check_positions(
            positions_needed(prompt_len, max_new_tokens, gamma),
            target.args.max_seq_len,
            f"prompts of {prompt_len} tokens, --max-new-tokens {max_new_tokens} and gamma {gamma}",
            "--max-new-tokens",
        )
        try:
            engine, scheduler, table_source = warm_engine(
                replica_id, target, drafter, gamma, max_batch, seed, window, cost_table, sts
            )
        except ValueError as exc:  # an STS file or cost table made for another drafter or target
            raise click.UsageError(str(exc)) from None
        arrival_rate = Gauge(
            "sparkgate_replica_arrival_rate", "Mean request arrivals per second now.", registry=metrics.registry
        )
        shed = Counter(
            "sparkgate_replica_shed_requests_total",
            "Arrivals dropped with the backlog full.",
            registry=metrics.registry,
        )
        spooled = Gauge(
            "sparkgate_replica_spooled_records",
            "Records waiting on disk for the controller.",
            registry=metrics.registry,
        )
        dropped = Counter(
            "sparkgate_replica_dropped_records_total",
            "Records dropped with the spool full (oldest first).",
            registry=metrics.registry,
        )
        if metrics_port is not None:
            start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
        spool = Spool(spool_dir, spool_mb << 20)
        for other, waiting in (left_behind(CACHE_DIR / "spool", spool_dir) if named_spool is None else {}).items():
            log.warning("%d records an earlier replica spooled wait in %s: start one with --replica-id %s to "
                        "deliver them", waiting, other, other.name)  # fmt: skip
        wait_for_policy(client, wait_s)
        # What an earlier run spooled goes first: its step ids come before the ones this run continues from.
        spool.replay(client.post_body)
        engine.step_id = client.next_step_id(replica_id)
        node = Replica(
            engine,
            client,
            scheduler,
            replay=GreedyReplay(engine.model, engine.drafter, gamma),
            consistency_fraction=consistency_fraction,
            state_every=state_every,
            poll_s=poll_s,
            spool=spool,
        )
        node.poll(force=True)  # raises with a clear message when the policy's gamma is not this replica's
        workload = workload_requests(replica_id, count, max_new_tokens, temperature, seed, cancel_fraction)
        arrivals = Arrivals(workload, load, time.monotonic, seed) if load is not None else None
        source: Iterator[Request] = arrivals if arrivals is not None else workload
        if armed is Fault.COST_TABLE and out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)  # the fault writes into it and makes no folder
        log.info(
            "serving (cost table: %s; arrivals: %s; fault armed: %s)",
            table_source,
            "closed loop" if rate is None else f"{rate}/s",
            armed,
        )
        counted_shed = counted_dropped = 0
        try:
            while not flags.stop:
                if flags.fault and armed is not Fault.NONE:
                    shifted = workload_requests(f"{replica_id}-long", count, max_new_tokens, temperature, seed + 1,
                                                cancel_fraction, LOAD_SHIFT_PROMPT_LEN)  # fmt: skip
                    log.info("fault fired: %s", fire(armed, node, arrivals, size, out_dir, shifted))
                    armed = Fault.NONE
                before = node.stats["steps"]
                if arrivals is None or arrivals.pending() or engine.active or engine.queue:
                    node.serve(source, max_steps=before + SEGMENT_STEPS)
                    if arrivals is None and node.stats["steps"] < before + SEGMENT_STEPS:
                        break  # the closed-loop workload is done
                else:
                    node.poll()
                    time.sleep(min(arrivals.until_next(), 0.05))
                if arrivals is not None:
                    arrival_rate.set(arrivals.rate(time.monotonic() - arrivals.start))
                    shed.inc(arrivals.shed - counted_shed)
                    counted_shed = arrivals.shed
                if node.payload is not None:
                    metrics.set_phase(node.payload.phase)
                spooled.set(spool.waiting)
                dropped.inc(spool.dropped - counted_dropped)
                counted_dropped = spool.dropped
        finally:
            try:
                node.flush()
            except httpx.HTTPError as exc:  # the controller went first: what it stored is what counts
                log.warning("final flush failed: %s", exc)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"controller {url}: {exc}") from None
    finally:
        client.close()
    summary: dict[str, object] = {"replica_id": replica_id, **node.stats}
    if node.payload is not None:
        summary.update(revision=node.payload.revision, phase=str(node.payload.phase))
    if arrivals is not None:
        summary.update(arrived=arrivals.arrived, shed=arrivals.shed)
    click.echo(json.dumps(summary))
