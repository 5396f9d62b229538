"""``sparkgate replica`` as a user runs it, against a real controller service on 127.0.0.1, with the
shipped models: a closed-loop run, an open-loop run with /metrics and a fault fired by SIGUSR1, and
the usage errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch
from click.testing import CliRunner

from sparkgate.cli import main
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.controller.service import create_app
from sparkgate.controller.supervisor import Controller
from sparkgate.demo.fleet import answers, free_port
from sparkgate.policies.cost_profile import hardware_fingerprint
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.verify_runtime.faults import FOREIGN_COST_TABLE
from tests.verify_runtime.refusals import refused

POLICY = parse_rollout_policy(
    {"gates": [{"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True}]}
)


@pytest.fixture
def service(tmp_path):
    with Store(tmp_path / "replica.duckdb") as store:
        controller = Controller(store, POLICY, metrics=Metrics(), resamples=20)
        with serve_in_thread(create_app(controller, Ingestor(store))) as url:
            yield controller, url


@pytest.fixture
def keep_threads():
    """The command sets torch's threads and its own signal handlers; the test process gets its own back."""
    before = torch.get_num_threads()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    torch.set_num_threads(before)
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def test_a_closed_loop_replica_serves_its_requests_and_posts_every_step(service, keep_threads, tmp_path):
    controller, url = service
    args = ["replica", "--controller", url, "--replica-id", "cli-a", "--requests", "6", "--max-new-tokens", "8",
            "--spool-dir", str(tmp_path / "spool")]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["replica_id"] == "cli-a" and summary["finished"] == 6 and summary["phase"] == "baseline"
    assert summary["posted"] == summary["steps"] > 0 and "arrived" not in summary
    stored = controller.store.query("SELECT count(*) AS n FROM steps WHERE replica_id = 'cli-a'").column("n")
    assert stored[0].as_py() == summary["steps"]


def test_an_open_loop_replica_serves_metrics_and_fires_its_fault_on_sigusr1(service, tmp_path):
    _, url = service
    port = free_port()
    argv = [sys.executable, "-m", "sparkgate", "replica", "--controller", url, "--replica-id", "cli-b",
            "--rate", "20", "--max-new-tokens", "8", "--metrics-port", str(port),
            "--fault", "cost-table", "--out-dir", str(tmp_path), "--spool-dir", str(tmp_path / "spool")]  # fmt: skip
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not answers(f"http://127.0.0.1:{port}/metrics"):
            assert child.poll() is None and time.monotonic() < deadline, child.stderr.read() if child.stderr else ""
            time.sleep(0.5)
        child.send_signal(signal.SIGUSR1)
        table = tmp_path / "foreign_cost_table.json"
        while not table.exists():
            assert time.monotonic() < deadline, "the cost-table fault never fired"
            time.sleep(0.2)
        time.sleep(1.0)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
    assert child.returncode == 0, err[-3000:]
    assert "fault fired: cost-table" in err and "refused" in err  # the foreign fingerprint was refused, then forced
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["arrived"] > 0 and summary["steps"] > 0 and summary["posted"] == summary["steps"]
    assert "sparkgate_replica_arrival_rate" in metrics and 'sparkgate_rollout_phase{phase="baseline"} 1.0' in metrics
    assert (
        "sparkgate_replica_spooled_records 0.0" in metrics and "sparkgate_replica_dropped_records_total 0.0" in metrics
    )


def test_usage_errors_name_what_was_wrong(keep_threads):
    drift = CliRunner().invoke(main, ["replica", "--fault", "drift"])
    assert drift.exit_code == 2 and "--fault drift" in drift.output and "--rate" in drift.output
    gone = CliRunner().invoke(main, ["replica", "--controller", f"http://127.0.0.1:{free_port()}"])
    assert gone.exit_code == 1 and "unreachable" in gone.output


def test_a_replica_refuses_an_sts_file_or_cost_table_made_for_another_drafter_or_target(tmp_path, keep_threads):
    from sparkgate.policies.calibration import STS

    foreign_sts = tmp_path / "sts.json"
    STS([1.0] * 7, drafter="dspark-000000000000").save(foreign_sts)
    unreachable = ["--controller", f"http://127.0.0.1:{free_port()}", "--gamma", "7"]
    refused = CliRunner().invoke(main, ["replica", *unreachable, "--sts", str(foreign_sts)])
    assert refused.exit_code == 2 and "fitted for drafter dspark-000000000000" in refused.output

    table = tmp_path / "table.json"  # measured on this machine, but for another target and drafter
    meta = {**FOREIGN_COST_TABLE["meta"], "hardware": hardware_fingerprint("cpu")}
    table.write_text(json.dumps({**FOREIGN_COST_TABLE, "meta": meta}))
    refused = CliRunner().invoke(main, ["replica", *unreachable, "--cost-table", str(table)])
    assert refused.exit_code == 2 and "other-model" in refused.output


@pytest.mark.parametrize(
    ("args", "option", "named"),
    [
        (["--gamma", "9"], "--gamma", "9 is beyond the drafter's max_gamma"),
        (["--max-new-tokens", "500"], "--max-new-tokens", "prompts of 96 tokens, --max-new-tokens 500 and gamma 7"),
        (["--rate", "1", "--fault", "load-shift", "--max-new-tokens", "200"], "--max-new-tokens", "prompts of 384"),
        (["--spool-dir", "FILE/spool"], "--spool-dir", "is not a directory"),
        (["--fault", "cost-table", "--out-dir", "FILE/out"], "--out-dir", "is not a directory"),
        (["--rate", "1", "--amplitude", "1"], "--amplitude", "1.0 is not in the range 0<=x<1"),
        (["--window", "-1"], "--window", "-1 is not in the range x>=0"),
        (["--seed", "-1"], "--seed", "-1 is not in the range 0<=x<=4294967295"),
        (["--threads", "0"], "--threads", "0 is not in the range x>=1"),
        # Ids the controller refuses: every record sent would be quarantined (a non-UTF-8 byte in argv
        # arrives as a lone surrogate).
        (["--replica-id", "gpu-\udcff"], "--replica-id", "not valid Unicode"),
        (["--replica-id", "gpu\u202e1"], "--replica-id", "no control or bidirectional-format characters"),
        (["--replica-id", "r" * 513], "--replica-id", "at most 512 characters"),
    ],
)
def test_bad_input_is_refused_before_the_replica_serves_or_calls_its_controller(
    tmp_path, keep_threads, args, option, named
):
    (tmp_path / "file").write_text("not a directory")
    args = [a.replace("FILE", str(tmp_path / "file")) for a in args]
    # An unreachable controller: each refusal must come before the replica asks it anything.
    unreachable = ["--controller", f"http://127.0.0.1:{free_port()}", "--gamma", "7"]
    output = refused(["replica", *unreachable, "--spool-dir", str(tmp_path / "spool"), *args])
    assert f"'{option}'" in output and named in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
