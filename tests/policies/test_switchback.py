"""The switchback schedule: deterministic per seed, balanced in every pair, independent across replicas."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies.switchback import Switchback
from sparkgate.policies.vocabulary import Arm


@given(st.integers(0, 2**31), st.text(min_size=1, max_size=8), st.integers(0, 10_000))
def test_every_pair_holds_one_treatment_and_one_control(seed, replica, pair):
    schedule = Switchback(seed, 5.0, 0.0)
    assert {schedule.arm(replica, 2 * pair), schedule.arm(replica, 2 * pair + 1)} == {Arm.TREATMENT, Arm.CONTROL}
    assert Switchback(seed, 5.0, 0.0).arm(replica, 2 * pair) == schedule.arm(replica, 2 * pair)  # deterministic


def test_orders_are_drawn_not_alternated_and_replicas_split_the_fleet():
    schedule = Switchback(7, 4.0, 1000.0)
    firsts = [schedule.arm("r0", 2 * k) for k in range(400)]
    assert 160 < firsts.count(Arm.TREATMENT) < 240  # a fair coin per pair, not a fixed order
    now = [schedule.arm(f"r{i}", 11) for i in range(400)]
    assert 160 < now.count(Arm.TREATMENT) < 240
    assert [Switchback(8, 4.0, 1000.0).arm("r0", 2 * k) for k in range(400)] != firsts  # the seed matters


def test_epochs_follow_the_clock_and_bad_lengths_are_refused():
    schedule = Switchback(1, 4.0, 1000.0)
    assert [schedule.epoch(t) for t in (1000.0, 1003.99, 1004.0, 999.0)] == [0, 0, 1, -1]
    assert schedule.start(3) == 1012.0
    with pytest.raises(ValueError, match="epoch_s=0"):
        Switchback(1, 0, 0.0)


@given(
    st.floats(0.05, 120.0),
    st.floats(1.6e9, 1.9e9),
    st.integers(-(10**4), 10**6),
    st.floats(0.0, 1.0, exclude_max=True),
)
def test_an_epochs_start_lies_in_that_epoch(epoch_s, origin, epoch, offset):
    """``epoch(start(e))`` once read ``e - 1`` (0.1 s epochs from 1.7e9: start(1) was in epoch 0), and the
    simulated fleet's walk over epochs stood still on the boundary for ever."""
    schedule = Switchback(0, epoch_s, origin)
    assert schedule.epoch(schedule.start(epoch)) == epoch
    inside = schedule.start(epoch) + offset * epoch_s
    if inside < schedule.start(epoch + 1):
        assert schedule.epoch(inside) == epoch
