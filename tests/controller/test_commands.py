"""The controller's commands through click, against a DuckDB file and a live loopback service; the evaluation loop."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.controller import commands, ledger
from sparkgate.controller.commands import evaluate_forever
from sparkgate.controller.service import create_app, listen
from sparkgate.controller.supervisor import Controller
from sparkgate.demo.fleet import Fleet, free_port
from sparkgate.policies.rollout import DEFAULT_PATH, load_rollout_policy, parse_rollout_policy
from tests.collectors.loopback import scripted_server
from tests.collectors.otlp_receiver import attributes, otlp_receiver
from tests.collectors.strategies import compact_row, step
from tests.conftest import T0, ingest_synthetic

TOKEN = "cli-token"


def run(*args, env=None):
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "report.duckdb"
    with Store(path) as store:
        ingest_synthetic(store, 20, T0, phase="baseline")
        ingest_synthetic(store, 20, T0 + 100, phase="canary", first_step=20)
    return str(path)


def test_report_prints_per_depth_ece_utilization_misses_latency_and_throughput(db):
    result = run("report", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert set(body["calibration"]["survival"]) == {str(d) for d in range(1, 8)}
    # Each depth's ECE is the plug-in one (15 equal-width bins) of the full-block modes' observed labels,
    # recomputed here from the stored rows.
    with Store(db) as store:
        rows = store.query("SELECT depth, survival, label FROM depth_labels WHERE label IS NOT NULL AND "
                           "mode::VARCHAR IN ('static', 'shadow', 'cap_accept')").to_pylist()  # fmt: skip
    for depth, figures in body["calibration"]["survival"].items():
        p = np.array([r["survival"] for r in rows if r["depth"] == int(depth)])
        y = np.array([r["label"] for r in rows if r["depth"] == int(depth)], dtype=float)
        bins = np.minimum((p * 15).astype(int), 14)
        ece = sum((bins == b).mean() * abs(p[bins == b].mean() - y[bins == b].mean()) for b in set(bins.tolist()))
        assert figures["samples"] == len(p) > 0 and figures["ece"] == pytest.approx(ece, abs=1e-12)
    assert body["utilization"]["upper_bound"]["samples"] > 0
    assert body["tiers"]["miss_rate"] == 0.0 and body["throughput"]["steps"] == 40
    assert body["latency"]["32-63"]["steps"] == 40 and body["gates"]["survival_ece"]["samples"] > 0
    assert "p99_step_ratio" not in body["gates"]  # a comparison with its concurrent control: in the verdicts only
    assert [(s["source"], s["steps"], s["cannot_feed"]) for s in body["sources"]] == [("runtime", 40, {})]


def test_report_window_and_slices(db):
    body = json.loads(run("report", "--db", db, "--since", str(T0 + 50), "--by", "replica", "--json").output)
    assert body["throughput"]["steps"] == 20 and body["window"]["since"] == T0 + 50
    assert list(body["slices"]) == ["r0"]
    iso = json.loads(run("report", "--db", db, "--since", "2025-06-15T15:08:00", "--json").output)
    assert iso["window"]["since"] == 1750000080.0
    bad = CliRunner().invoke(main, ["report", "--db", db, "--since", "yesterday"])
    assert bad.exit_code == 2 and "Invalid value for '--since': 'yesterday': expected unix seconds" in bad.output
    both = CliRunner().invoke(main, ["report", "--db", db, "--controller", "http://127.0.0.1:1"])
    assert both.exit_code == 2 and "exactly one of --db or --controller" in both.output


def test_serve_refuses_a_public_bind_without_a_token(tmp_path):
    result = CliRunner().invoke(
        main, ["serve", "--db", str(tmp_path / "x.duckdb"), "--host", "0.0.0.0"], env={"SPARKGATE_TOKEN": ""}
    )
    assert result.exit_code == 2 and "needs an operator token" in result.output


def test_serve_exports_a_span_per_ingested_step_over_otlp(tmp_path, monkeypatch):
    """The real command in its own process: records in over HTTP, spans out over OTLP, flushed on shutdown."""
    with otlp_receiver() as (traces_url, received):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces_url)
        with Fleet(tmp_path / "logs") as fleet:
            url = fleet.controller(tmp_path / "s.duckdb", DEFAULT_PATH, free_port())
            body = "".join(
                json.dumps(step(i, requests=[compact_row(request_id=f"r{i}")]).to_dict()) + "\n" for i in (1, 2, 3)
            )
            posted = httpx.post(
                f"{url}/v1/records", content=body, headers={"content-type": "application/x-ndjson"}, timeout=10
            )
            assert posted.status_code == 200, posted.text
            # SIGTERM, as a process manager stops it: serve still exports the spans it batched.
            assert fleet.stop("controller") == 143
        spans = received.wait_for(3)
    assert sorted(attributes(span)["sparkgate.step_id"] for _, span in spans) == [1, 2, 3]
    assert {resource["service.name"] for resource, _ in spans} == {"sparkgate-controller"}


def test_status_and_operator_commands_talk_to_a_running_controller(tmp_path):
    with Store(tmp_path / "live.duckdb") as store:
        controller = Controller(store, load_rollout_policy(), metrics=Metrics(), clock=lambda: T0)
        app = create_app(controller, Ingestor(store), token=TOKEN)
        with serve_in_thread(app) as url:
            env = {"SPARKGATE_CONTROLLER": url, "SPARKGATE_TOKEN": TOKEN}
            status = json.loads(run("status", env=env).output)
            assert status["policy"]["phase"] == "baseline" and status["recent_decisions"][0]["action"] == "start"
            promoted = json.loads(run("promote", "--operator", "ops", "--note", "go", env=env).output)
            assert (promoted["phase_to"], promoted["operator"]) == ("shadow", "ops")
            denied = CliRunner().invoke(main, ["abort", "--operator", "ops"], env={**env, "SPARKGATE_TOKEN": "no"})
            assert denied.exit_code == 1 and "403" in denied.output
            assert json.loads(run("abort", "--operator", "ops", env=env).output)["phase_to"] == "fallback"
            refused = CliRunner().invoke(main, ["abort", "--operator", "ops"], env=env)
            assert refused.exit_code == 1 and "409: abort: already in fallback" in refused.output
            assert json.loads(run("resume", "--operator", "ops", env=env).output)["phase_to"] == "shadow"
            # A promote run again with the revision it acted on cannot climb a second rung.
            at = json.loads(run("status", env=env).output)["policy"]["revision"]
            assert json.loads(run("promote", "--operator", "ops", "--revision", str(at), env=env).output)["revision"]
            again = CliRunner().invoke(main, ["promote", "--operator", "ops", "--revision", str(at)], env=env)
            assert again.exit_code == 1 and f"409: promote: revision {at} is no longer in force" in again.output
            assert json.loads(run("pause", "--operator", "ops", env=env).output)["phase_to"] == "paused"
            assert json.loads(run("resume", "--operator", "ops", env=env).output)["phase_to"] == "canary"
            remote = json.loads(run("report", "--controller", url, "--json").output)
            assert "calibration" in remote


def test_the_evaluation_loop_ticks_until_stopped(store):
    fast = parse_rollout_policy({"evaluation_interval_s": 0.01, "progress_deadline_s": 60})
    ctl = Controller(store, fast, resamples=10)
    stop = threading.Event()
    loop = threading.Thread(target=evaluate_forever, args=(ctl, stop))
    loop.start()
    try:
        for _ in range(10_000):
            if len(ledger.decisions(store)) >= 3:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        loop.join()
    assert [d.action for d in ledger.decisions(store)][:3] == ["start", "hold", "hold"]


def test_serve_refuses_a_webhook_whose_secret_is_not_in_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKGATE_TEST_HOOK", raising=False)
    policy = tmp_path / "rollout.yaml"
    policy.write_text("notify:\n  - {url_env: SPARKGATE_TEST_HOOK, format: slack}\n")
    result = CliRunner().invoke(main, ["serve", "--db", str(tmp_path / "c.duckdb"), "--policy", str(policy)])
    assert result.exit_code == 2
    assert "notify[0].url_env: environment variable SPARKGATE_TEST_HOOK is not set" in result.output
    assert not (tmp_path / "c.duckdb").exists()  # refused before anything was written


def test_serve_on_a_port_in_use_says_so_in_one_line_before_opening_the_store(tmp_path):
    db = tmp_path / "s.duckdb"
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", "--db", str(db), "--port", str(port)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        f"Error: --host/--port 127.0.0.1:{port}: cannot listen there (Address already in use)"
    ]
    assert not db.exists()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--sglang", "not a url"], "Invalid value for '--sglang': 'not a url'"),
        (["--prometheus", "prometheus:9090"], "Invalid value for '--prometheus': 'prometheus:9090'"),
        (["--otlp-endpoint", "http://otel:99999"], "Invalid value for '--otlp-endpoint': 'http://otel:99999'"),
        (["--token", ""], "Invalid value for '--token': '' is empty"),
        (["--cost-table-version", ""], "Invalid value for '--cost-table-version': '' is empty"),
        (["--sts-version", ""], "Invalid value for '--sts-version': '' is empty"),
    ],
)
def test_serve_refuses_bad_input_before_binding_or_opening_the_store(tmp_path, argv, named):
    db = tmp_path / "s.duckdb"
    # A port in use, so that a serve that did not refuse stops at the bind instead of serving.
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = str(held.getsockname()[1])
        result = CliRunner().invoke(main, ["serve", "--db", str(db), "--port", port, *argv])
    assert result.exit_code == 2 and named in result.output, result.output
    assert "Traceback" not in result.output and "listening" not in result.output
    assert not db.exists()


def test_serve_refuses_a_policy_whose_gates_read_prometheus_without_its_url(tmp_path):
    policy = tmp_path / "rollout.yaml"
    policy.write_text("gates:\n  - {name: p99, metric: p99_step_ratio, promql: 'max(up)', threshold: 1.1, "
                      "direction: at_most}\n")  # fmt: skip
    db = tmp_path / "s.duckdb"
    result = CliRunner().invoke(main, ["serve", "--db", str(db), "--policy", str(policy)])
    assert result.exit_code == 2 and "Invalid value for --prometheus: the policy's gates p99 read Prometheus" in (
        result.output
    ), result.output
    assert "Traceback" not in result.output and not db.exists()


def test_serve_refuses_a_snapshot_dir_under_a_file_before_binding_or_opening_the_store(tmp_path):
    db = tmp_path / "s.duckdb"
    (tmp_path / "file").write_text("not a folder\n")
    with socket.create_server(("127.0.0.1", 0)) as held:  # a serve that did not refuse stops at the bind
        port = str(held.getsockname()[1])
        result = CliRunner().invoke(
            main, ["serve", "--db", str(db), "--port", port, "--snapshot-dir", str(tmp_path / "file" / "snaps")]
        )
    assert result.exit_code == 2 and "Invalid value for '--snapshot-dir'" in result.output, result.output
    assert "Traceback" not in result.output and "listening" not in result.output
    assert not db.exists()


def test_serve_exits_3_when_the_server_does_not_start_and_closes_what_it_opened(tmp_path, monkeypatch):
    db = tmp_path / "s.duckdb"
    bound: list[socket.socket] = []

    def recorded(host: str, port: int) -> list[socket.socket]:
        bound.extend(listen(host, port))
        return bound

    monkeypatch.setattr(commands, "listen", recorded)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)  # returns, never started
    result = CliRunner().invoke(main, ["serve", "--db", str(db), "--port", "0"])
    assert result.exit_code == 3, result.output
    assert "listening" in result.output and "Traceback" not in result.output
    assert bound and [s.fileno() for s in bound] == [-1] * len(bound)
    # Another process can take the file's lock: the store was closed (this process could reopen it regardless).
    opened = subprocess.run(
        [sys.executable, "-c", "import sys; from sparkgate.collectors.store import Store; Store(sys.argv[1]).close()",
         str(db)], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr


CLOSED = "http://127.0.0.1:1"  # nothing listens there: a command that did not refuse would fail to connect


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["status", "--controller", "127.0.0.1:8470"], "Invalid value for '--controller': '127.0.0.1:8470'"),
        (["status", "--controller", CLOSED, "--decisions", "-1"], "Invalid value for '--decisions': -1"),
        (["status", "--controller", CLOSED, "--decisions", "10001"], "Invalid value for '--decisions': 10001"),
        (["promote", "--controller", CLOSED, "--operator", ""], "Invalid value for '--operator': ''"),
        (["abort", "--controller", CLOSED, "--operator", "ops", "--note", "n" * 2001],
         "Invalid value for '--note': 'nnnnn"),
        (["pause", "--controller", CLOSED, "--operator", "ops", "--token", ""], "Invalid value for '--token': ''"),
        (["resume", "--controller", "http://[::1", "--operator", "ops"], "Invalid value for '--controller'"),
        (["report", "--controller", "localhost"], "Invalid value for '--controller': 'localhost'"),
        (["report", "--controller", CLOSED, "--phase", "shadow"], "--phase needs --db"),
        (["cost-table", "revert", "--controller", CLOSED, "--operator", ""], "Invalid value for '--operator': ''"),
    ],
)  # fmt: skip
def test_client_commands_refuse_bad_input_before_asking_the_controller(argv, named):
    result = CliRunner().invoke(main, argv, env={"SPARKGATE_TOKEN": None, "SPARKGATE_CONTROLLER": None})
    assert result.exit_code == 2 and named in result.output, result.output
    assert "Traceback" not in result.output and CLOSED not in result.output and not result.stdout


def test_report_takes_a_phase_of_the_ladder_only(db):
    before = Path(db).read_bytes()
    result = CliRunner().invoke(main, ["report", "--db", db, "--phase", "canery"])
    assert result.exit_code == 2 and "Invalid value for '--phase': 'canery' is not one of 'baseline'" in result.output
    assert "Traceback" not in result.output and Path(db).read_bytes() == before
    assert json.loads(run("report", "--db", db, "--phase", "paused", "--json").output)["gates"]


def test_a_server_that_is_not_a_controller_is_named_in_one_line():
    with scripted_server("/v1/status", ["<html>\n<p>a dashboard</p>\n</html>"], content_type="text/html") as url:
        result = CliRunner().invoke(main, ["status", "--controller", url])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        f"Error: {url}/v1/status answered '<html> <p>a dashboard</p> </html>', not JSON: is a sparkgate controller "
        "there?"
    ]
