"""YAML as sparkgate reads it: what the safe loader decodes, except that a mapping naming a key twice is
refused with the line of both; merge keys may still be overridden."""

from __future__ import annotations

import datetime

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies.yaml_text import NotUTF8Error, YAMLTextError, load, load_file

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(documents)
def test_documents_without_repeated_keys_decode_as_the_safe_loader_does(document):
    text = yaml.safe_dump(document)
    assert load(text) == yaml.safe_load(text) == document


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("gates: []\nseed: 1\ngates: [x]\n", "line 3, column 1: key 'gates' appears twice (first on line 1)"),
        ("a: {b: 1, b: 2}\n", "line 1, column 11: key 'b' appears twice (first on line 1)"),
        ("- x: 1\n- y: 1\n  y: 2\n", "line 3, column 3: key 'y' appears twice (first on line 2)"),
        ("1: a\n1: b\n", "line 2, column 1: key 1 appears twice (first on line 1)"),
    ],
)
def test_a_repeated_key_is_refused_naming_both_lines(text, where):
    assert yaml.safe_load(text) is not None  # the safe loader alone keeps the last value silently
    with pytest.raises(YAMLTextError) as caught:
        load(text)
    assert str(caught.value) == where


def test_a_merged_key_may_be_overridden():
    assert load("base: &b {p: 1, q: 1}\nd: {<<: *b, p: 2}\n")["d"] == {"p": 2, "q": 1}
    # A mapping that overrides its own merge, merged in turn: what it says is read as the safe loader reads it.
    nested = "x: &x {<<: {a: 1}, a: 2}\ny: {<<: *x}\nz: [*x, *x]\n"
    assert load(nested) == yaml.safe_load(nested)


def test_keys_are_compared_as_values():
    with pytest.raises(YAMLTextError, match=r"^line 2, column 1: key 1 appears twice \(first on line 1\)$"):
        load("1: a\n0x1: b\n")
    assert load("1: a\n'1': b\n") == {1: "a", "1": "b"}


def test_text_that_is_not_yaml_is_one_line_naming_where():
    with pytest.raises(YAMLTextError, match=r"^line 2, column 1: expected the node content, but found '<stream end>'$"):
        load("gates: [\n")


@pytest.mark.parametrize(
    "text, where",
    [("gamma: 7\nnote: 2024-13-01\n", "line 2, column 7"), ("2024-02-30: 1\n", "line 1, column 1")],
)
def test_a_date_that_does_not_exist_is_named_where_it_is(text, where):
    # YAML reads an unquoted 2024-13-01 as a date; the constructor's own ValueError escaped as a traceback.
    with pytest.raises(YAMLTextError, match=rf"^{where}: '20\d\d-\d\d-\d\d' is not a date \(.+\)$"):
        load(text)
    assert load("note: 2024-02-29\n") == {"note": datetime.date(2024, 2, 29)}


def test_a_file_is_read_as_utf8_text_and_one_that_is_not_is_named(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: caf\u00e9\n", encoding="utf-8")
    assert load_file(path) == {"name": "caf\u00e9"}
    path.write_bytes(b"name: caf\xe9\n")  # Latin-1
    with pytest.raises(NotUTF8Error, match=r"^not UTF-8 text \(byte 9: invalid continuation byte\)$"):
        load_file(path)
