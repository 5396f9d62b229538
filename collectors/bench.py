"""``sparkgate bench ingest``: the batch path against row-wise ``executemany``, plus HTTP.

Every arm runs in one process on the same synthetic records (γ = 7, 32 requests
per step), each into its own fresh DuckDB file. Rows are depth-label rows. Each
arm's time ends with a checkpoint of its store: a file store defers writing its
log into the file until the log passes ``collectors.store.FILE_CHECKPOINT``, and
that deferred work belongs to the ingest that logged it.

- batch: Arrow wire tables through ``Store.ingest_stream``: validation,
  explode and one transaction per ``--batch-steps`` steps, the next batch
  staged while one commits (record generation is not timed). The default,
  4,000 steps (~900k labels) per transaction, is below ``sparkgate ingest``'s
  10,000 records: per-commit costs (WAL write, checkpoint) are what small
  transactions pay, 1,000-step ones measured ~1.1M rows/s against ~1.7M;
- recovering: the batch path on requests that continue through every step with
  drafts and positions, so each commit also runs censored-label recovery
  (``collectors.recovery``); ``recovering_time_ratio`` is its time over batch's;
- append: the ceiling of the batch path: the same batches, validated and exploded
  beforehand (untimed), appended as they are (steps, request rows, labels: no
  sums, no recovery, no key check) in one transaction each; what DuckDB's
  append and commit of these rows cost on this machine;
- row-wise: the same depth labels inserted with ``executemany`` in one
  transaction (no validation: the baseline is given every advantage);
- http: ``--clients`` concurrent loopback clients POSTing NDJSON bodies of
  ``--body-steps`` steps (1,000 steps is ~20 MB, under the 64 MB body limit) to
  the ingest endpoint; lost rows = rows sent minus rows stored;
- http_arrow: the same with Arrow IPC stream bodies of the same records (the
  endpoint's other content type, ~8 MB per 1,000 steps), into its own store:
  what the endpoint costs a sender that does not speak JSON.
"""

from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import httpx
import pyarrow as pa

from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import DEFAULT_MAX_BODY, ingest_app, serve_in_thread
from sparkgate.collectors.labels import explode
from sparkgate.collectors.metrics import peak_rss_mb
from sparkgate.collectors.store import Store, stage
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import flatten, from_wire, to_ipc

GAMMA, BATCH = 7, 32
_ROWS_PER_STEP = GAMMA * BATCH
# An NDJSON step of these records is about 19.7 kB (21 kB leaves a margin): a body of more steps than this
# passes the endpoint's limit, is refused, and its rows would be reported lost (tests measure the largest body).
MAX_BODY_STEPS = DEFAULT_MAX_BODY // 21_000
# Body encoding per HTTP arm: (content type, wire table -> body bytes).
_BODIES = {
    "ndjson": ("application/x-ndjson", lambda wire: b"".join(json.dumps(r).encode() + b"\n" for r in wire.to_pylist())),
    "arrow": ("application/vnd.apache.arrow.stream", to_ipc),
}


def _wire_batches(rows: int, batch_steps: int, replica: str, continuing: bool = False) -> list[pa.Table]:
    steps = max(1, rows // _ROWS_PER_STEP)
    return [
        synthetic_wire(min(batch_steps, steps - s), BATCH, GAMMA, replica, first_step=s, seed=s, continuing=continuing)
        for s in range(0, steps, batch_steps)
    ]


def bench_batch(db: Path, batches: list[pa.Table]) -> tuple[int, float]:
    """(depth-label rows, seconds) through ``Store.ingest_stream``."""
    with Store(db) as store:
        start = time.perf_counter()
        rows = sum(r.labels for r in store.ingest_stream((from_wire(wire), "bench") for wire in batches))
        store.checkpoint()
        return rows, time.perf_counter() - start


def bench_append(db: Path, batches: list[pa.Table]) -> tuple[int, float]:
    """(depth-label rows, seconds) appending the prepared rows of each batch in its own transaction."""
    prepared = [stage(from_wire(wire)).prepared for wire in batches]
    with Store(db) as store:
        start = time.perf_counter()
        for p in prepared:
            # The store's own append, without the key check, recovery and sums its commit adds.
            with store._lock:
                store._insert({"steps": p.flat.steps, "requests": p.requests, "depth_labels": p.labels})
        store.checkpoint()
        return sum(p.labels.num_rows for p in prepared), time.perf_counter() - start


def bench_rowwise(db: Path, rows: int) -> tuple[int, float]:
    """(rows, seconds) inserting the same kind of depth labels one parameter tuple at a time."""
    wire = synthetic_wire(max(1, rows // _ROWS_PER_STEP), BATCH, GAMMA, "rowwise")
    labels = explode(flatten(wire)).to_pylist()
    values = [tuple(r.values()) for r in labels]
    with Store(db) as store:
        con = store._con  # the baseline deliberately bypasses the batch path
        start = time.perf_counter()
        con.execute("BEGIN TRANSACTION")
        con.executemany(f"INSERT INTO depth_labels VALUES ({', '.join('?' * len(values[0]))})", values)
        con.execute("COMMIT")
        return len(values), time.perf_counter() - start


def bench_http(db: Path, rows: int, clients: int, body_steps: int, body: str = "ndjson") -> tuple[int, float, int]:
    """(rows sent, seconds, rows lost) with ``clients`` concurrent posters on loopback, bodies encoded as
    ``body`` (a key of ``_BODIES``)."""
    content_type, encode = _BODIES[body]
    wires = [wire for c in range(clients) for wire in _wire_batches(rows // clients, body_steps, f"http-{c}")]
    bodies = [encode(wire) for wire in wires]
    sent = sum(wire.num_rows for wire in wires) * _ROWS_PER_STEP
    with Store(db) as store:
        with serve_in_thread(ingest_app(Ingestor(store))) as url:

            def post(chunk: list[bytes]) -> None:
                with httpx.Client(base_url=url, timeout=120.0) as http:
                    for content in chunk:
                        http.post("/v1/ingest", content=content, headers={"content-type": content_type})

            start = time.perf_counter()
            with ThreadPoolExecutor(clients) as pool:
                list(pool.map(post, [bodies[c::clients] for c in range(clients)]))
            store.checkpoint()
            elapsed = time.perf_counter() - start
        stored = store.counts()["depth_labels"]
    return sent, elapsed, sent - stored


def run(rows: int, rowwise_rows: int, http_rows: int, clients: int, batch_steps: int, body_steps: int) -> dict:
    """Every figure of the benchmark as a JSON-ready dict."""
    batches = _wire_batches(rows, batch_steps, "batch")
    continuing = _wire_batches(rows, batch_steps, "batch", continuing=True)
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-") as tmp:
        batch_rows, batch_s = bench_batch(Path(tmp) / "batch.duckdb", batches)
        _, recovering_s = bench_batch(Path(tmp) / "recovering.duckdb", continuing)
        append_rows, append_s = bench_append(Path(tmp) / "append.duckdb", batches)
        row_rows, row_s = bench_rowwise(Path(tmp) / "rowwise.duckdb", rowwise_rows)
        http_sent, http_s, http_lost = bench_http(Path(tmp) / "http.duckdb", http_rows, clients, body_steps)
        _, arrow_s, arrow_lost = bench_http(Path(tmp) / "arrow.duckdb", http_rows, clients, body_steps, "arrow")
    batch_rate, row_rate = batch_rows / batch_s, row_rows / row_s
    return {
        "rows": batch_rows,
        "batch_seconds": round(batch_s, 3),
        "batch_rows_per_s": round(batch_rate),
        "recovering_rows_per_s": round(batch_rows / recovering_s),
        "recovering_time_ratio": round(recovering_s / batch_s, 3),
        "append_rows_per_s": round(append_rows / append_s),
        "batch_share_of_append": round(batch_rate / (append_rows / append_s), 3),
        "rowwise_rows": row_rows,
        "rowwise_rows_per_s": round(row_rate),
        "speedup": round(batch_rate / row_rate, 1),
        "http_rows": http_sent,
        "http_clients": clients,
        "http_rows_per_s": round(http_sent / http_s),
        "http_lost_rows": http_lost,
        "http_arrow_rows_per_s": round(http_sent / arrow_s),
        "http_arrow_lost_rows": arrow_lost,
        "batch_steps": batch_steps,
        "body_steps": body_steps,
        "gamma": GAMMA,
        "requests_per_step": BATCH,
    }


@click.command("ingest")
@click.option("--rows", default=2_000_000, show_default=True, type=click.IntRange(min=1),
              help="Depth-label rows through the batch path.")  # fmt: skip
@click.option("--rowwise-rows", default=20_000, show_default=True, type=click.IntRange(min=1),
              help="Rows for the executemany baseline.")  # fmt: skip
@click.option("--http-rows", default=None, type=click.IntRange(min=1), help="Rows over HTTP [default: --rows].")
@click.option("--clients", default=4, show_default=True, type=click.IntRange(min=1), help="Concurrent HTTP clients.")
@click.option("--batch-steps", default=4000, show_default=True, type=click.IntRange(min=1),
              help="Steps per transaction on the batch path.")  # fmt: skip
@click.option("--body-steps", default=1000, show_default=True, type=click.IntRange(1, MAX_BODY_STEPS),
              help="Steps per HTTP body (one transaction each).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_ingest(
    rows: int, rowwise_rows: int, http_rows: int | None, clients: int, batch_steps: int, body_steps: int, as_json: bool
) -> None:
    """Batch ingestion vs row-wise executemany, and the HTTP path, side by side."""
    # As many rows as the batch path by default: at a quarter, each client sent one body, and the rate
    # measured mostly the first bodies' reception and staging, which no commit overlaps.
    result = run(rows, rowwise_rows, rows if http_rows is None else http_rows, clients, batch_steps, body_steps)
    result["peak_rss_mb"] = peak_rss_mb()
    if as_json:
        click.echo(json.dumps(result))
    else:
        for key, value in result.items():
            click.echo(f"{key:>20}: {value}")
