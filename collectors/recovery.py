"""Censored labels recovered from the tokens a request commits next (docs/design.md §2).

Lossless verification commits the target's argmax at every position of a greedy
request, so the tokens the request commits after a step are exactly the target's
continuation. A compact row that used up its window (``a = w < γ``) left depths
``k > w`` unverified; its label at depth ``k`` is 1 when drafts ``w+1 .. k`` equal
the tokens committed at their positions, else 0. Row tokens sit at
``position + i`` (drafts from draft 1, committed tokens from the first committed),
so the bonus token of the same row settles depth ``w+1`` and later rows the rest.

Per censored row, walking ``j = w+1 .. γ``: the first draft whose position is not
yet committed (or whose token was not reported, -1) stops the walk with those
depths still censored; the first draft that differs from the committed token is
a rejection at ``j``: depths ``< j`` are recovered as 1, ``>= j`` as 0 (status
``recovered`` either way; a full verification would say rejected at ``j`` and not
at risk beyond, which a recovered label does not record). Only ``censored`` labels
are ever updated, so an observed label is never overwritten, and the result
depends only on which rows are stored, not on the order they arrived in.

Sampled requests (temperature > 0) are not recovered: their labels are random
given the tokens (``collectors.labels`` marks depth ``w+1`` ``estimated``).
Recovery runs inside the ingest transaction, over the requests the batch touches
and their rows of the last ``HORIZON_S`` seconds of step time, so its cost does
not grow with the store; a continuation that arrives later stays censored. A row
whose labels are all settled is marked (``recovery_open`` false) and not walked
again, and only the tokens from a request's oldest open row on are read, so a
long request does not make each commit re-read its whole history.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from sparkgate.collectors.registered import registered

# Rows of a touched request older than this (step time, before the batch's oldest step) are not read.
HORIZON_S = 600.0

_SETTLE = """
WITH touched AS (SELECT DISTINCT replica_id, request_id FROM recovery_keys),
open_rows AS (
    SELECT r.replica_id, r.request_id, r.step_id, r.position, r."window" AS w, r.draft_tokens
    FROM requests r JOIN touched t ON r.replica_id = t.replica_id AND r.request_id = t.request_id
    WHERE r.ts >= ? AND r.recovery_open IS NOT FALSE AND r.position IS NOT NULL AND r.mode = 'compact'
      AND r.temperature = 0 AND r.draft_tokens IS NOT NULL AND r.accepted = r."window"
      AND r."window" < len(r.draft_tokens)
),
frontier AS (SELECT replica_id, request_id, min(position) AS start FROM open_rows GROUP BY ALL),
stream AS (
    SELECT r.replica_id, r.request_id, r.position + i - 1 AS pos, r.committed_tokens[i] AS token
    FROM requests r JOIN frontier f ON r.replica_id = f.replica_id AND r.request_id = f.request_id,
         range(1, len(r.committed_tokens) + 1) t(i)
    WHERE r.ts >= ? AND r.position + len(r.committed_tokens) > f.start AND r.committed_tokens[i] >= 0
),
checks AS (
    SELECT c.replica_id, c.request_id, c.step_id, t.j, s.token IS NULL AS unknown,
           s.token IS NOT NULL AND s.token = c.draft_tokens[t.j] AS matched
    FROM open_rows c CROSS JOIN LATERAL (SELECT unnest(range(c.w + 1, len(c.draft_tokens) + 1)) AS j) t
    LEFT JOIN stream s ON s.replica_id = c.replica_id AND s.request_id = c.request_id
         AND s.pos = c.position + t.j - 1
)
SELECT replica_id, request_id, step_id,
       min(j) FILTER (WHERE NOT matched) AS stop,
       arg_min(unknown, j) FILTER (WHERE NOT matched) AS stop_unknown
FROM checks GROUP BY ALL
"""

_UPDATE = """
UPDATE depth_labels l
SET status = 'recovered', label = f.stop IS NULL OR l.depth < f.stop
FROM recovery_stops f
WHERE l.ts >= ? AND l.replica_id = f.replica_id AND l.request_id = f.request_id AND l.step_id = f.step_id
  AND l.status = 'censored' AND (f.stop IS NULL OR l.depth < f.stop OR NOT f.stop_unknown)
RETURNING l.*
"""

# A row whose every label is settled is not walked again.
_CLOSE = """
UPDATE requests r SET recovery_open = FALSE
FROM recovery_stops f
WHERE r.ts >= ? AND r.replica_id = f.replica_id AND r.request_id = f.request_id AND r.step_id = f.step_id
  AND (f.stop IS NULL OR NOT f.stop_unknown)
"""


def recover(con: duckdb.DuckDBPyConnection, requests: pa.Table) -> Settled | None:
    """Settle what ``requests`` (request rows just inserted, in the caller's open transaction) make known:
    censored labels of the requests they belong to, on earlier rows or their own. Returns the labels
    settled, as they are stored now (None: none). Rows without ``position`` (producers that do not
    report it) cost nothing."""
    known = requests.filter(pc.is_valid(requests.column("position")))
    if not known.num_rows:
        return None
    since = pc.min(known.column("ts")).as_py() - HORIZON_S
    with registered(con, recovery_keys=known.select(["replica_id", "request_id"])):
        stops = con.sql(_SETTLE, params=[since, since]).to_arrow_table()
    if not stops.num_rows:
        return None
    with registered(con, recovery_stops=stops):
        # The ts bound keeps old row groups unread.
        settled = con.sql(_UPDATE, params=[since]).to_arrow_table()
        con.execute(_CLOSE, [since])
    return Settled(settled, since) if settled is not None and settled.num_rows else None


@dataclass(frozen=True)
class Settled:
    """Labels one batch settled (their stored rows) and the oldest step time recovery read."""

    labels: pa.Table
    since: float
