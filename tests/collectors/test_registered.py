"""Tables registered for a block: unregistered after it, and a failed statement's own error is the one raised."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from sparkgate.collectors.registered import registered


def test_a_failed_statement_in_a_transaction_raises_its_own_error_not_the_aborted_transactions():
    con = duckdb.connect(":memory:")
    con.execute("BEGIN")
    big = pa.table({"position": pa.array([2**63 - 1], pa.int64())})
    with pytest.raises(duckdb.OutOfRangeException, match="Overflow in addition of INT64"), registered(con, big=big):
        con.execute("SELECT position + 3 FROM big").fetchall()
    con.execute("ROLLBACK")
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'big'").fetchall() == [(0,)]


def test_tables_are_readable_inside_the_block_and_gone_after_it():
    con = duckdb.connect(":memory:")
    with registered(con, a=pa.table({"x": [1, 2]}), b=pa.table({"x": [3]})):
        assert con.execute("SELECT sum(x) FROM (SELECT x FROM a UNION ALL SELECT x FROM b)").fetchall() == [(6,)]
    with pytest.raises(duckdb.CatalogException):
        con.execute("SELECT * FROM a")
