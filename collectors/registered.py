"""Arrow tables a DuckDB statement reads by name, for the length of a block.

DuckDB answers every statement in an aborted transaction with "Current transaction is aborted", unregistering
a view included. A ``finally`` that unregisters after a failed statement would raise that instead, and the
real cause (an overflow, a constraint) would be lost to the caller and its logs; here it is the one raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb
import pyarrow as pa


@contextlib.contextmanager
def registered(con: duckdb.DuckDBPyConnection, **tables: pa.Table) -> Iterator[None]:
    """``tables`` registered on ``con`` under their keyword names inside the block, unregistered after it."""
    for name, table in tables.items():
        con.register(name, table)
    try:
        yield
    except BaseException:
        for name in tables:
            with contextlib.suppress(duckdb.Error):  # the block's own error is the one that says why
                con.unregister(name)
        raise
    for name in tables:
        con.unregister(name)
