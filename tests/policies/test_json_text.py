"""JSON as sparkgate reads others' writing: the standard decoder's result, or an error naming a repeated key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies.json_text import RepeatedKeyError, loads

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=12,
)


@given(values)
def test_a_document_without_repeated_keys_decodes_as_the_standard_decoder_has_it(value):
    text = json.dumps(value)
    assert loads(text) == json.loads(text) and loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize(
    "doc, key",
    [
        ('{"accepted": 3, "gamma": 7, "accepted": 5}', "accepted"),
        (b'[{"a": 1}, {"b": {"c": 1, "c": 1}}]', "c"),  # nested, and the same value twice is still two keys
        ('{"x": 1, "x": 2, "y": 1, "y": 2}', "x"),  # the first repeated
    ],
)
def test_a_repeated_key_is_a_json_error_naming_it(doc, key):
    with pytest.raises(RepeatedKeyError) as raised:
        loads(doc)
    assert raised.value.key == key and str(raised.value) == f"key {key!r} appears more than once in one object"
    assert isinstance(raised.value, json.JSONDecodeError)  # every "not JSON" handler names it


def test_other_invalid_json_is_the_standard_error():
    with pytest.raises(json.JSONDecodeError, match="Expecting"):
        loads("{not json")
