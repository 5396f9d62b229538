"""A step's rows and record from its host values: what each mode observed, and the step's costs."""

from __future__ import annotations

from sparkgate.verify_runtime.engine import EngineConfig, Request
from sparkgate.verify_runtime.step_log import StepCosts, StepOutcome, request_rows, step_record
from sparkgate.verify_runtime.tiers import TierChoice

GAMMA = 4
# Three requests: compact using its window of 2 up (censored), compact stopping inside it, cap-accept at 2
# whose full block would have accepted 3.
OUTCOME = StepOutcome(
    modes=["compact", "compact", "cap_accept"],
    suggested=[2, 3, 2],
    limits=[2, 3, 2],
    accepted=[2, 1, 2],
    full=[2, 1, 3],
    committed=[[5, 6, 9], [5, 9], [5, 6, 9]],
    drafts=[[5, 6, 7, 8]] * 3,
    positions=[10, 20, 30],
    confidence=[[0.9, 0.8, 0.7, 0.6]] * 3,
    survival=[[0.9, 0.72, 0.5, 0.3]] * 3,
    next_prob=[0.7, 0.4, 0.6],
)
REQS = [Request(f"r{i}", [1, 2], 8, task="code") for i in range(3)]


def test_rows_carry_what_each_mode_observed_and_a_next_probability_only_where_censored():
    rows = request_rows(REQS, OUTCOME, GAMMA)
    assert [(r.request_id, r.window, r.full_accept, r.cap_trim) for r in rows] == [
        ("r0", 2, None, 0),
        ("r1", 3, 1, 0),
        ("r2", 2, 3, 1),
    ]
    assert [r.next_accept_prob for r in rows] == [0.7, None, None]
    assert [r.position for r in rows] == [10, 20, 30] and rows[0].committed_tokens == [5, 6, 9]


def test_the_record_counts_the_commit_stage_in_accept_time_and_every_stage_in_the_step():
    config = EngineConfig(gamma=GAMMA, replica_id="a", phase="compact", epoch=3, arm="treatment")
    costs = StepCosts([1.0, 0.5, 4.0, 0.25, 0.125], [3, 4, 3], TierChoice(1, 16, True, None), 2, 6.0, 5.5, None)
    record = step_record(config, 7, 100.0, costs, request_rows(REQS, OUTCOME, GAMMA), ("m", "d"), "c" * 16)
    assert (record.step_id, record.batch_size, record.verify_rows, record.tier_rows) == (7, 3, 10, 16)
    assert (record.accept_ms, record.step_ms) == (0.375, 5.875)
    assert (record.model_version, record.drafter_version, record.epoch, record.arm) == ("m", "d", 3, "treatment")
    assert (record.predicted_step_ms, record.table_step_ms, record.step_cpu_ms) == (5.5, None, 6.0)
    assert (record.replica_id, record.phase, record.gamma) == ("a", "compact", GAMMA)
