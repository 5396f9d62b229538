"""Merged aggregates give the same ECE, Brier and reliability as the raw rows."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.aggregate import Aggregate
from sparkgate.collectors.batch import prepare
from sparkgate.collectors.synth import synthetic_wire
from sparkgate.collectors.wire import from_records, from_wire
from sparkgate.policies.binning import N_BINS
from tests.collectors.strategies import step_records


def tables(records):
    prepared = prepare(from_records(records))
    assert not prepared.quarantined
    return prepared.requests, prepared.labels


def raw_ece(pairs):
    """Reference: the textbook ECE over (p, y) rows with edges k/15 and p = 1 in the last bin."""
    bins = [[] for _ in range(N_BINS)]
    for p, y in pairs:
        k = N_BINS - 1 if p == 1.0 else next(b for b in range(N_BINS) if b / N_BINS <= p < (b + 1) / N_BINS)
        bins[k].append((p, y))
    return sum(abs(sum(p for p, _ in b) - sum(y for _, y in b)) for b in bins if b) / len(pairs)


def survival_pairs(labels, depth, modes):
    return [
        (r["survival"], float(r["label"]))
        for r in labels.to_pylist()
        if r["depth"] == depth and r["mode"] in modes and r["status"] != "censored"
    ]


@settings(max_examples=40, deadline=None)
@given(st.lists(step_records(), min_size=2, max_size=6, unique_by=lambda r: r.step_id), st.integers(1, 5))
def test_merge_of_shards_equals_the_raw_rows(records, cut):
    cut = min(cut, len(records) - 1)
    whole = Aggregate.from_tables(*tables(records), depths=6)
    merged = Aggregate.from_tables(*tables(records[:cut]), depths=6).merge(
        Aggregate.from_tables(*tables(records[cut:]), depths=3 if all(r.gamma <= 3 for r in records[cut:]) else 6)
    )
    for kind in ("survival", "conditional"):
        a, b = getattr(whole, kind), getattr(merged, kind)
        assert np.array_equal(a.count, b.count) and np.array_equal(a.sum_y, b.sum_y)
        assert np.allclose(a.sum_p, b.sum_p, rtol=1e-12, atol=1e-12)
    assert np.array_equal(whole.accept_hist, merged.accept_hist)
    _, labels = tables(records)
    modes = ("static", "shadow", "cap_accept")
    for depth, ece in merged.survival.ece(modes).items():
        assert math.isclose(ece, raw_ece(survival_pairs(labels, depth, modes)), rel_tol=1e-9, abs_tol=1e-12)


def test_ece_brier_reliability_and_utilization_on_a_large_batch():
    wire = synthetic_wire(200, batch=16, gamma=5)
    requests, labels = tables_from_wire(wire)
    agg = Aggregate.from_tables(requests, labels, depths=5)
    rows = labels.to_pylist()
    modes = ("static", "shadow", "cap_accept")
    for depth in range(1, 6):
        pairs = survival_pairs(labels, depth, modes)
        assert math.isclose(agg.survival.ece(modes)[depth], raw_ece(pairs), rel_tol=1e-9)
        assert math.isclose(
            agg.survival.brier(modes)[depth], sum((p - y) ** 2 for p, y in pairs) / len(pairs), rel_tol=1e-9
        )
        at_risk = [
            (r["confidence"], float(r["label"]))
            for r in rows
            if r["depth"] == depth and r["status"] in ("accepted", "rejected") and r["mode"] in modes
        ]
        assert math.isclose(agg.conditional.ece(modes)[depth], raw_ece(at_risk), rel_tol=1e-9)
        bins = agg.survival.reliability(depth, modes)
        assert sum(b["count"] for b in bins) == len(pairs) == agg.survival.samples(modes)[depth]
    reqs = requests.to_pylist()
    cap = [r for r in reqs if r["mode"] == "cap_accept"]
    assert math.isclose(
        agg.upper_bound_utilization(), sum(r["accepted"] for r in cap) / sum(min(r["full_accept"], 5) for r in cap)
    )
    shadow = [r for r in reqs if r["mode"] == "shadow"]
    assert math.isclose(
        agg.shadow_utilization(),
        sum(min(r["full_accept"], r["window_suggested"]) for r in shadow) / sum(r["full_accept"] for r in shadow),
    )
    again = Aggregate.from_dict(json.loads(json.dumps(agg.to_dict())))
    assert again.survival.ece(modes) == agg.survival.ece(modes)
    assert np.array_equal(again.full_hist, agg.full_hist)


def tables_from_wire(wire):
    prepared = prepare(from_wire(wire))
    return prepared.requests, prepared.labels
