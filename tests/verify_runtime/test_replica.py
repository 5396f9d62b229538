"""A runtime replica following a real controller service on 127.0.0.1 (tiny models, real DuckDB file)."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from sparkgate.collectors import cost_tables
from sparkgate.collectors.ingest import Ingestor
from sparkgate.collectors.ingest_api import serve_in_thread
from sparkgate.collectors.metrics import Metrics
from sparkgate.collectors.store import Store
from sparkgate.controller.service import create_app
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import parse_rollout_policy
from sparkgate.policies.window import CostAwareScheduler, FixedWindow
from sparkgate.verify_runtime.consistency import (
    GreedyReplay,
    unit_hash,
)
from sparkgate.verify_runtime.controller_client import ControllerClient
from sparkgate.verify_runtime.drafters import ModelDrafter
from sparkgate.verify_runtime.engine import Engine, EngineConfig, Request
from sparkgate.verify_runtime.replica import Replica, mode_for, workload_requests
from sparkgate.verify_runtime.spool import Spool, ndjson
from tests.conftest import policy_payload, tiny_model
from tests.controller.timed_steps import STATIC, scaled

GAMMA = 4
pytestmark = pytest.mark.usefixtures("one_thread")
POLICY = parse_rollout_policy(
    {
        "gamma": GAMMA,
        "canary_steps": [0.5],
        "observe_fraction": 0.2,
        "gates": [{"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True}],
        # Epochs short enough that one test run serves several of each arm.
        "comparison": {"epoch_s": 0.1, "burn_in_s": 0.0},
    }
)


def payload(phase, fraction=0.0, observe=0.2, fallback_window=GAMMA):
    return policy_payload(phase, fraction, observe_fraction=observe, fallback_window=fallback_window, gamma=GAMMA)


def test_mode_follows_a_stable_hash_against_the_fractions():
    ids = [f"req-{i}" for i in range(4000)]
    assert {mode_for(i, payload("baseline")) for i in ids} == {"static"}
    assert {mode_for(i, payload("shadow")) for i in ids} == {"shadow"}
    assert {mode_for(i, payload("fallback")) for i in ids} == {"static"}
    assert {mode_for(i, payload("fallback", fallback_window=1)) for i in ids} == {"compact"}
    canary = Counter(mode_for(i, payload("canary", 0.25)) for i in ids)
    assert canary["shadow"] / len(ids) == pytest.approx(0.75, abs=0.03)
    assert canary["cap_accept"] / (canary["compact"] + canary["cap_accept"]) == pytest.approx(0.2, abs=0.05)
    # Growing the fraction only moves requests into the compact arm, never out of it.
    wider = {i: mode_for(i, payload("canary", 0.5)) for i in ids}
    assert all(wider[i] != "shadow" for i in ids if mode_for(i, payload("canary", 0.25)) != "shadow")
    assert unit_hash("req-1", "arm") == unit_hash("req-1", "arm") != unit_hash("req-1", "observe")


@pytest.fixture
def controller(tmp_path):
    with Store(tmp_path / "fleet.duckdb") as store:
        controller = Controller(store, POLICY, metrics=Metrics(), resamples=20)
        with serve_in_thread(create_app(controller, Ingestor(store))) as url:
            yield controller, url


def requests(prefix: str, n: int) -> list[Request]:
    return [Request(f"{prefix}-{i}", [(7 * i + k) % 32 for k in range(6)], 10, task="test") for i in range(n)]


def make_replica(url: str, replay_model=None, replica_id: str = "rep-a", state_every: int = 3) -> Replica:
    target = tiny_model()
    drafter = ModelDrafter(target, noise=1.5)
    engine = Engine(target, drafter, EngineConfig(gamma=GAMMA, max_batch=4, replica_id=replica_id))
    replay = GreedyReplay(replay_model or target, ModelDrafter(replay_model or target, noise=1.5), GAMMA)
    return Replica(
        engine,
        ControllerClient(url),
        FixedWindow(2),
        replay=replay,
        consistency_fraction=1.0,
        state_every=state_every,
        poll_s=0.0,
        flush_steps=4,
    )


def test_replica_follows_the_policy_and_its_records_are_stored(controller):
    ctl, url = controller
    replica = make_replica(url)
    baseline = replica.serve(requests("b", 6))
    assert baseline["phase"] == "baseline" and baseline["finished"] == 6 and baseline["posted"] == baseline["steps"]
    rows = ctl.store.query("SELECT DISTINCT phase, policy_revision FROM steps").to_pylist()
    assert rows == [{"phase": "baseline", "policy_revision": 1}]
    assert set(ctl.store.query("SELECT DISTINCT mode::VARCHAR AS m FROM requests").column("m").to_pylist()) == {
        "static"
    }
    for _ in range(2):
        ctl.act("promote", "ops")
    canary = replica.serve(requests("c", 24))
    assert canary["phase"] == "canary" and canary["revision"] == 3
    modes = ctl.store.query(
        "SELECT s.arm, list(DISTINCT r.mode::VARCHAR) AS m FROM requests r JOIN steps s USING (replica_id, step_id) "
        "WHERE s.step_id >= ? GROUP BY 1",
        [baseline["steps"]],
    ).to_pylist()
    by_arm = {r["arm"]: set(r["m"]) for r in modes}
    assert by_arm["control"] == {"static"} and by_arm["treatment"] >= {"compact", "shadow"}  # switchback epochs
    served = ctl.store.query("SELECT count(*) AS n FROM request_records WHERE request_id LIKE 'c-%'")
    assert served.column("n")[0].as_py() == 24  # every request posted its record
    assert canary["checks"] > 0 and canary["mismatches"] == 0
    checks = ctl.store.query(
        "SELECT kind, count(*) AS n, count(mismatch_at) AS bad FROM consistency_checks GROUP BY kind ORDER BY kind"
    ).to_pylist()
    assert [(c["kind"], c["bad"]) for c in checks] == [("greedy_replay", 0), ("state_rollback", 0)]
    assert sum(c["n"] for c in checks) == canary["checks"]
    assert ControllerClient(url).next_step_id("rep-a") == canary["steps"]  # counters span both runs


def test_a_replay_mismatch_rolls_the_fleet_back_to_static(controller):
    ctl, url = controller
    for _ in range(2):
        ctl.act("promote", "ops")
    broken = make_replica(url, replay_model=tiny_model(seed=1))  # stands in for a compact/static divergence
    served = broken.serve(requests("m", 12))
    assert served["mismatches"] > 0
    decision = ctl.tick()
    assert (decision.action, decision.outcome, decision.phase_to) == ("rollback", "critical", "fallback")
    after = broken.serve(requests("f", 4))
    assert after["phase"] == "fallback"
    modes = ctl.store.query("SELECT DISTINCT mode::VARCHAR AS m FROM requests WHERE request_id LIKE 'f-%'")
    assert modes.column("m").to_pylist() == ["static"]


def test_a_gamma_the_replica_does_not_run_is_refused(controller):
    _, url = controller
    replica = make_replica(url)
    with pytest.raises(RuntimeError, match="policy gamma=4 but this replica runs gamma=3"):
        replica.engine.config.gamma = 3
        replica.poll(force=True)


def test_a_replica_spools_through_an_outage_and_loses_nothing(controller, tmp_path):
    ctl, url = controller
    replica = make_replica(url)
    replica.spool = Spool(tmp_path / "spool")
    replica.request_spool = Spool(tmp_path / "spool" / "requests")
    client = replica.client
    real_records, real_body = client.post_records, client.post_body

    def down(*_):
        raise httpx.ConnectError("controller down")

    client.post_records = client.post_body = down
    served = replica.serve(requests("outage", 8))
    assert served["posted"] == 0 and served["dropped"] == 0 and replica.spool.waiting == served["steps"] > 0
    assert ctl.store.counts()["steps"] == 0

    def lost_answer(body, *route):  # the controller commits, then the connection drops before the answer
        real_body(body, *route)
        raise httpx.ReadError("connection reset")

    client.post_body = lost_answer
    replica.flush()
    assert replica.spool.waiting == served["steps"]  # not acknowledged: kept
    client.post_records, client.post_body = real_records, real_body
    replica.flush()
    assert replica.spool.waiting == 0 and replica.stats["posted"] == served["steps"]
    steps = ctl.store.query("SELECT step_id FROM steps ORDER BY step_id").column("step_id").to_pylist()
    assert steps == list(range(served["steps"]))  # every step once, in order
    assert ctl.store.counts()["quarantine"] > 0  # the repeats of the segment whose answer was lost
    assert replica.request_spool.waiting == 0 and replica.stats["request_records"] == 8
    assert ctl.store.counts()["request_records"] == 8  # each request's record once, through the same outage


def test_a_backlog_without_a_spool_goes_in_bodies_under_the_bound_and_none_is_posted_twice(controller, monkeypatch):
    """Posted whole, ten thousand waiting records (about 99 MiB at batch 16) passed the route's 64 MiB limit
    and were refused at every retry, the oldest dropped each time."""
    import sparkgate.verify_runtime.replica as replica_module

    ctl, url = controller
    replica = make_replica(url)
    client, sizes = replica.client, []
    real = client.post_body

    def down(*_):
        raise httpx.ConnectError("controller down")

    client.post_body = down
    served = replica.serve(requests("backlog", 8))
    assert len(replica.pending) == served["steps"] > 4 and ctl.store.counts()["steps"] == 0
    monkeypatch.setattr(replica_module, "MAX_POST_BYTES", len(ndjson(replica.pending)) // 3)

    def answered_twice(body, *route):  # the third body's post fails: the two before are delivered
        sizes.append(len(body))
        if len(sizes) == 3:
            raise httpx.ReadTimeout("timed out")
        return real(body, *route)

    client.post_body = answered_twice
    replica.flush()
    assert ctl.store.counts()["steps"] > 0 and replica.pending and max(sizes) <= replica_module.MAX_POST_BYTES
    client.post_body = real
    replica.flush()
    assert not replica.pending and replica.stats["posted"] == served["steps"]
    assert ctl.store.counts()["steps"] == served["steps"] and ctl.store.counts()["quarantine"] == 0


def test_consistency_checks_wait_through_a_failed_post_and_go_in_bodies_the_route_takes(controller, monkeypatch):
    """A mismatch is the critical gate's evidence: one failed post must not lose it, nor end the replica."""
    import sparkgate.verify_runtime.replica as replica_module

    ctl, url = controller
    for _ in range(2):
        ctl.act("promote", "ops")
    broken = make_replica(url, replay_model=tiny_model(seed=1))  # every replay mismatches
    client = broken.client
    real_checks, real_committed = client.post_checks, client.committed

    def down(*_):
        raise httpx.ConnectError("controller down")

    client.post_checks = client.committed = down
    served = broken.serve(requests("c", 8))  # the step posts succeed; every check post fails
    assert served["checks"] == 0 and broken.checked and broken.to_check
    stored = "SELECT count(*) AS n FROM consistency_checks"
    assert ctl.store.query(stored).column("n")[0].as_py() == 0
    client.committed = real_committed
    monkeypatch.setattr(replica_module, "MAX_CHECKS_PER_REPORT", 2)  # several bodies
    sizes = []
    client.post_checks = lambda rid, checks: (sizes.append(len(checks)), real_checks(rid, checks))[1]
    broken.flush()
    assert not broken.checked and not broken.to_check and max(sizes) == 2 and len(sizes) > 1
    assert broken.stats["mismatches"] > 0
    assert ctl.store.query(stored).column("n")[0].as_py() == broken.stats["checks"]
    assert ctl.tick().action == "rollback"  # the critical gate saw the mismatches


def test_cancelled_requests_free_their_state_and_post_whole_records(controller):
    ctl, url = controller
    replica = make_replica(url, replica_id="rep-c")
    batch = requests("leave", 8)
    for r in batch[::2]:
        r.cancel_after = 3  # these clients walk away after three tokens
    served = replica.serve(batch)
    assert served["cancelled"] == 4 and served["finished"] == 8 and not replica.engine.active
    assert replica.engine.cache.free_slots == replica.engine.config.max_batch
    rows = ctl.store.query(
        "SELECT finish_reason, count(*) AS n, max(output_tokens) AS most FROM request_records "
        "WHERE replica_id = 'rep-c' GROUP BY 1 ORDER BY 1"
    ).to_pylist()
    assert [(r["finish_reason"], r["n"]) for r in rows] == [("cancelled", 4), ("length", 4)]
    assert rows[0]["most"] < 10 and ctl.store.counts()["quarantine"] == 0  # partial, whole, and valid


def test_the_workload_cancels_a_stable_share_of_its_requests():
    ids = list(workload_requests("w", 400, 16, 0.0, 0, cancel_fraction=0.25))
    leaving = [r for r in ids if r.cancel_after is not None]
    assert 70 < len(leaving) < 130 and all(1 <= r.cancel_after < 16 for r in leaving)
    again = list(workload_requests("w", 400, 16, 0.0, 0, cancel_fraction=0.25))
    assert [r.cancel_after for r in again] == [r.cancel_after for r in ids]


ADAPTIVE = parse_rollout_policy(
    {
        "gamma": GAMMA,
        "phases": ["baseline", "compact", "adaptive"],
        "observe_fraction": 0.2,
        "adaptive": {"min_interval_s": 0.0, "min_steps": 20, "dead_band": 0.0},
        "gates": [{"metric": "consistency_mismatches", "threshold": 0, "direction": "at_most", "critical": True}],
        "comparison": {"epoch_s": 0.1, "burn_in_s": 0.0},
    }
)


def test_in_adaptive_a_replica_registers_fetches_and_serves_the_fitted_table(tmp_path):
    # A static table that prices every step about 20x what this tiny model takes: any fit beats it.
    static = scaled(STATIC, 20.0, "tiny-static")
    with Store(tmp_path / "adaptive.duckdb") as store:
        ctl = Controller(store, ADAPTIVE, metrics=Metrics(), resamples=20)
        with serve_in_thread(create_app(ctl, Ingestor(store))) as url:
            replica = make_replica(url, replica_id="rep-t")
            replica.use_static(CostAwareScheduler(static))
            for _ in range(2):
                ctl.act("promote", "ops")
            replica.serve(requests("s", 24))
            assert [e.version for e in cost_tables.entries(store)] == ["tiny-static"]  # registered at its first poll
            ctl.tick()
            assert ctl.policy_payload().cost_tables == {"tiny-static": "tiny-static+a1"}
            replica.serve(requests("f", 24))
            rows = store.query(
                "SELECT s.arm, s.cost_table_version AS v, list(DISTINCT r.mode::VARCHAR ORDER BY 1) AS modes "
                "FROM steps s JOIN requests r USING (replica_id, step_id) WHERE r.request_id LIKE 'f-%' "
                "AND s.arm IS NOT NULL GROUP BY ALL ORDER BY ALL"
            ).to_pylist()
    # Treatment serves the fitted table; control serves compact on the static one (not static verification).
    assert {(r["arm"], r["v"]) for r in rows} == {("control", "tiny-static"), ("treatment", "tiny-static+a1")}
    assert all("static" not in r["modes"] for r in rows)
    assert replica.stats["tables_refused"] == 0


def test_in_fallback_a_replica_s_steps_name_no_cost_table(controller):
    """Fallback serves a fixed window, which prices nothing: its steps kept the last table's version, so the
    adaptive reads counted them as served on it."""
    ctl, url = controller
    replica = make_replica(url, replica_id="rep-f")
    replica.use_static(CostAwareScheduler(scaled(STATIC, 20.0, "tiny-static")))
    replica.poll(force=True)
    assert replica.engine.config.cost_table_version == "tiny-static"
    ctl.act("abort", "ops")
    replica.poll(force=True)
    replica.serve(requests("fb", 4))
    rows = ctl.store.query("SELECT DISTINCT phase, cost_table_version AS v FROM steps").to_pylist()
    assert rows == [{"phase": "fallback", "v": None}]


def test_past_the_checks_a_replica_holds_the_oldest_clean_ones_go_first(monkeypatch):
    import types

    import sparkgate.verify_runtime.replica as replica_module

    monkeypatch.setattr(replica_module, "MAX_PENDING_CHECKS", 3)
    held = types.SimpleNamespace(checked=[{"id": i, "mismatch_at": 2 if i in (0, 3) else None} for i in range(5)],
                                 stats={"checks_dropped": 0})  # fmt: skip
    Replica._bound_checks(held)
    assert [c["id"] for c in held.checked] == [0, 3, 4] and held.stats["checks_dropped"] == 2


@pytest.mark.parametrize("replica_id", ["gpu?1", "pool#b", "fleet/dp0"])
def test_ids_with_url_characters_reach_their_own_rows(controller, replica_id):
    """A restarted replica asks where its numbering goes on; a ``?`` there once asked for another replica's
    (none: 0), so every new step was refused as a repeat of a stored one."""
    from sparkgate.collectors.synth import synthetic_wire
    from sparkgate.collectors.wire import from_wire

    ctl, url = controller
    wire = synthetic_wire(5, 2, GAMMA, replica_id, seed=1)
    ctl.store.ingest(from_wire(wire), "test")
    client = ControllerClient(url)
    assert client.next_step_id(replica_id) == 5
    request_id = wire.column("requests").to_pylist()[0][0]["request_id"]
    assert client.committed(request_id, replica_id) and client.committed(request_id + "/x?y", replica_id) is None
