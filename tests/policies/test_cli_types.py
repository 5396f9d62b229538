"""Command-line number types: no float option takes NaN or infinity, ranges keep their bounds and help,
and a count list names the item that is not a count."""

from __future__ import annotations

import time

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from sparkgate.policies.cli_types import (
    CountList,
    FiniteFloat,
    FiniteFloatRange,
    FloatList,
    HttpUrl,
    PastTime,
    finite_numbers,
)


def _group() -> click.Group:
    @click.group()
    def group() -> None:
        pass

    @group.command()
    @click.option("--rate", type=float, default=1.0)
    @click.option("--share", type=click.FloatRange(min=0, min_open=True), default=0.5, show_default=True)
    @click.option("--count", type=int, default=1)
    def run(rate: float, share: float, count: int) -> None:
        click.echo(f"{rate} {share} {count}")

    return finite_numbers(group)


@pytest.mark.parametrize(
    ("option", "text"),
    [("--rate", t) for t in ("nan", "NaN", "inf", "-inf", "Infinity", "1e999")]
    + [("--share", t) for t in ("nan", "inf", "1e999")],  # NaN and +inf pass a lower bound alone
)
def test_no_float_option_of_a_subcommand_takes_a_non_finite_number(option, text):
    result = CliRunner().invoke(_group(), ["run", option, text])
    assert result.exit_code == 2 and f"Invalid value for '{option}': '{text}' is not a finite number." in result.output


def test_finite_options_keep_their_values_bounds_and_help():
    group = _group()
    assert (
        CliRunner().invoke(group, ["run", "--rate", "-2.5", "--share", "1e300", "--count", "3"]).output
        == "-2.5 1e+300 3\n"
    )
    assert "is not in the range x>0" in CliRunner().invoke(group, ["run", "--share", "0"]).output
    params = {p.name: p.type for p in group.commands["run"].params}
    assert isinstance(params["rate"], FiniteFloat) and isinstance(params["share"], FiniteFloatRange)
    assert (params["share"].min, params["share"].min_open, params["share"].max) == (0, True, None)
    assert type(params["count"]) is click.types.IntParamType  # integers are finite already
    assert "x>0" in CliRunner().invoke(group, ["run", "--help"]).output


def test_wrapping_twice_changes_nothing():
    group = _group()
    types = [p.type for p in group.commands["run"].params]
    finite_numbers(group)
    assert [p.type for p in group.commands["run"].params] == types


@given(st.lists(st.integers(min_value=2, max_value=10**6), min_size=1, max_size=6))
def test_a_count_list_reads_every_item_in_order(counts):
    assert CountList(low=2).convert(" , ".join(map(str, counts)) + ",", None, None) == tuple(counts)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("8,0", "'0' in '8,0' is not an integer >= 1."),
        ("8,x", "'x' in '8,x' is not an integer >= 1."),
        ("4,2.5", "'2.5' in '4,2.5' is not an integer >= 1."),
        ("--5", "'--5' in '--5' is not an integer >= 1."),
        ("8,\u00b2", "'\u00b2' in '8,\u00b2' is not an integer >= 1."),  # a digit to str.isdigit, not to int
        (" , ", "' , ': expected integers >= 1, separated by commas."),
    ],
)
def test_a_count_list_names_the_item_that_is_not_a_count(text, named):
    with pytest.raises(click.BadParameter) as caught:
        CountList().convert(text, None, None)
    assert caught.value.message == named


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8470", "https://sglang.internal/", "http://[::1]:30000", "http://h:65535/base"]
)
def test_a_server_url_is_kept_as_given(url):
    assert HttpUrl().convert(url, None, None) == url


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("localhost:8470", "'localhost:8470' is not an http:// or https:// URL with a host"),
        ("ftp://host", "'ftp://host' is not an http:// or https:// URL with a host"),
        ("http://", "'http://' is not an http:// or https:// URL with a host"),
        ("http://host:0", "'http://host:0' is not an http:// or https:// URL with a host"),
        ("http://ho st", "'http://ho st' is not an http:// or https:// URL with a host"),
    ],
)
def test_a_server_url_that_no_request_could_reach_is_named(url, named):
    with pytest.raises(click.BadParameter) as caught:
        HttpUrl().convert(url, None, None)
    assert caught.value.message == named


@pytest.mark.parametrize("url", ["http://host:99999", "http://host:port"])
def test_a_port_urllib_cannot_read_is_named_in_its_words(url):
    with pytest.raises(click.BadParameter) as caught:
        HttpUrl().convert(url, None, None)
    assert caught.value.message.startswith(f"{url!r}: ") and "port" in caught.value.message.lower()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1750000080", 1750000080.0),
        ("1750000080.5", 1750000080.5),
        ("1.75000008e9", 1750000080.0),
        ("2025-06-15T15:08:00", 1750000080.0),  # UTC unless it says otherwise
        ("2025-06-15T17:08:00+02:00", 1750000080.0),
        ("2025-06-15", 1749945600.0),
    ],
)
def test_a_past_time_is_unix_seconds_or_an_iso_time(text, seconds):
    assert PastTime().convert(text, None, None) == seconds


@pytest.mark.parametrize(("text", "ago"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600)])
def test_a_duration_is_that_long_before_now(text, ago):
    before = time.time()
    got = PastTime().convert(text, None, None)
    assert before - ago - 1 <= got <= time.time() - ago


@pytest.mark.parametrize("text", ["yesterday", "nan", "inf", "-5", "30x", "1e999", "", "2025-13-01"])
def test_anything_else_is_named(text):
    with pytest.raises(click.BadParameter) as caught:
        PastTime().convert(text, None, None)
    assert caught.value.message == f"{text!r}: expected unix seconds, an ISO time, or a duration such as 30m"


@pytest.mark.parametrize(
    ("text", "error"),
    [("0,1.5", "1.5 is not in the range 0<=x<=1"), ("0,nan", "'nan' is not a finite number"), (" , ", "expected")],
)
def test_a_float_list_names_the_item_that_is_not_a_number_in_range(text, error):
    assert FloatList(0, 1).convert(" 0, 0.5 ,1", None, None) == (0.0, 0.5, 1.0)
    with pytest.raises(click.BadParameter, match=error):
        FloatList(0, 1).convert(text, None, None)


def test_an_infinity_is_named_as_such_by_a_bounded_range_too():
    with pytest.raises(click.BadParameter) as caught:
        FiniteFloatRange(0, 1).convert("inf", None, None)
    assert caught.value.message == "'inf' is not a finite number."
    assert FiniteFloatRange(0, 1).convert("0.5", None, None) == 0.5
