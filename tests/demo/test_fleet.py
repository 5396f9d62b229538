"""The demo's process supervisor."""

from __future__ import annotations

import sys

import pytest

from sparkgate.demo.fleet import Fleet, FleetError


def test_the_fleet_stops_its_children_even_when_the_caller_fails(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), Fleet(tmp_path) as fleet:
        child = fleet.spawn("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
        raise RuntimeError("boom")
    assert child.process.poll() is not None


def test_a_child_that_exits_early_is_reported_with_its_log(tmp_path):
    with Fleet(tmp_path) as fleet:
        fleet.spawn("broken", [sys.executable, "-c", "print('cannot bind'); raise SystemExit(3)"])
        with pytest.raises(FleetError, match="broken exited with status 3(.|\n)*cannot bind"):
            fleet.wait(lambda: False, 30.0, "something", "broken")
