"""The replica's spool: records wait on disk, in order, while the controller is unreachable; nothing
acknowledged is lost, nothing is stored twice, and what the bound drops is counted."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.synth import synthetic_wire
from sparkgate.verify_runtime.spool import Spool, ndjson
from tests.conftest import T0


def records(n: int, first: int = 0):
    from sparkgate.collectors.schema import StepRecord

    wire = synthetic_wire(n, 2, 4, "r0", first_step=first, seed=first, ts=T0)
    return [StepRecord.from_dict(d) for d in wire.to_pylist()]


def test_segments_replay_oldest_first_and_only_acknowledged_ones_leave(tmp_path):
    spool = Spool(tmp_path)
    spool.append(records(3))
    spool.append(records(2, first=3))
    assert spool.waiting == 5 and len(spool.segments()) == 2
    posted, calls = [], []

    def flaky(body: bytes):
        calls.append(body)
        if len(calls) == 2:
            raise httpx.ConnectError("controller down")
        posted.append(body)

    with pytest.raises(httpx.ConnectError):
        spool.replay(flaky)
    assert [b.count(b"\n") for b in posted] == [3] and spool.waiting == 2 and len(spool.segments()) == 1
    assert spool.replay(posted.append) == 2 and spool.waiting == 0 and spool.segments() == []
    steps = [r["step_id"] for body in posted for r in from_wire_body(body)]
    assert steps == [0, 1, 2, 3, 4]


def from_wire_body(body: bytes):
    from sparkgate.collectors.wire import from_ndjson

    return from_ndjson(body).wire.to_pylist()


def test_a_write_the_process_did_not_finish_is_not_replayed(tmp_path):
    (tmp_path / "seg-000000001.tmp").write_bytes(b'{"partial": ')
    spool = Spool(tmp_path)
    assert spool.waiting == 0 and not list(tmp_path.glob("*.tmp"))


def test_past_its_bound_the_spool_drops_the_oldest_and_counts_them(tmp_path):
    one = len(ndjson(records(4)))
    spool = Spool(tmp_path, max_bytes=int(2.5 * one))  # two segments fit, three do not
    for i in range(4):
        spool.append(records(4, first=4 * i))
    assert spool.dropped == 8 and spool.waiting == 8 and len(spool.segments()) == 2
    assert from_wire_body(spool.segments()[0].read_bytes())[0]["step_id"] == 8  # the newest are kept


def test_a_segment_is_durable_when_append_returns(tmp_path, monkeypatch):
    # The rename lives in the directory: until the directory is synced, a power loss can undo it, and the
    # records the replica counted as spooled vanish.
    import os

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    Spool(tmp_path).append(records(2))
    (segment,) = tmp_path.glob("seg-*.ndjson")
    assert synced == [str(segment.with_suffix(".tmp")), str(tmp_path)]


@given(st.integers(0, 30), st.integers(1, 5000))
@settings(max_examples=40, deadline=None)
def test_bodies_split_records_in_order_under_the_bound(n, max_bytes):
    from sparkgate.verify_runtime.spool import bodies

    held = records(n)
    split = bodies(held, max_bytes)
    assert b"".join(body for body, _ in split) == ndjson(held)
    assert [r for _, chunk in split for r in chunk] == held
    for body, chunk in split:
        assert body == ndjson(chunk) and (len(body) <= max_bytes or len(chunk) == 1)


def test_the_spools_a_restarted_replica_left_behind_are_found(tmp_path):
    """A replica named by default (host and pid) spools under a new name after a restart: what the last run
    spooled waited unseen under the old one."""
    from sparkgate.verify_runtime.spool import left_behind

    root = tmp_path / "spool"
    Spool(root / "replica-h-101").append(records(3))
    Spool(root / "replica-h-102")  # empty: nothing waits there
    own = Spool(root / "replica-h-103")
    own.append(records(2, first=10))
    assert left_behind(root, root / "replica-h-103") == {root / "replica-h-101": 3}
    assert left_behind(tmp_path / "none", root) == {}
