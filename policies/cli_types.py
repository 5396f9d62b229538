"""Command-line value types every layer's commands share: what a number, a list of counts, a server's URL
or a point in the past on the command line may be.

``finite_numbers`` is applied by the console script to every command it loads, so no option takes NaN or
infinity for a number (a NaN passes every range check, and a sleep, a threshold or a rate of NaN runs on
as if it were a value).
"""

from __future__ import annotations

import datetime as dt
import math
import urllib.parse
from typing import Any

import click


class _Finite:
    """Mixed into a click float type: a non-finite value fails, naming the option."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # Read the number before a range judges it: an infinity is named as such, not as out of range.
        number = click.types.FloatParamType.convert(self, value, param, ctx)  # type: ignore[arg-type]
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)  # type: ignore[attr-defined]
        return super().convert(value, param, ctx)  # type: ignore[misc]


class FiniteFloat(_Finite, click.types.FloatParamType):
    pass


class FiniteFloatRange(_Finite, click.FloatRange):
    pass


def finite_numbers(command: click.Command) -> click.Command:
    """``command`` (and a group's subcommands, as they are defined) with every float parameter refusing NaN
    and infinity; ranges keep their bounds and their help."""
    for param in command.params:
        kind = param.type
        if isinstance(kind, click.FloatRange) and not isinstance(kind, _Finite):
            param.type = FiniteFloatRange(kind.min, kind.max, kind.min_open, kind.max_open, kind.clamp)
        elif type(kind) is click.types.FloatParamType:
            param.type = FiniteFloat()
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            finite_numbers(sub)
    return command


class _CommaList(click.ParamType):  # type: ignore[type-arg]
    """Comma-separated items, each read by ``item``: a tuple, or a usage error naming the item that is not
    one (blank items between commas are skipped; a list of none is an error)."""

    expected = "items"

    def item(self, text: str, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        raise NotImplementedError

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        items = [part.strip() for part in str(value).split(",") if part.strip()]
        if not items:
            self.fail(f"{value!r}: expected {self.expected}, separated by commas.", param, ctx)
        return tuple(self.item(text, value, param, ctx) for text in items)


class CountList(_CommaList):
    """A comma-separated list of integers of at least ``low`` (batch sizes)."""

    name = "list"

    def __init__(self, low: int = 1):
        self.low = low
        self.expected = f"integers >= {low}"

    def item(self, text: str, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number: int | None = int(text)
        except ValueError:
            number = None
        if number is None or number < self.low:
            self.fail(f"{text!r} in {value!r} is not an integer >= {self.low}.", param, ctx)
        return number


class FloatList(_CommaList):
    """Comma-separated finite numbers within a range (``click.FloatRange``'s arguments)."""

    name = "numbers"
    expected = "numbers"

    def __init__(self, min: float | None = None, max: float | None = None, min_open: bool = False):
        self.range = FiniteFloatRange(min, max, min_open=min_open)
        self.range.name = "number"  # a bad item reads "'a' is not a valid number", not "... float range"

    def item(self, text: str, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        return float(self.range.convert(text, param, ctx))


class HttpUrl(click.ParamType):  # type: ignore[type-arg]
    """A server's base URL: http or https, a host, a port (if any) from 1 to 65535, no whitespace. The value is
    kept as given; anything else is a usage error naming the option and the value, before a request is made."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        try:
            parts = urllib.parse.urlsplit(text)
            port = parts.port  # raises for a port that is not a number from 0 to 65535
        except ValueError as exc:
            self.fail(f"{text!r}: {exc}", param, ctx)
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0 or any(c.isspace() for c in text):
            self.fail(f"{text!r} is not an http:// or https:// URL with a host", param, ctx)
        return text


_SECONDS_PER = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class PastTime(click.ParamType):  # type: ignore[type-arg]
    """A window's start as unix seconds: given as unix seconds, an ISO date or time (UTC unless it says
    otherwise), or a duration ago (``30m``, ``2h``, ``1d``); anything else is a usage error naming it."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        text, refused = str(value).strip(), f"{value!r}: expected unix seconds, an ISO time, or a duration such as 30m"
        try:
            seconds = float(text)  # unix seconds, in any form a float takes (1.75e9 too)
        except ValueError:
            seconds = None
        if seconds is not None:
            if not math.isfinite(seconds) or seconds < 0:
                self.fail(refused, param, ctx)
            return seconds
        try:
            if text[-1:] in _SECONDS_PER and text[:-1].replace(".", "", 1).isdigit():
                return dt.datetime.now(dt.UTC).timestamp() - float(text[:-1]) * _SECONDS_PER[text[-1]]
            parsed = dt.datetime.fromisoformat(text)
            return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()
        except (ValueError, OverflowError):
            self.fail(refused, param, ctx)
