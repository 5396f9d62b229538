"""A replica swaps in a fitted cost table whole, or keeps the one it has and says why."""

from __future__ import annotations

import dataclasses

import pytest

from sparkgate.policies.window import CostAwareScheduler
from sparkgate.verify_runtime.table_swap import TableSwap
from tests.controller.timed_steps import STATIC, scaled

FITTED = scaled(STATIC, 1.3, "static-a+a1")


def swap() -> TableSwap:
    return TableSwap(CostAwareScheduler(STATIC, min_window=2))


def fetcher(tables: dict):
    calls = []

    def fetch(version):
        calls.append(version)
        return tables[version]

    fetch.calls = calls
    return fetch


def test_a_valid_table_is_swapped_in_and_keeps_the_scheduler_settings():
    tables = swap()
    assert tables.current(fitted=True) == ("static-a", tables.static)
    assert tables.follow({"static-a": "static-a+a1"}, fetcher({"static-a+a1": FITTED.to_json_dict()}))
    version, scheduler = tables.current(fitted=True)
    assert version == "static-a+a1" and scheduler.cost_table == FITTED and scheduler.min_window == 2
    assert tables.current(fitted=False) == ("static-a", tables.static)  # control epochs keep the static table
    assert not tables.follow({"static-a": "static-a+a1"}, fetcher({}))  # already in force: not fetched again
    assert tables.follow({}, fetcher({})) and tables.current(fitted=True)[0] == "static-a"  # back to static


def _meta(**changes):
    """The table asked for (``static-a+a2``) with ``changes`` to its meta."""
    meta = dataclasses.replace(FITTED.meta, **{"version": "static-a+a2", **changes})
    return dataclasses.replace(FITTED, meta=meta).to_json_dict()


@pytest.mark.parametrize(
    "body, why",
    [
        (_meta(tiers=(8, 16)), "meta.tiers: table has [8, 16], this replica captured []"),
        (_meta(model="other"), "meta.model: table has 'other'"),
        (_meta(hardware={"cpu": "elsewhere"}), "meta.hardware.cpu: table has 'elsewhere'"),
        (_meta(version="static-a+a9"), "meta.version: asked for 'static-a+a2', got 'static-a+a9'"),
        ({**FITTED.to_json_dict(), "bias_seconds": -1}, "bias_seconds: expected a finite number > 0"),
        ({"not": "a table"}, "expected exactly one layout"),
    ],
)
def test_a_table_that_fails_its_check_is_refused_and_the_old_one_kept(body, why):
    tables = swap()
    tables.follow({"static-a": "static-a+a1"}, fetcher({"static-a+a1": FITTED.to_json_dict()}))
    before = tables.current(fitted=True)
    fetch = fetcher({"static-a+a2": body})
    assert not tables.follow({"static-a": "static-a+a2"}, fetch)
    assert tables.current(fitted=True) == before
    assert why in tables.refused["static-a+a2"]
    assert not tables.follow({"static-a": "static-a+a2"}, fetch) and fetch.calls == ["static-a+a2"]  # not retried


def test_another_groups_table_is_not_this_replicas():
    tables = swap()
    assert not tables.follow({"static-b": "static-b+a1"}, fetcher({})) and tables.fitted is None
