"""The joint contract through the real controller, store and ledger: pinned on first sight, a mixed window
judged by nobody, a changed fleet evaluated again as a decision, references read for one contract only."""

from __future__ import annotations

from sparkgate.collectors.store import Store
from sparkgate.controller import contract, ledger
from sparkgate.controller.queries import SameContract, Slice, Window, step_buckets
from sparkgate.controller.supervisor import Controller
from sparkgate.policies.rollout import parse_rollout_policy
from tests.conftest import T0, ingest_synthetic

POLICY = parse_rollout_policy(
    {
        "canary_steps": [0.1],
        "evaluation_interval_s": 60,
        "consecutive_passes": 1,
        "stale_after_s": 600,
        "progress_deadline_s": 3600,
        "gates": [{"metric": "survival_ece", "threshold": 0.5, "direction": "at_most", "min_samples": 10}],
    }
)


class Fleet:
    """A controller over a store whose steps the test writes, one interval (60 s) at a time."""

    def __init__(self, store: Store):
        self.store, self.now, self.next_step = store, T0, 0
        self.ctl = Controller(store, POLICY, clock=lambda: self.now, resamples=10)

    def steps(self, phase: str, *contracts: str, **columns) -> None:
        """20 steps per contract, each from its own replica, 5 s into the current interval."""
        for i, c in enumerate(contracts):
            ingest_synthetic(self.store, 20, self.now + 5, phase=phase, replica=f"r{i}", first_step=self.next_step,
                             contract=c, drafter_version=f"drafter-{c}", **columns)  # fmt: skip
            self.next_step += 20

    def tick(self):
        self.now += 60
        return self.ctl.tick()


def test_the_first_contract_seen_is_pinned_without_a_decision_of_its_own(store):
    fleet = Fleet(store)
    fleet.steps("baseline", "A")
    decision = fleet.tick()
    assert decision.action == "advance" and decision.contract == "A" and fleet.ctl.state.contract == "A"
    assert [d.action for d in ledger.decisions(store)] == ["start", "advance"]
    assert fleet.ctl.status()["contract"] == "A"


def test_a_window_that_mixes_contracts_is_judged_by_nobody(store):
    fleet = Fleet(store)
    fleet.steps("baseline", "A")
    fleet.tick()
    fleet.steps("shadow", "A", "B")  # a rolling update under way: two replicas, two contracts
    decision = fleet.tick()
    assert (decision.action, decision.outcome) == ("hold", "inconclusive")
    assert decision.reasons[0]["rule"].startswith("contracts mixed")
    assert decision.reasons[0]["contracts"] == {"A": 20, "B": 20}
    assert decision.reasons[1]["outcome"] == "pass"  # the gate passed, and still nothing advanced
    assert fleet.ctl.state.contract == "A"


def test_a_new_contract_without_a_baseline_of_its_own_goes_back_to_baseline(store):
    fleet = Fleet(store)
    fleet.steps("baseline", "A")
    fleet.tick()
    fleet.steps("shadow", "A")
    assert fleet.tick().phase_to == "canary"
    fleet.steps("canary", "B")
    decision = fleet.tick()
    assert (decision.action, decision.phase_from, decision.phase_to) == ("reevaluate", "canary", "baseline")
    rule = decision.reasons[0]
    assert rule["rule"] == "contract changed: evaluate again from baseline"
    assert (rule["contract_from"], rule["contract_to"]) == ("A", "B")
    assert rule["differs"] == ["drafter_version: drafter-A -> drafter-B"]
    assert decision.revision == 4 and fleet.ctl.state.contract == "B"


def test_a_contract_measured_in_baseline_before_goes_back_to_shadow_and_survives_a_restart(tmp_path):
    path = tmp_path / "contract.duckdb"
    with Store(path) as store:
        fleet = Fleet(store)
        fleet.steps("baseline", "A")
        fleet.tick()
        fleet.steps("shadow", "A")
        fleet.tick()
        fleet.steps("canary", "B")  # a new drafter: evaluated again from baseline
        assert fleet.tick().phase_to == "baseline"
        fleet.steps("baseline", "B")
        assert fleet.tick().phase_to == "shadow"
        fleet.steps("shadow", "A")  # the old drafter is back: it has a baseline, so shadow again
        decision = fleet.tick()
        assert (decision.action, decision.phase_from, decision.phase_to) == ("reevaluate", "shadow", "shadow")
        assert decision.reasons[0]["differs"] == ["drafter_version: drafter-B -> drafter-A"]
        state = fleet.ctl.state
        assert state.contract == "A" and state.passes == 0
    with Store(path) as store:
        assert Controller(store, POLICY, clock=lambda: T0 + 999).state == state


def test_references_are_read_for_the_contract_being_judged_only(store):
    ingest_synthetic(store, 20, T0, phase="baseline", contract="A")
    ingest_synthetic(store, 5, T0, phase="baseline", replica="r1", contract="B")
    steps = {c: sum(step_buckets(store, Window(), Slice(), "baseline", SameContract(c)).column("steps").to_pylist())
             for c in ("A", "B", None)}  # fmt: skip
    assert steps == {"A": 20, "B": 5, None: 0}
    reading = contract.read(store, Window(), pinned="A")
    assert reading.mixed and reading.judged == "A" and not reading.changed
    assert contract.read(store, Window(since=T0 + 1), pinned="A").seen == ()


def test_a_gate_failing_in_a_mixed_window_neither_rolls_back_nor_reverts_nor_counts_later():
    from sparkgate.controller.contract import ContractReading
    from sparkgate.controller.gates import judge
    from sparkgate.controller.measurement import Measurement
    from sparkgate.controller.rollout import decide
    from sparkgate.controller.rollout_state import UNJUDGED, RolloutState, apply

    mixed, one = ContractReading("A", ("A", "B"), (50, 50)), ContractReading("A", ("A",), (100,))
    policy = parse_rollout_policy({"canary_steps": [0.1], "gates": [
        {"metric": "tier_miss_rate", "threshold": 0.02, "direction": "at_most", "failure_limit": 1},
        {"metric": "cost_prediction_error", "threshold": 0.25, "direction": "at_most", "guard": True,
         "phases": ["adaptive"]}]})  # fmt: skip
    misses, table = policy.gates
    canary = RolloutState(5, "canary", 2, 0.1, 0.0, contract="A")
    failing = [judge(misses, Measurement(0.5, 1000))]
    held = decide(policy, canary, failing, 60.0, mixed)
    assert (held.action, held.outcome, held.reasons[0]["rule"]) == ("hold", "inconclusive", UNJUDGED)
    after = apply(canary, held)
    assert after.streak(misses.name) == (0, 0)  # the failure was not judged, so it does not count later
    first_judged = decide(policy, after, failing, 120.0, one)
    assert (first_judged.action, first_judged.reasons[0]["rule"]) == ("hold", "failed interval")
    # In adaptive on fitted tables, a table gate's failure over two contracts reverts nothing either.
    top = len(policy.stages()) - 1
    adaptive = RolloutState(9, "adaptive", top, 1.0, 0.0, contract="A", tables=(("g", "g+a1"),))
    table_failing = [judge(table, Measurement(0.9, 1000, 0.8, 1.0, "median"))]
    assert decide(policy, adaptive, table_failing, 60.0, mixed).action == "hold"
    assert decide(policy, adaptive, table_failing, 60.0, one).action == "revert_table"
