"""``sparkgate bench dashboard``: first render of every page on a synthetic store of ``--labels`` depth labels.

The store is built with ``collectors.synth`` (γ = 7, 32 requests per step, 4
replicas), a real controller records its start and one evaluation, and a
Parquet snapshot is published. Each source (``--snapshot-dir`` and a ``--db``
copy) is then measured in a fresh Python process, the way a new dashboard
server meets its first visitor: the server's warm-up first (``dashboards.server``
imports what the pages need before it listens; its seconds are reported as
``server_warmup_s``, paid once per server start), then the Rollout page (the
landing page), then each other page once, every page's data caches cold. Times
are the app script's run on the server (Streamlit's AppTest), which is what
delays the first paint; the browser's drawing of the charts comes after and is
not included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from sparkgate.collectors.metrics import peak_rss_mb

GAMMA, BATCH, REPLICAS = 7, 32, 4
PAGES = ("rollout", "calibration", "acceptance", "tiers", "fleet")
T0 = 1.75e9


def build_store(root: Path, labels: int) -> dict:
    """A DuckDB store and its snapshot with about ``labels`` depth labels; returns what was built."""
    from sparkgate.collectors.store import Store
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire
    from sparkgate.controller.supervisor import Controller
    from sparkgate.policies.rollout import load_rollout_policy

    steps = max(1, labels // (GAMMA * BATCH * REPLICAS))
    now = [T0]
    start = time.perf_counter()
    with Store(root / "events.duckdb") as store:
        controller = Controller(store, load_rollout_policy(), clock=lambda: now[0])
        served = _register_tables(store, T0)
        batches = (
            (
                from_wire(
                    synthetic_wire(
                        min(2000, steps - first),
                        BATCH,
                        GAMMA,
                        f"replica-{r}",
                        first_step=first,
                        seed=r * 1_000_003 + first,
                        ts=T0 + first * 0.01,
                        cost_table_version=served[r % len(served)],
                    )
                ),
                "bench",
            )
            for r in range(REPLICAS)
            for first in range(0, steps, 2000)
        )
        for _ in store.ingest_stream(batches):
            pass
        now[0] = T0 + steps * 0.01 + 1
        controller.tick()
        counts = store.counts()
        store.snapshot(root / "snapshots")
    return {
        "depth_labels": counts["depth_labels"],
        "steps": counts["steps"],
        "build_s": round(time.perf_counter() - start, 1),
    }


def _register_tables(store, now: float) -> list[str]:
    """A static table and one adaptive fitted from it, so the Tiers page draws its cost-table section; returns
    their versions (replicas alternate between them)."""
    import dataclasses

    from sparkgate.collectors import cost_tables
    from sparkgate.policies.cost_model import AdditiveCostTable, CostMeta

    static = AdditiveCostTable(
        bias_seconds=0.004, bs_probes=(1, 32), alpha_seconds=(0.0, 0.002), m_probes=(1, 256),
        theta_seconds=(0.0, 0.004), meta=CostMeta(hardware={"cpu": "bench"}, model="synthetic", version="bench"),
    )  # fmt: skip
    entry = cost_tables.static_entry(static, now)
    child = dataclasses.replace(static, meta=dataclasses.replace(static.meta, version="bench+a1"))
    fitted = cost_tables.TableEntry(
        "bench+a1", entry.replica_group, entry.version, cost_tables.Source.ONLINE, now, child.to_json_dict()
    )
    for e in (entry, fitted):
        cost_tables.add(store, e)
    return [entry.version, fitted.version]


def measure(args: list[str]) -> dict[str, float]:
    """Seconds of the server's warm-up and of each page's first render in this (fresh) process, landing page
    first."""
    from streamlit.testing.v1 import AppTest

    from sparkgate.dashboards import server

    seconds = {"server_warmup": round(server.warm(), 3)}
    sys.argv = ["app.py", *args]
    app = AppTest.from_file(str(Path(__file__).with_name("app.py")), default_timeout=600)
    for page in PAGES:
        if page != PAGES[0]:
            app.switch_page(f"views/{page}.py")
        start = time.perf_counter()
        app.run()
        seconds[page] = round(time.perf_counter() - start, 3)
        if app.exception:
            raise RuntimeError(f"{page}: {app.exception[0].message}")
    return seconds


def _measure_fresh(args: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "sparkgate.dashboards.bench", *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@click.command("dashboard")
@click.option("--labels", default=10_000_000, show_default=True, type=click.IntRange(min=1),
              help="Depth labels in the synthetic store.")  # fmt: skip
@click.option(
    "--keep",
    type=click.Path(file_okay=False),
    default=None,
    help="Build (or reuse) the store here instead of a temporary directory.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_dashboard(labels: int, keep: str | None, as_json: bool) -> None:
    """First render of each dashboard page, from a Parquet snapshot and from a DuckDB copy."""
    with tempfile.TemporaryDirectory(prefix="sparkgate-bench-dashboard-") as tmp:
        root = Path(keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        built = {"reused": True} if (root / "snapshots" / "CURRENT").exists() else build_store(root, labels)
        result: dict[str, Any] = {
            "store": built,
            "snapshot_s": _measure_fresh(["--snapshot-dir", str(root / "snapshots")]),
            "db_copy_s": _measure_fresh(["--db", str(root / "events.duckdb")]),
        }
    sources = ("snapshot", "db_copy")
    result["server_warmup_s"] = {k: result[f"{k}_s"].pop("server_warmup") for k in sources}
    result["landing_first_render_s"] = {k: result[f"{k}_s"]["rollout"] for k in sources}
    result["slowest_page_first_render_s"] = {k: max(result[f"{k}_s"].values()) for k in sources}
    result["peak_rss_mb"] = peak_rss_mb()  # the largest of this process and the page renders it ran
    click.echo(json.dumps(result) if as_json else json.dumps(result, indent=2))


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1:])))
