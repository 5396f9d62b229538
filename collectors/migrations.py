"""Schema migrations of the DuckDB store, applied in order and recorded in ``schema_migrations``.

A migration is never edited once released: a change is a new entry. Each one
runs in its own transaction together with its ``schema_migrations`` row, so a
crash leaves the store either before or after it. An enum column changes type by
copying its table (DuckDB 1.x cannot replay ``ALTER ... SET DATA TYPE`` to a new
enum from its write-ahead log: a crash before the next checkpoint would leave a
store that no longer opens).
"""

from __future__ import annotations

import time

import duckdb

from sparkgate.collectors import label_sums
from sparkgate.policies.errors import InputError


class StoreOpenError(InputError):
    """The path is not a store this sparkgate can open: not a DuckDB file, locked by another process, another
    application's database, or a newer sparkgate's store. Nothing was written to it."""


MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "v1 event tables",
        """
    CREATE TYPE verify_mode AS ENUM ('static', 'shadow', 'compact', 'cap_accept');
    CREATE TYPE label_status AS ENUM ('accepted', 'rejected', 'not_at_risk', 'censored');
    CREATE TABLE steps (
        schema_version BIGINT NOT NULL, replica_id VARCHAR NOT NULL, step_id BIGINT NOT NULL,
        ts DOUBLE NOT NULL, batch_size BIGINT NOT NULL, gamma BIGINT NOT NULL,
        verify_rows BIGINT NOT NULL, tier_rows BIGINT NOT NULL, tier BIGINT NOT NULL,
        graph_hit BOOLEAN NOT NULL, miss_reason VARCHAR,
        draft_ms DOUBLE NOT NULL, schedule_ms DOUBLE NOT NULL, verify_ms DOUBLE NOT NULL,
        accept_ms DOUBLE NOT NULL, step_ms DOUBLE NOT NULL, predicted_step_ms DOUBLE,
        host_syncs BIGINT NOT NULL, phase VARCHAR NOT NULL, policy_revision BIGINT NOT NULL,
        model_version VARCHAR NOT NULL, drafter_version VARCHAR NOT NULL,
        sts_version VARCHAR, cost_table_version VARCHAR,
        PRIMARY KEY (replica_id, step_id)
    );
    CREATE TABLE requests (
        replica_id VARCHAR NOT NULL, step_id BIGINT NOT NULL, ts DOUBLE NOT NULL, slot INTEGER NOT NULL,
        request_id VARCHAR NOT NULL, mode verify_mode NOT NULL, task VARCHAR NOT NULL,
        temperature DOUBLE NOT NULL, window_suggested BIGINT, "window" BIGINT NOT NULL,
        accepted BIGINT NOT NULL, full_accept BIGINT, cap_trim BIGINT NOT NULL,
        confidence DOUBLE[] NOT NULL, survival DOUBLE[] NOT NULL, committed_tokens BIGINT[] NOT NULL
    );
    CREATE TABLE depth_labels (
        replica_id VARCHAR NOT NULL, step_id BIGINT NOT NULL, ts DOUBLE NOT NULL,
        request_id VARCHAR NOT NULL, mode verify_mode NOT NULL, depth SMALLINT NOT NULL,
        status label_status NOT NULL, confidence DOUBLE NOT NULL, survival DOUBLE NOT NULL,
        label BOOLEAN
    );
    CREATE TABLE quarantine (
        received_at DOUBLE NOT NULL, source VARCHAR NOT NULL, position BIGINT NOT NULL,
        replica_id VARCHAR, step_id BIGINT, reason VARCHAR NOT NULL, problems JSON NOT NULL,
        payload BLOB NOT NULL
    );
    CREATE TABLE decisions (
        decided_at DOUBLE NOT NULL, revision BIGINT NOT NULL, phase_from VARCHAR,
        phase_to VARCHAR NOT NULL, action VARCHAR NOT NULL, reasons JSON NOT NULL
    );
    """,
    ),
    (
        2,
        "rollout decisions carry their stage, interval outcome and operator; consistency checks",
        """
    ALTER TABLE decisions ADD COLUMN compact_fraction DOUBLE;
    ALTER TABLE decisions ADD COLUMN outcome VARCHAR;
    ALTER TABLE decisions ADD COLUMN operator VARCHAR;
    CREATE TABLE consistency_checks (
        received_at DOUBLE NOT NULL, replica_id VARCHAR NOT NULL, request_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL, tokens BIGINT NOT NULL, mismatch_at BIGINT, expected BIGINT, got BIGINT
    );
    """,
    ),
    (
        3,
        "fleet aggregates reported by replicas instead of rows",
        """
    CREATE TABLE aggregates (
        received_at DOUBLE NOT NULL, replica_id VARCHAR NOT NULL, interval_start DOUBLE NOT NULL,
        interval_end DOUBLE NOT NULL, labels BIGINT NOT NULL, payload JSON NOT NULL
    );
    """,
    ),
    (
        4,
        "a consistency check is stored once: keyed by replica, kind, request and tokens compared",
        """
    CREATE TABLE consistency_checks_keyed (
        received_at DOUBLE NOT NULL, replica_id VARCHAR NOT NULL, request_id VARCHAR NOT NULL,
        kind VARCHAR NOT NULL, tokens BIGINT NOT NULL, mismatch_at BIGINT, expected BIGINT, got BIGINT,
        PRIMARY KEY (replica_id, kind, request_id, tokens)
    );
    INSERT INTO consistency_checks_keyed
        SELECT * FROM consistency_checks QUALIFY row_number() OVER (
            PARTITION BY replica_id, kind, request_id, tokens ORDER BY received_at) = 1;
    DROP TABLE consistency_checks;
    ALTER TABLE consistency_checks_keyed RENAME TO consistency_checks;
    """,
    ),
    (
        5,
        "steps carry the joint contract they were measured under; decisions the contract they judged",
        """
    ALTER TABLE steps ADD COLUMN contract VARCHAR;
    ALTER TABLE decisions ADD COLUMN contract VARCHAR;
    """,
    ),
    (
        6,
        "event schema v2: steps carry their switchback epoch and arm and CPU time; request records",
        """
    ALTER TABLE steps ADD COLUMN epoch BIGINT;
    ALTER TABLE steps ADD COLUMN arm VARCHAR;
    ALTER TABLE steps ADD COLUMN step_cpu_ms DOUBLE;
    CREATE TABLE request_records (
        schema_version BIGINT NOT NULL, replica_id VARCHAR NOT NULL, request_id VARCHAR NOT NULL,
        arrival_ts DOUBLE NOT NULL, first_token_ts DOUBLE, finish_ts DOUBLE NOT NULL,
        finish_reason VARCHAR NOT NULL, prompt_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
        mode VARCHAR NOT NULL, phase VARCHAR NOT NULL, policy_revision BIGINT NOT NULL,
        epoch BIGINT, arm VARCHAR, contract VARCHAR,
        commit_offsets_ms DOUBLE[] NOT NULL, commit_tokens BIGINT[] NOT NULL,
        ttft_ms DOUBLE, tpot_ms DOUBLE,
        PRIMARY KEY (replica_id, request_id)
    );
    """,
    ),
    (
        7,
        "censored-label recovery: request rows carry draft tokens, position and the next draft's acceptance "
        "probability; labels may be recovered or estimated",
        """
    ALTER TABLE requests ADD COLUMN draft_tokens BIGINT[];
    ALTER TABLE requests ADD COLUMN position BIGINT;
    ALTER TABLE requests ADD COLUMN next_accept_prob DOUBLE;
    ALTER TABLE requests ADD COLUMN recovery_open BOOLEAN;
    CREATE TYPE label_status_v2 AS ENUM
        ('accepted', 'rejected', 'not_at_risk', 'censored', 'recovered', 'estimated');
    CREATE TABLE depth_labels_v2 (
        replica_id VARCHAR NOT NULL, step_id BIGINT NOT NULL, ts DOUBLE NOT NULL,
        request_id VARCHAR NOT NULL, mode verify_mode NOT NULL, depth SMALLINT NOT NULL,
        status label_status_v2 NOT NULL, confidence DOUBLE NOT NULL, survival DOUBLE NOT NULL,
        label BOOLEAN, probability DOUBLE
    );
    INSERT INTO depth_labels_v2 SELECT replica_id, step_id, ts, request_id, mode, depth,
        status::VARCHAR::label_status_v2, confidence, survival, label, NULL FROM depth_labels;
    DROP TABLE depth_labels;
    ALTER TABLE depth_labels_v2 RENAME TO depth_labels;
    DROP TYPE label_status;
    """,
    ),
    (
        8,
        "incremental evaluation: per-bucket sums of labels and request rows, filled from what is stored",
        label_sums.create_sql() + label_sums.rebuild_sql(),
    ),
    (9, "each phase and contract's span of step time, for reads of a reference phase", label_sums.SPANS_SQL),
    (
        10,
        "versioned cost tables: the static tables replicas start from and the ones adaptive fits",
        """
    CREATE TABLE cost_tables (
        version VARCHAR PRIMARY KEY, replica_group VARCHAR NOT NULL, parent VARCHAR, source VARCHAR NOT NULL,
        created_at DOUBLE NOT NULL, fitted_since DOUBLE, fitted_until DOUBLE, fitted_steps BIGINT,
        heldout_steps BIGINT, error_parent DOUBLE, error_candidate DOUBLE, body VARCHAR NOT NULL
    );
    """,
    ),
    (
        11,
        "steps carry the served cost table's prediction at the rows they verified (record version 3)",
        "ALTER TABLE steps ADD COLUMN table_step_ms DOUBLE;",
    ),
    (
        12,
        "incremental evaluation: the sums gain the windowed labels (survival within the scheduler's window)",
        "".join(f"\nDELETE FROM {table};" for table in label_sums.SUM_TABLES) + label_sums.rebuild_sql(),
    ),
    (
        13,
        "each phase and contract counts the writes of its sums: the version kept references check",
        label_sums.WRITES_SQL,
    ),
    (
        14,
        "each sum bucket counts the writes of its sums: the version a kept window's closed buckets check",
        label_sums.BUCKETS_SQL,
    ),
    (
        15,
        "decisions carry the ladder rung they leave the rollout on (paused: the rung a resume returns to)",
        "ALTER TABLE decisions ADD COLUMN rung VARCHAR;",
    ),
)


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """The highest applied migration, 0 for an empty database."""
    con.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
        version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, applied_at DOUBLE NOT NULL)""")
    return con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchall()[0][0]


def not_a_store(con: duckdb.DuckDBPyConnection, create: bool = True) -> str | None:
    """Why the database ``con`` is open on is no sparkgate store to migrate, or None: it holds other
    tables but no ``schema_migrations`` (another application's), or without ``create`` no tables at all."""
    names = [name for (name,) in con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() ORDER BY 1"
    ).fetchall()]  # fmt: skip
    if names and "schema_migrations" not in names:
        return (
            "not a sparkgate store (it holds other tables: "
            + ", ".join(names[:5])
            + (", ...)" if len(names) > 5 else ")")
        )
    if not names and not create:
        return "an empty database, not a sparkgate store"
    return None


def migrate(con: duckdb.DuckDBPyConnection, create: bool = True) -> int:
    """Apply every pending migration; returns the resulting version.

    Raises ``StoreOpenError``, having written nothing, for another application's database (tables but no
    ``schema_migrations``: ours are not added beside them), for a store written by a newer sparkgate,
    which this code cannot read correctly, and without ``create`` for a database that holds no tables (a
    command that reads a store's history was given the wrong file, and must not make it a store).
    """
    problem = not_a_store(con, create)
    if problem:
        raise StoreOpenError(f"{problem}; nothing was changed")
    version = current_version(con)
    latest = MIGRATIONS[-1][0]
    if version > latest:
        raise StoreOpenError(f"store schema version {version} is newer than this sparkgate ({latest})")
    for number, description, sql in MIGRATIONS:
        if number <= version:
            continue
        con.execute("BEGIN TRANSACTION")
        try:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)", [number, description, time.time()])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
    return latest
