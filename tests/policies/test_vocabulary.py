"""The vocabulary: each word once, spelt as on the wire, and the derived sets agree with it."""

from sparkgate.collectors.schema import MISS_REASONS, MODES, STATUSES
from sparkgate.policies.vocabulary import (
    CHANGES_POLICY,
    FULL_BLOCK_MODES,
    LADDER,
    OPERATOR_ACTIONS,
    SERVING_PHASES,
    Action,
    MissReason,
    Mode,
    Phase,
    Status,
)


def test_members_are_their_wire_strings():
    assert Mode.CAP_ACCEPT == "cap_accept" and f"{Phase.FALLBACK}" == "fallback"
    for enum in (Mode, Status, MissReason, Phase, Action):
        assert all(member.value == member.name.lower() or member.value == "cap_accept" for member in enum)


def test_the_record_schema_orders_are_the_vocabulary():
    # The integer codes stored in DuckDB are indexes into these tuples: their order is part of the format.
    assert MODES == ("static", "shadow", "compact", "cap_accept")
    assert STATUSES == ("accepted", "rejected", "not_at_risk", "censored", "recovered", "estimated")
    assert MISS_REASONS == ("over_max_tier", "not_captured", "forced_eager")


def test_derived_sets():
    assert set(FULL_BLOCK_MODES) == set(Mode) - {Mode.COMPACT}
    assert LADDER[0] is Phase.BASELINE and LADDER[1:] == SERVING_PHASES
    assert set(Phase) - set(LADDER) == {Phase.FALLBACK, Phase.PAUSED}
    assert Action.HOLD not in CHANGES_POLICY and set(OPERATOR_ACTIONS) < CHANGES_POLICY
