"""The decisions ledger over a real DuckDB file: decisions read back as written, and replayed to the state."""

from __future__ import annotations

from sparkgate.collectors.store import Store
from sparkgate.controller import ledger
from sparkgate.controller.rollout import command, decide, start
from sparkgate.controller.rollout_state import apply, replay
from sparkgate.policies.rollout import parse_rollout_policy

POLICY = parse_rollout_policy({"canary_steps": [0.1, 0.5], "consecutive_passes": 3})


class Writer:
    """Records each decision before applying it, as the controller does."""

    def __init__(self, store: Store):
        self.store, self.state, self.made = store, None, []

    def __call__(self, decision):
        ledger.record(self.store, decision)
        self.made.append(decision)
        self.state = apply(self.state, decision)
        return decision


def test_an_empty_ledger_has_no_state(store):
    assert ledger.load_state(store, POLICY) is None
    assert ledger.decisions(store) == []


def test_decisions_read_back_oldest_first_as_they_were_written(store):
    write = Writer(store)
    write(start(POLICY, 10.0))
    write(decide(POLICY, write.state, [], 20.0))  # no gate decides: a passing interval
    write(command(POLICY, write.state, "promote", "ops", 30.0, note="skip"))
    write(decide(POLICY, write.state, [], 40.0))
    write(decide(POLICY, write.state, [], 50.0))
    read = ledger.decisions(store)
    assert [d.to_dict() for d in read] == [d.to_dict() for d in write.made]
    assert read[2].operator == "ops" and read[2].reasons == ({"rule": "operator promote", "note": "skip"},)
    assert [d.decided_at for d in ledger.decisions(store, limit=2)] == [40.0, 50.0]
    assert [d.action for d in ledger.decisions(store, since=30.0)] == ["promote", "hold", "hold"]
    assert [d.action for d in ledger.decisions(store, changes_only=True)] == ["start", "promote"]


def test_load_state_replays_from_the_last_policy_change(tmp_path):
    path = tmp_path / "ledger.duckdb"
    with Store(path) as store:
        write = Writer(store)
        write(start(POLICY, 10.0))
        write(decide(POLICY, write.state, [], 20.0))
        assert write.state.passes == 1
        write(command(POLICY, write.state, "promote", "ops", 30.0))  # a new stage: its streak starts at 0
        write(decide(POLICY, write.state, [], 40.0))
        write(decide(POLICY, write.state, [], 50.0))
        expected = write.state
    with Store(path) as store:  # a restarted controller
        state = ledger.load_state(store, POLICY)
        assert state == expected == replay(write.made)
        assert (state.phase, state.revision, state.passes, state.stage) == ("shadow", 2, 2, 1)


def test_decisions_of_one_clock_tick_keep_their_order(store):
    write = Writer(store)
    write(start(POLICY, 10.0))
    write(command(POLICY, write.state, "promote", "ops", 20.0))
    write(decide(POLICY, write.state, [], 20.0))
    write(command(POLICY, write.state, "pause", "ops", 20.0))
    assert [d.action for d in ledger.decisions(store)] == ["start", "promote", "hold", "pause"]
    assert ledger.decisions(store, limit=1)[0].action == "pause"
    assert ledger.load_state(store, POLICY) == write.state and write.state.phase == "paused"


def test_a_paused_rollout_that_reevaluates_resumes_paused_at_its_new_rung_after_a_restart(tmp_path):
    from sparkgate.controller.contract import ContractReading

    path = tmp_path / "ledger.duckdb"
    on = lambda contract: ContractReading("A", (contract,), (10,), ("target",) if contract != "A" else ())
    with Store(path) as store:
        write = Writer(store)
        write(start(POLICY, 0.0))
        for t in (10.0, 20.0, 30.0):
            write(command(POLICY, write.state, "promote", "ops", t))  # shadow, canary 0.1, canary 0.5
        write(decide(POLICY, write.state, [], 40.0, on("A")))  # the rollout pins contract A
        write(command(POLICY, write.state, "pause", "ops", 50.0))
        again = write(decide(POLICY, write.state, [], 60.0, on("B")))
        # Paused to paused: neither phase names the rung (shadow) it re-evaluates from, the decision does.
        assert (again.action, again.phase_from, again.phase_to) == ("reevaluate", "paused", "paused")
        assert again.rung == "shadow"
        expected = write.state
    with Store(path) as store:  # a restarted controller
        state = ledger.load_state(store, POLICY)
    assert state == expected and (state.phase, state.stage, state.contract) == ("paused", 1, "B")


def test_decisions_persisted_before_rungs_were_find_their_stage_by_phase(store):
    write = Writer(store)
    write(start(POLICY, 0.0))
    write(command(POLICY, write.state, "promote", "ops", 10.0))
    write(command(POLICY, write.state, "pause", "ops", 20.0))
    store.execute("UPDATE decisions SET rung = NULL")  # as migration 15 leaves older rows
    assert ledger.load_state(store, POLICY) == write.state and write.state.stage == 1
