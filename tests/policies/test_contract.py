"""The joint contract's fingerprint: a function of every part and of nothing else."""

from dataclasses import fields, replace

from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies.contract import Contract, hardware_text

text = st.text(max_size=12)
contracts = st.builds(Contract, text, text, st.integers(1, 16), st.none() | text, text, text, text)


@given(contracts)
def test_equal_parts_give_equal_fingerprints_and_any_changed_part_a_new_one(contract):
    assert Contract(**{f.name: getattr(contract, f.name) for f in fields(Contract)}).fingerprint() == (
        contract.fingerprint()
    )
    for f in fields(Contract):
        value = getattr(contract, f.name)
        other = value + 1 if isinstance(value, int) else (value or "") + "x"
        assert replace(contract, **{f.name: other}).fingerprint() != contract.fingerprint()


def test_the_fingerprint_is_the_same_on_every_machine():
    # A literal: a fingerprint that moved with the Python version or dict order would split one fleet in two.
    contract = Contract("t", "d", 7, None, hardware_text({"device": "cpu", "cpu": "x"}))
    assert contract.fingerprint() == "fb9f72de78828448"
