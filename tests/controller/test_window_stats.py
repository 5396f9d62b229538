"""Figures read from the ingest-time sums equal those of a scan of every row in the window."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkgate.collectors.schema import MODES
from sparkgate.controller import window_stats, window_sums
from sparkgate.controller.evaluate import evaluate
from sparkgate.controller.queries import SameContract, Slice, Window
from sparkgate.controller.window_sums import WindowStats
from sparkgate.policies.binning import N_BINS
from tests.controller.window_fixtures import T0, assert_same, labelled_store


@pytest.fixture(scope="module")
def store():
    with labelled_store() as s:
        yield s


def _scan(store, window, slice_, phase=None, contract=None, windowed=True) -> WindowStats:
    return window_stats._from_rows(store, window, slice_, phase, contract, None, windowed=windowed)


@settings(max_examples=40, deadline=None)
@given(
    since=st.one_of(st.none(), st.floats(T0 - 5, T0 + 110)),
    length=st.one_of(st.none(), st.floats(0.01, 120)),
    replica=st.sampled_from([None, "a", "b"]),
)
def test_any_window_reads_the_figures_of_its_rows(store, since, length, replica):
    until = None if length is None else (since if since is not None else T0) + length
    window, slice_ = Window(since, until), Slice(replica_id=replica)
    a, b = window_stats.read(store, window, slice_, windowed=True), _scan(store, window, slice_)
    assert a.labels == b.labels
    assert_same(a, b)


@settings(max_examples=25, deadline=None)
@given(
    since=st.one_of(st.none(), st.floats(T0 - 5, T0 + 110)),
    length=st.one_of(st.none(), st.floats(0.01, 120)),
    replicas=st.sampled_from([None, ("a",), ("b", "a")]),
    use_sums=st.booleans(),
)
def test_a_read_at_the_equal_width_bins_is_the_fine_read_summed_per_bin(store, since, length, replicas, use_sums):
    until = None if length is None else (since if since is not None else T0) + length
    window = Window(since, until)
    fine, coarse = (window_stats.read(store, window, Slice(), use_sums=use_sums, windowed=True, replicas=replicas,
                                      fine_bins=f) for f in (True, False))  # fmt: skip
    assert coarse.survival.fine_count.shape[2] == N_BINS
    want = dataclasses.replace(
        fine,
        survival=fine.survival.coarse(),
        conditional=fine.conditional.coarse(),
        windowed=fine.windowed.coarse(),
        by_replica=None if fine.by_replica is None else
        {k: {r: s.coarse() for r, s in of.items()} for k, of in fine.by_replica.items()},
    )  # fmt: skip
    assert_same(coarse, want)  # per replica too


def _assert_same_kind(a, b) -> None:
    """Equal statistics, the narrower padded with the empty trailing depths the wider has."""
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        width = max(x.shape[1], y.shape[1])
        x, y = (np.pad(v, [(0, 0), (0, width - v.shape[1])] + [(0, 0)] * (v.ndim - 2)) for v in (x, y))
        assert np.allclose(x, y), name


@settings(max_examples=30, deadline=None)
@given(
    since=st.one_of(st.none(), st.floats(T0 - 5, T0 + 110)),
    length=st.one_of(st.none(), st.floats(0.01, 120)),
    phase=st.sampled_from([None, "shadow"]),
)
def test_survival_alone_and_per_replica_read_what_the_full_read_does(store, since, length, phase):
    until = None if length is None else (since if since is not None else T0) + length
    window = Window(since, until)
    contract = None if phase is None else SameContract(None)
    full = window_stats.read(store, window, Slice(), phase, contract, windowed=True)
    _assert_same_kind(window_stats.survival(store, window, Slice(), phase, contract), full.survival)
    windowed = window_stats.survival(store, window, Slice(), phase, contract, window_sums.WINDOWED_SURVIVAL)
    _assert_same_kind(windowed, full.windowed)
    # Read per replica ("a" left unlisted, so its labels are the fleet's but no replica's), the fleet's
    # figures are those of the plain read.
    listed = ["b", "absent"]
    with_replicas = window_stats.read(store, window, Slice(), phase, contract, windowed=True, replicas=listed)
    assert_same(dataclasses.replace(with_replicas, by_replica=None), full)
    assert with_replicas.by_replica is not None and full.by_replica is None
    by_replica = with_replicas.by_replica
    assert set(by_replica) == {window_sums.SURVIVAL, window_sums.WINDOWED_SURVIVAL}
    for replica in listed:
        alone = window_stats.read(store, window, Slice(replica_id=replica), phase, contract, windowed=True)
        _assert_same_kind(by_replica[window_sums.SURVIVAL][replica], alone.survival)
        _assert_same_kind(by_replica[window_sums.WINDOWED_SURVIVAL][replica], alone.windowed)
    assert by_replica[window_sums.SURVIVAL]["absent"].fine_count.sum() == 0
    # From the rows (no sums), the same figures; with no replica listed, none.
    rows = window_stats.read(store, window, Slice(), phase, contract, False, True, ["a", "b"]).by_replica
    assert rows is not None
    for kind in by_replica:
        _assert_same_kind(rows[kind]["b"], by_replica[kind]["b"])
    none = window_stats.read(store, window, Slice(), phase, contract, windowed=False, replicas=[])
    assert_same(dataclasses.replace(none, by_replica=None), window_stats.read(store, window, Slice(), phase, contract))
    assert none.by_replica == {window_sums.SURVIVAL: {}}


def test_windowed_labels_are_every_depth_within_each_rows_scheduler_window(store):
    # Every depth up to the scheduler's window (shadow: its suggestion) of a shadow, compact or cap-accept
    # row counts, and nothing else: none of them is censored, so the selection is the prediction's alone.
    expected = store.query(
        "SELECT d.depth, count(*) AS n FROM requests r, range(1, 6) d(depth) WHERE r.mode IN "
        "('shadow', 'compact', 'cap_accept') AND d.depth <= CASE WHEN r.mode = 'shadow' THEN r.window_suggested "
        'ELSE r."window" END GROUP BY ALL ORDER BY ALL'
    ).to_pylist()
    windowed = window_stats.read(store, Window(), Slice(), windowed=True).windowed
    assert windowed is not None and window_stats.read(store, Window(), Slice()).windowed is None  # read if asked
    counts = windowed.fine_count.sum(axis=(0, 2, 3))
    assert {r["depth"]: r["n"] for r in expected} == {d: int(n) for d, n in enumerate(counts) if n}
    assert windowed.fine_count[MODES.index("static")].sum() == 0
    modes = store.query("SELECT DISTINCT mode::VARCHAR AS m FROM requests WHERE mode <> 'static'").column("m")
    assert {"shadow", "compact"} <= set(modes.to_pylist())  # the fixture exercises the windowed modes
    assert windowed.grouped_count.sum() == counts.sum()
    # Compact rows that accepted their whole window were censored beyond it (recovery settled most since):
    # none of those depths counts.
    beyond = "SELECT count(*) AS n FROM depth_labels WHERE status IN ('censored', 'recovered')"
    assert store.query(beyond).column("n")[0].as_py() > 0


def test_a_phase_and_contract_read_the_steps_recorded_in_them(store):
    shadow = window_stats.read(store, Window(), Slice(), "shadow", SameContract(None))
    assert_same(shadow, _scan(store, Window(), Slice(), "shadow", SameContract(None), windowed=False))
    assert 0 < shadow.labels < window_stats.read(store, Window(), Slice()).labels
    assert window_stats.read(store, Window(), Slice(), "shadow", SameContract("other")).labels == 0
    totals = window_sums.full_accept_totals(store, Slice(), ("shadow", "baseline"))
    from sparkgate.controller import queries

    assert totals == queries.full_accept_totals(store, Window(), Slice(), ("shadow", "baseline"))


def test_the_evaluation_is_the_same_from_sums_or_rows(store):
    for window in (Window(T0 + 3.7, T0 + 77.7), Window()):
        _assert_close(
            evaluate(store, window, use_sums=False).report("canary"), evaluate(store, window).report("canary")
        )


def _assert_close(a, b, path="report"):
    """Equal structure and values, floats to 1e-9 relative (sums add in another order)."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _assert_close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and b is not None:
        assert a == pytest.approx(b, rel=1e-9, abs=1e-12), path
    else:
        assert a == b, path


def test_a_store_without_the_sums_tables_is_read_from_its_rows(store):
    class Old:  # a reader over a snapshot published before the sums existed
        def query(self, sql, params=None):
            if "_sums" in sql:
                import duckdb

                raise duckdb.CatalogException("Table with name label_fine_sums does not exist")
            return store.query(sql, params)

    window = Window(T0 + 3.7, T0 + 77.7)
    assert_same(window_stats.read(Old(), window, Slice(), windowed=True), _scan(store, window, Slice()))
