"""Controller commands: ``sparkgate serve | status | promote | abort | pause | resume | report``.

``serve`` owns the DuckDB file (the one writer, docs/design.md §4) and evaluates on a
background thread every ``evaluation_interval_s``; with ``--sglang`` it also polls
those servers' records into that file (a collector could not: one writer per file),
so store gates and the replica-group comparisons see what the servers served. The operator commands talk to
a running service over HTTP; the token comes from ``--token`` or
``SPARKGATE_TOKEN``. ``report`` opens a DuckDB file nobody else has open (or asks
a running controller with ``--controller``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading

import click
import httpx
import pydantic
import uvicorn

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.sglang import SGLangPoller
from sparkgate.collectors.store import Store
from sparkgate.collectors.tracing import tracer_provider
from sparkgate.collectors.writers import Writers, load_writers
from sparkgate.policies.cli_types import HttpUrl, PastTime
from sparkgate.policies.outputs import output_path
from sparkgate.policies.rollout import DEFAULT_PATH, load_rollout_policy
from sparkgate.policies.vocabulary import Phase

from . import promql
from .actuators import SGLangActuator
from .address import DEFAULT_PORT, DEFAULT_URL
from .collector_health import CollectorHealth
from .evaluate import evaluate
from .notify import Notifier, resolve
from .queries import SLICE_COLUMNS, Slice, Window, slice_values
from .service import Action, check_bind, create_app, listen
from .sources import sources
from .supervisor import Controller, Versions

log = logging.getLogger(__name__)

controller_option = click.option(
    "--controller",
    "url",
    default=DEFAULT_URL,
    show_default=True,
    envvar="SPARKGATE_CONTROLLER",
    type=HttpUrl(),
    help="Controller base URL.",
)


def not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: an option given as '' is refused (an empty token is no token to a client, and an
    empty version tells a replica nothing)."""
    if value == "":
        raise click.BadParameter("'' is empty: give a value, or leave the option out", ctx, param)
    return value


token_option = click.option(
    "--token",
    envvar="SPARKGATE_TOKEN",
    default=None,
    callback=not_empty,
    help="Operator bearer token [env SPARKGATE_TOKEN].",
)


def evaluate_forever(controller: Controller, stop: threading.Event, snapshot_dir: str | None = None) -> None:
    """Tick every evaluation interval until ``stop``; a failed tick is logged and retried next interval."""
    while not stop.wait(controller.policy.evaluation_interval_s):
        try:
            controller.tick()
            if snapshot_dir:
                controller.store.snapshot(snapshot_dir)
        except Exception:
            log.exception("evaluation failed")


def poll_forever(
    pollers: list[SGLangPoller], stop: threading.Event, interval_s: float, health: CollectorHealth
) -> None:
    """Poll every server each ``interval_s`` until ``stop``; a server that fails is logged, reported to
    ``health`` (the controller counts it as an error) and retried."""
    while not stop.wait(interval_s):
        for poller in pollers:
            try:
                poller.poll_once()
            except Exception as exc:
                log.warning("polling %s failed: %s", poller.url, exc)
                health.failed(f"collector {poller.url}", str(exc) or type(exc).__name__)
            else:
                health.succeeded(f"collector {poller.url}")


@click.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="DuckDB file (created if missing).")
@click.option(
    "--policy",
    "policy_path",
    default=str(DEFAULT_PATH),
    show_default=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Rollout policy YAML.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(0, 65535))
@token_option
@click.option(
    "--writers",
    "writers_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="YAML of writer credentials bound to replica ids [default: one writer from env SPARKGATE_WRITER_TOKEN].",
)
@click.option(
    "--sglang",
    "sglang_urls",
    multiple=True,
    type=HttpUrl(),
    help="SGLang server to push the rollout to and poll records from (repeatable).",
)
@click.option(
    "--sglang-interval", default=1.0, show_default=True, type=click.FloatRange(min=0.05), help="Seconds between polls."
)
@click.option(
    "--sglang-greedy",
    is_flag=True,
    help="The SGLang servers serve greedy requests only: pass their drafts on to recover censored labels.",
)
@click.option("--prometheus", default=None, type=HttpUrl(), help="Prometheus base URL for gates with promql.")
@click.option("--snapshot-dir", type=click.Path(file_okay=False), help="Publish Parquet snapshots after each tick.")
@click.option("--cost-table-version", default=None, callback=not_empty, help="Announced to replicas in the policy.")
@click.option("--sts-version", default=None, callback=not_empty, help="Announced to replicas in the policy.")
@click.option(
    "--otlp-endpoint",
    envvar="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    default=None,
    type=HttpUrl(),
    help="OTLP/HTTP traces URL (e.g. http://localhost:4318/v1/traces): one span per ingested step.",
)
def serve(
    db,
    policy_path,
    host,
    port,
    token,
    writers_path,
    sglang_urls,
    sglang_interval,
    sglang_greedy,
    prometheus,
    snapshot_dir,
    cost_table_version,
    sts_version,
    otlp_endpoint,
):
    """Run the controller: policy and ingest API, gates, rollout, /metrics.

    Every input is checked, and the address bound, before the store is opened: a bad option or a port in
    use leaves the file as it was, and "listening" is printed only once the sockets listen. A server that
    fails to start exits 3, as ``uvicorn.run`` does, once the loops are stopped and the store closed."""
    if snapshot_dir:
        output_path(snapshot_dir, "--snapshot-dir", directory=True)
    metrics = Metrics()
    try:
        found = load_writers(writers_path)
        writers = (
            Writers(found, on_refusal=lambda w, why: metrics.writer_refusals.labels(w, why).inc()) if found else None
        )
        check_bind(host, token, writers)
        policy = load_rollout_policy(policy_path)
        notifier = Notifier(resolve(policy.notify)) if policy.notify else None
        provider = tracer_provider(otlp_endpoint, service_name="sparkgate-controller") if otlp_endpoint else None
    except (ValueError, RuntimeError) as exc:
        raise click.UsageError(str(exc)) from None
    promql.require_url(policy.gates, prometheus)
    tracer = provider.get_tracer("sparkgate.collectors") if provider else None
    with contextlib.ExitStack() as opened:
        # Closed here on the way out: uvicorn closes them in its shutdown, which a server that never started skips.
        listeners = [opened.enter_context(sock) for sock in listen(host, port)]
        store = opened.enter_context(Store(db))
        opened.enter_context(_flushed(provider))
        sglang = SGLangActuator(sglang_urls) if sglang_urls else None
        health = CollectorHealth()
        controller = Controller(
            store,
            policy,
            metrics=metrics,
            actuators=[sglang] if sglang else [],
            groups=sglang.arms if sglang else None,
            observers=[notifier] if notifier is not None else [],
            prometheus_url=prometheus,
            versions=Versions(cost_table_version, sts_version),
            collector_errors=health.errors,
        )
        ingestor = Ingestor(store, metrics, tracer)
        app = create_app(controller, ingestor, token, writers)
        stop = threading.Event()
        loops = [
            threading.Thread(
                target=evaluate_forever, args=(controller, stop, snapshot_dir), name="sparkgate-evaluate", daemon=True
            )
        ]
        if sglang_urls:
            pollers = [SGLangPoller(url, ingestor, greedy=sglang_greedy) for url in sglang_urls]
            loops.append(
                threading.Thread(
                    target=poll_forever,
                    args=(pollers, stop, sglang_interval, health),
                    name="sparkgate-sglang",
                    daemon=True,
                )
            )
        for loop in loops:
            loop.start()
        address = f"[{host}]" if ":" in host else host
        listening = f"http://{address}:{listeners[0].getsockname()[1]}"
        click.echo(
            json.dumps({"listening": listening, "db": db, **controller.policy_payload().model_dump(mode="json")}),
            err=True,
        )
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        try:
            # uvicorn.run's own handling: an interrupt is the way to stop, not an error.
            with _exit_on_sigterm(), contextlib.suppress(KeyboardInterrupt):
                server.run(sockets=listeners)
        finally:
            stop.set()
            for loop in loops:
                loop.join()
            if notifier is not None:
                notifier.close()
        if not server.started:  # uvicorn.run's rule: stopped before it started (interrupted) is a failed start
            raise SystemExit(3)


@contextlib.contextmanager
def _exit_on_sigterm():
    """SIGTERM raises SystemExit, so the cleanup around the server runs.

    uvicorn stops gracefully on SIGTERM, then raises the signal again under the
    handler it found; the default one would end the process on the spot, before
    the evaluator stops, batched spans are exported and the store is closed.
    """
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_exit(signum: int, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _flushed(provider):
    """Shut ``provider`` down on the way out, so spans still batched are exported, not dropped."""
    try:
        yield
    finally:
        if provider is not None:
            provider.shutdown()


def _call(method: str, url: str, path: str, token: str | None = None, **kwargs) -> dict | list:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, f"{url.rstrip('/')}{path}", headers=headers, timeout=30.0, **kwargs)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"{url}: {exc}") from None
    try:
        body = response.json()
    except ValueError:  # another server at that address (a dashboard, a proxy's error page)
        body = None
    text = " ".join(response.text.split())[:200]  # one line, whatever page came back
    if response.status_code >= 400:
        detail = body.get("detail", text) if isinstance(body, dict) else text
        raise click.ClickException(f"{response.status_code}: {detail}")
    if body is None:
        raise click.ClickException(f"{url}{path} answered {text!r}, not JSON: is a sparkgate controller there?")
    return body


@click.command()
@controller_option
@click.option("--decisions", default=5, show_default=True, type=click.IntRange(0, 10_000),
              help="Also show this many recent decisions (at most what /v1/decisions serves).")  # fmt: skip
def status(url, decisions):
    """Show the phase, revision, stage counters, last gate verdicts and recent decisions."""
    body = _call("GET", url, "/v1/status")
    assert isinstance(body, dict), "/v1/status answers a JSON object"
    body["recent_decisions"] = _call("GET", url, "/v1/decisions", params={"limit": decisions}) if decisions else []
    click.echo(json.dumps(body, indent=2))


def action_body(operator: str, note: str, revision: int | None = None) -> dict:
    """An operator action's request body, checked as the service checks it: what it would refuse is named,
    option and value, before it is asked."""
    try:
        return Action(operator=operator, note=note, revision=revision).model_dump(exclude_none=True)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        shown = repr(error["input"]) if len(error["input"]) <= 60 else f"{error['input'][:60]!r}..."
        raise click.BadParameter(f"{shown}: {error['msg']}", param_hint=[f"--{error['loc'][0]}"]) from None


def operator_command(name: str, help_text: str, action: str | None = None) -> click.Command:
    """``sparkgate NAME``: post to ``/v1/rollout/ACTION`` (``action`` or the name) an operator decision, with
    who and why."""

    @click.command(name, help=help_text)
    @controller_option
    @token_option
    @click.option("--operator", required=True, help="Who acts (recorded with the decision).")
    @click.option("--note", default="", help="Why (recorded with the decision).")
    @click.option("--revision", type=click.IntRange(min=1), default=None,
                  help="Act only while this revision is in force (see `sparkgate status`): run again, the command "
                       "then cannot act twice.")  # fmt: skip
    def command(url, token, operator, note, revision):
        body = action_body(operator, note, revision)
        click.echo(json.dumps(_call("POST", url, f"/v1/rollout/{action or name}", token, json=body)))

    return command


promote = operator_command("promote", "Advance one rung of the ladder now, without waiting for gates.")
abort = operator_command("abort", "Roll back to fallback now.")
pause = operator_command("pause", "Hold the current stage: no automatic advance (critical gates still roll back).")
resume = operator_command("resume", "Leave fallback (to the first serving stage) or paused (to its stage).")


@click.command()
@click.option("--db", type=click.Path(exists=True, dir_okay=False), help="DuckDB file (not open elsewhere).")
@click.option("--controller", "url", default=None, type=HttpUrl(),
              help="Ask a running controller instead of opening --db.")  # fmt: skip
@click.option("--since", type=PastTime(), default=None,
              help="Window start: unix seconds, ISO time, or a duration (30m, 2h, 1d).")  # fmt: skip
@click.option("--by", type=click.Choice(sorted(SLICE_COLUMNS)), default=None, help="Also report each slice.")
@click.option("--phase", default=Phase.CANARY.value, show_default=True, type=click.Choice([p.value for p in Phase]),
              help="Phase whose gate inputs to show (with --db; a controller shows its own).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object (the default prints it indented).")
@click.pass_context
def report(ctx, db, url, since, by, phase, as_json):
    """Metrics over a window: per-depth ECE with counts, utilization, miss rate, latency, throughput."""
    if (db is None) == (url is None):
        raise click.UsageError("give exactly one of --db or --controller")
    window = Window(since)
    if url is not None:
        if by:
            raise click.UsageError("--by needs --db")
        if ctx.get_parameter_source("phase") is click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError("--phase needs --db (a controller reports the phase it is in)")
        body = _call("GET", url, "/v1/report", params={"since": window.since} if window.since else None)
    else:
        with Store(db, create=False) as store:
            body = evaluate(store, window).report(phase)
            body["sources"] = sources(store, window, Slice())
            if by:
                body["slices"] = {
                    str(v): evaluate(store, window, Slice(**{SLICE_COLUMNS[by]: v})).report(phase)
                    for v in slice_values(store, by, window)
                }
    click.echo(json.dumps(body) if as_json else json.dumps(body, indent=2))
