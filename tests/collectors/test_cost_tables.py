"""The versioned cost tables: a registration stores a version once, whoever looked first."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from sparkgate.collectors import cost_tables
from sparkgate.collectors.cost_tables import VersionConflict, static_entry
from tests.controller.timed_steps import STATIC


def _lost_the_race(monkeypatch, store, stored):
    """``add`` looks, finds nothing, and another registration stores ``stored`` before its insert."""
    real_get, looks = cost_tables.get, []

    def get(store_, version):
        looks.append(version)
        if len(looks) == 1:
            cost_tables.add(store_, stored)
            return None
        return real_get(store_, version)

    monkeypatch.setattr(cost_tables, "get", get)


def test_a_registration_that_lost_the_race_to_the_same_table_is_a_repeat_not_an_error(store, monkeypatch):
    entry = static_entry(STATIC, now=1.0)
    _lost_the_race(monkeypatch, store, entry)
    assert cost_tables.add(store, entry) is False
    assert [e.version for e in cost_tables.entries(store)] == [entry.version]


def test_a_registration_that_lost_the_race_to_another_table_is_a_conflict(store, monkeypatch):
    entry = static_entry(STATIC, now=1.0)
    other = dataclasses.replace(STATIC, bias_seconds=STATIC.bias_seconds * 2)  # the same version, another body
    _lost_the_race(monkeypatch, store, static_entry(other, now=1.0))
    with pytest.raises(VersionConflict, match="already stored with another table"):
        cost_tables.add(store, entry)


def test_replicas_registering_one_table_at_once_store_it_once(store):
    entry, results, errors = static_entry(STATIC, now=1.0), [], []

    def register():
        try:
            results.append(cost_tables.add(store, entry))
        except Exception as exc:  # any error is the failure this test looks for
            errors.append(exc)

    threads = [threading.Thread(target=register) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(results) == [False] * 7 + [True]
