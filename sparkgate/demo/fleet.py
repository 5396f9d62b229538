"""The processes of a local fleet: one controller service and its replicas, always cleaned up.

``Fleet`` starts each child in its own session, logging to a file, so a Ctrl-C
reaches only the parent, which then stops the children in order: replicas
first (their last records still reach the controller), then the controller
(which closes the DuckDB file). On Linux every child also receives SIGTERM if
the parent dies without cleaning up (``PR_SET_PDEATHSIG``), so even a killed
demo or test leaves nothing running. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

# One thread per process: the replicas share a few cores, and OpenMP workers spin-waiting
# on oversubscribed cores make torch many times slower.
CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
STOP_TIMEOUT_S = 20.0
_PR_SET_PDEATHSIG = 1


class FleetError(RuntimeError):
    """A child failed to start or exited early; the message ends with its log's tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class Fleet:
    """Child processes by name; a context manager that stops them all on exit, whatever happened."""

    def __init__(self, logs_dir: Path):
        self.logs_dir = Path(logs_dir)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, Child] = {}
        self.python = sys.executable

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def spawn(self, name: str, argv: list[str]) -> Child:
        if name in self.children:
            raise ValueError(f"a child named {name!r} is already running")
        log_path = self.logs_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **CHILD_ENV},
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        child = self.children[name] = Child(name, process, log_path)
        return child

    def controller(
        self, db: Path, policy: Path, port: int, *, snapshot_dir: Path | None = None, prometheus: str | None = None
    ) -> str:
        """Start ``sparkgate serve`` and return its base URL once it answers."""
        argv = [
            self.python,
            "-m",
            "sparkgate",
            "serve",
            "--db",
            str(db),
            "--policy",
            str(policy),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        if snapshot_dir is not None:
            argv += ["--snapshot-dir", str(snapshot_dir)]
        if prometheus is not None:
            argv += ["--prometheus", prometheus]
        self.spawn("controller", argv)
        url = f"http://127.0.0.1:{port}"
        self.wait(lambda: answers(f"{url}/healthz"), 90.0, "the controller to answer /healthz", "controller")
        return url

    def replica(self, replica_id: str, url: str, **options) -> Child:
        """Start ``sparkgate replica``; ``options`` become its ``--flags``."""
        argv = [self.python, "-m", "sparkgate", "replica", "--controller", url, "--replica-id", replica_id]
        for key, value in options.items():
            if value is not None:
                argv += [f"--{key.replace('_', '-')}", str(value)]
        return self.spawn(replica_id, argv)

    def wait(self, ready: Callable[[], bool], timeout_s: float, what: str, *names: str) -> None:
        """Poll ``ready`` until true; FleetError if ``timeout_s`` passes or a child exits first."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            self.check(*names)
            if time.monotonic() > deadline:
                raise FleetError(f"gave up after {timeout_s:.0f} s waiting for {what}" + self._tails(names))
            time.sleep(0.2)

    def check(self, *names: str) -> None:
        """FleetError if one of ``names`` (default: every child) has exited."""
        for name in names or tuple(self.children):
            child = self.children[name]
            code = child.process.poll()
            if code is not None:
                raise FleetError(f"{name} exited with status {code}" + self._tails([name]))

    def _tails(self, names) -> str:
        return "".join(
            f"\n--- last lines of {self.children[n].log_path} ---\n{self.children[n].tail()}"
            for n in names or self.children
            if n in self.children
        )

    def signal(self, name: str, sig: int) -> None:
        self.children[name].process.send_signal(sig)

    def stop(self, name: str, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit status."""
        child = self.children.pop(name)
        process = child.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def close(self) -> None:
        """Stop every child, replicas before the controller, in parallel within each group."""
        replicas = [n for n in self.children if n != "controller"]
        for name in replicas:
            if self.children[name].process.poll() is None:
                self.children[name].process.terminate()
        for name in replicas:
            self.stop(name)
        if "controller" in self.children:
            self.stop("controller")


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now."""
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False
