"""Commands of the record path: ``sparkgate ingest | export | collect | prune``."""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import click

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.sglang import SGLangPoller
from sparkgate.collectors.store import Store
from sparkgate.collectors.trtllm import TRTLLMScraper
from sparkgate.collectors.vllm import VLLMScraper, read_responses
from sparkgate.collectors.wire import Parsed, from_ndjson
from sparkgate.policies.cli_types import HttpUrl
from sparkgate.policies.outputs import output_path

_SHOWN_PROBLEMS = 20


def _chunks(stream: IO[bytes], lines: int) -> Iterator[tuple[int, bytes]]:
    """(index of the first record, body) for every ``lines`` non-blank lines of ``stream``."""
    records = (line for line in stream if line.strip())
    start = 0
    while chunk := list(itertools.islice(records, lines)):
        yield start, b"".join(line if line.endswith(b"\n") else line + b"\n" for line in chunk)
        start += len(chunk)


def _report_problems(path: str, start: int, result) -> None:
    for q in result.prepared.quarantined[:_SHOWN_PROBLEMS]:
        problems = "; ".join(str(p) for p in q.problems)
        click.echo(f"{path}: record {start + q.position}: {problems}", err=True)


def _ingest_file(ingestor: Ingestor, path: str, stream: IO[bytes], batch_lines: int) -> dict:
    """Commit ``stream`` in batches of ``batch_lines`` records; returns the file's totals."""
    totals = {"path": path, "steps": 0, "requests": 0, "depth_labels": 0, "quarantined": 0}
    starts: collections.deque[int] = collections.deque()  # reading runs one batch ahead of the commits

    def batches() -> Iterator[tuple[Parsed, str]]:
        for start, body in _chunks(stream, batch_lines):
            starts.append(start)
            yield from_ndjson(body), f"file:{path}@{start}"

    # A file is read in bulk: stage one batch while another commits. A pipe may wait
    # for input, so each of its batches commits as soon as it has been read.
    results = (ingestor.ingest(*batch) for batch in batches()) if path == "-" else ingestor.ingest_stream(batches())
    for result in results:
        _report_problems(path, starts.popleft(), result)
        for key, value in result.summary().items():
            totals[key] += value
    return totals


@click.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="DuckDB file (created if missing).")
@click.option("--batch-lines", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Records per transaction.")  # fmt: skip
@click.option("--strict", is_flag=True, help="Exit 1 when any record was quarantined.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
def ingest(db: str, batch_lines: int, strict: bool, paths: tuple[str, ...]) -> None:
    """Ingest NDJSON files of step records (one record with its request rows per line; - for stdin).

    Each batch of lines is one transaction; invalid records go to the quarantine
    table with their reasons. Prints one JSON summary per file.
    """
    quarantined = 0
    with Store(db) as store:
        ingestor = Ingestor(store)
        for path in paths:
            with sys.stdin.buffer if path == "-" else open(path, "rb") as stream:
                totals = _ingest_file(ingestor, path, stream, batch_lines)
            quarantined += totals["quarantined"]
            click.echo(json.dumps(totals))
    if strict and quarantined:
        sys.exit(1)


def _day(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return dt.datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()
    except ValueError as exc:
        raise click.BadParameter(f"--since={value!r}: expected YYYY-MM-DD") from exc


@click.command()
@click.option("--db", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Export root directory.")
@click.option("--since", default=None, help="First UTC day to export (YYYY-MM-DD); default everything.")
def export(db: str, out: str, since: str | None) -> None:
    """Export steps, requests and depth_labels as Parquet partitioned by date and replica_id."""
    if not out:  # would be the working directory
        raise click.BadParameter("'' is empty: give the export root directory", param_hint=["--out"])
    start = _day(since)
    with Store(db, create=False) as store:
        written = store.export(out, start)
    click.echo(json.dumps({"out": str(Path(out)), **written}))


@click.command()
@click.option("--db", required=True, type=click.Path(exists=True, dir_okay=False))
# A million days reaches back before any record; a longer window would only overflow the cutoff.
@click.option("--older-than-days", required=True, type=click.FloatRange(0, 1e6), help="Retention window.")
def prune(db: str, older_than_days: float) -> None:
    """Delete events (and quarantine rows) older than the retention window, in one transaction."""
    with Store(db, create=False) as store:
        deleted = store.delete_before(time.time() - older_than_days * 86400)
    click.echo(json.dumps({"deleted": deleted}))


@click.command()
@click.option("--db", type=click.Path(dir_okay=False), help="DuckDB file for SGLang records.")
@click.option("--sglang", "sglang_urls", multiple=True, type=HttpUrl(), help="SGLang server base URL (repeatable).")
@click.option("--vllm", "vllm_urls", multiple=True, type=HttpUrl(), help="vLLM server base URL (repeatable).")
@click.option(
    "--vllm-adaptive",
    is_flag=True,
    help="The vLLM servers trim drafts after scheduling (adaptive verification, or a variable-length drafter "
    "such as n-gram on the GPU model runner): mark their per-position and per-response curves censored.",
)
@click.option(
    "--vllm-responses",
    "vllm_responses",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="JSONL of saved vLLM responses with per-request spec-decode metrics: print their survival curve once.",
)
@click.option("--trtllm", "trtllm_urls", multiple=True, type=HttpUrl(), help="trtllm-serve base URL (repeatable).")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0), help="Seconds between polls.")
@click.option("--polls", default=0, show_default=True, type=click.IntRange(min=0),
              help="Stop after this many polls (0: run until interrupted).")  # fmt: skip
@click.option("--snapshot-dir", type=click.Path(file_okay=False), help="Publish a Parquet snapshot after each poll.")
@click.option(
    "--clear-buffer/--keep-buffer",
    default=True,
    show_default=True,
    help="Clear each SGLang server's record buffer after a committed ingest (skipped where it is refused).",
)
@click.option(
    "--sglang-greedy",
    is_flag=True,
    help="The SGLang servers serve greedy requests only: pass their drafts on to recover censored labels.",
)
def collect(
    db: str | None,
    sglang_urls: tuple[str, ...],
    vllm_urls: tuple[str, ...],
    vllm_adaptive: bool,
    vllm_responses: tuple[str, ...],
    trtllm_urls: tuple[str, ...],
    interval: float,
    polls: int,
    snapshot_dir: str | None,
    clear_buffer: bool,
    sglang_greedy: bool,
) -> None:
    """Poll SGLang DSpark records into the store; print vLLM survival curves and TensorRT-LLM acceptance,
    one JSON line per server and poll.

    A server that fails a poll is reported and polled again the next round (it may not be up yet). When the
    run ends (after ``--polls``, or interrupted) with a server none of whose polls succeeded, the command
    fails naming it and its last error: a run that collected nothing from a source it was given did not do
    its job."""
    if not sglang_urls and not vllm_urls and not trtllm_urls and not vllm_responses:
        raise click.UsageError("give at least one --sglang, --vllm, --vllm-responses or --trtllm URL")
    if sglang_urls and not db:
        raise click.UsageError("--sglang needs --db")
    if snapshot_dir and not db:
        raise click.UsageError("--snapshot-dir needs --db (the snapshots are of that store)")
    if db and not sglang_urls:  # only SGLang's records are stored: the file would be made and stay empty
        raise click.UsageError("--db stores --sglang records: give --sglang, or leave --db out")
    if snapshot_dir:
        output_path(snapshot_dir, "--snapshot-dir", directory=True)
    for path in vllm_responses:
        try:
            click.echo(json.dumps({"vllm_responses": path, **read_responses(path, vllm_adaptive).to_dict()}))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from exc
    if not sglang_urls and not vllm_urls and not trtllm_urls:
        return
    answers = _Answers()
    store = Store(db) if db else None
    try:
        pollers = (
            [SGLangPoller(url, Ingestor(store), clear_buffer=clear_buffer, greedy=sglang_greedy) for url in sglang_urls]
            if store
            else []
        )
        scrapers: list[VLLMScraper | TRTLLMScraper] = [VLLMScraper(u, adaptive=vllm_adaptive) for u in vllm_urls]
        scrapers += [TRTLLMScraper(url) for url in trtllm_urls]
        for n in itertools.count(1):
            _poll_all(pollers, scrapers, answers)
            if store is not None and snapshot_dir:
                store.snapshot(snapshot_dir)
            if polls and n >= polls:
                break
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
    finally:
        if store is not None:
            store.close()
    answers.check()


@dataclass
class _Answers:
    """Per polled server (``--vllm URL``), whether any poll of it succeeded over the run, and its last error."""

    succeeded: set[str] = field(default_factory=set)
    last_error: dict[str, str] = field(default_factory=dict)

    def record(self, source: str, error: Exception | None = None) -> None:
        if error is None:
            self.succeeded.add(source)
        else:
            self.last_error[source] = str(error) or type(error).__name__

    def check(self) -> None:
        """Raise naming every server that failed each time it was polled."""
        silent = [f"{source}: no poll succeeded (last error: {error})"
                  for source, error in self.last_error.items() if source not in self.succeeded]  # fmt: skip
        if silent:
            raise click.ClickException("; ".join(silent))


def _poll_all(pollers: list[SGLangPoller], scrapers: list[VLLMScraper | TRTLLMScraper], answers: _Answers) -> None:
    """One round; a server that cannot be reached is reported (and recorded in ``answers``) and retried next
    round."""
    for poller in pollers:
        source = f"--sglang {poller.url}"
        try:
            result = poller.poll_once()
        except Exception as exc:
            answers.record(source, exc)
            click.echo(json.dumps({"sglang": poller.url, "error": str(exc)}), err=True)
            continue
        answers.record(source)
        summary = result.summary() if result else {"steps": 0, "quarantined": 0}
        click.echo(
            json.dumps({"sglang": poller.url, **summary, "restarts": poller.restarts, "synthetic": poller.synthetic})
        )
    for scraper in scrapers:
        kind = "vllm" if isinstance(scraper, VLLMScraper) else "trtllm"
        source = f"--{kind} {scraper.url}"
        try:
            figures = scraper.scrape().to_dict()
        except Exception as exc:
            answers.record(source, exc)
            click.echo(json.dumps({kind: scraper.url, "error": str(exc)}), err=True)
            continue
        answers.record(source)
        click.echo(json.dumps({kind: scraper.url, **figures}))
