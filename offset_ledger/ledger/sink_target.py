"""The SQL a Postgres sink runs in its target database: the staging tables and the target's commit log.

The target is the user's database (the ledger's own, or another one: ``PostgresSink(target_dsn=...)``),
not the ledger's schema; its SQL still lives here, in ``ledger/``, so that every statement the
package sends to a database is in one folder (``tests/unit/project/test_layers.py`` holds it to that).

**Staging tables** (``sinks.staging.Staging`` names them and has the executors fill them): one UNLOGGED
table per attempt, shaped like the target, moved into the target and dropped in the commit's transaction.

**The target's commit log.** When the target table lives in another database than the ledger, no
transaction spans both. The sink's commit then goes to the target alone: the staged rows, the batch's
identity and sequence, and the batch's ledger record (as JSON) in ``offset_ledger_sink_commits``, one
transaction; the ledger is told right after. A crash in between leaves the ledger behind the target,
never ahead: ``PostgresSink.reconcile`` (which ``start_from_ledger(..., sinks=[...])`` runs before
planning) records what the target committed and the ledger lacks. ``offset_ledger_sink_fence`` is the
row a commit locks, as ``sinks`` is in the ledger.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from offset_ledger.rules.sink_copy import quote_ident
from offset_ledger.rules.sink_identity import SinkState

COMMITS = "offset_ledger_sink_commits"
FENCE = "offset_ledger_sink_fence"


# -- staging tables -----------------------------------------------------------------------------


def create_staging(conn: Connection, target: str, name: str, columns: list[str]) -> None:
    """An UNLOGGED table ``name`` with ``target``'s types of ``columns``, empty (no constraints)."""
    names = ", ".join(quote_ident(c) for c in columns)
    conn.execute(text(f"CREATE UNLOGGED TABLE {quote_ident(name)} AS SELECT {names} "
                      f"FROM {quote_ident(target)} WITH NO DATA"))


def move_staged(conn: Connection, target: str, name: str, columns: list[str]) -> int:
    """The rows of staging table ``name`` into ``target``, the staging table dropped; how many moved."""
    names = ", ".join(quote_ident(c) for c in columns)
    result = conn.execute(text(f"INSERT INTO {quote_ident(target)} ({names}) SELECT {names} "
                               f"FROM {quote_ident(name)}"))
    conn.execute(text(f"DROP TABLE {quote_ident(name)}"))
    return int(result.rowcount)


def drop_staging(conn: Connection, name: str) -> None:
    conn.execute(text(f"DROP TABLE IF EXISTS {quote_ident(name)}"))


def staging_tables(conn: Connection, schema: str | None, prefix: str) -> list[str]:
    """The bare names of the tables in ``schema`` (None: the current schema) that start with ``prefix``."""
    return list(conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = COALESCE(:s, current_schema()) "
                                  "AND left(tablename, :n) = :p"),
                             {"s": schema, "n": len(prefix), "p": prefix}).scalars())


# -- the target's commit log --------------------------------------------------------------------


def ensure_tables(conn: Connection) -> None:
    conn.execute(text(
        f"CREATE TABLE IF NOT EXISTS {COMMITS} (sink text NOT NULL, sequence bigint NOT NULL, "
        "generation_id bigint NOT NULL, query_id text NOT NULL, batch_id bigint NOT NULL, row_count bigint, "
        "batch jsonb NOT NULL, committed_at timestamptz NOT NULL, PRIMARY KEY (sink, sequence), "
        "UNIQUE (sink, generation_id, batch_id))"))
    conn.execute(text(f"CREATE TABLE IF NOT EXISTS {FENCE} (sink text PRIMARY KEY, last_sequence bigint NOT NULL, "
                      "generation_id bigint, batch_id bigint)"))


def lock(conn: Connection, sink: str) -> SinkState:
    """Hold the sink's fence row in the target until the transaction ends; its last commit."""
    conn.execute(text(f"INSERT INTO {FENCE} (sink, last_sequence) VALUES (:s, 0) ON CONFLICT DO NOTHING"),
                 {"s": sink})
    row = conn.execute(text(f"SELECT last_sequence, generation_id, batch_id FROM {FENCE} WHERE sink = :s "
                            "FOR UPDATE"), {"s": sink}).one()
    return SinkState(int(row.last_sequence), row.generation_id, row.batch_id)


def committed_sequence(conn: Connection, sink: str, generation_id: int, batch_id: int) -> int | None:
    value = conn.execute(text(f"SELECT sequence FROM {COMMITS} WHERE sink = :s AND generation_id = :g "
                              "AND batch_id = :b"), {"s": sink, "g": generation_id, "b": batch_id}).scalar()
    return None if value is None else int(value)


def record(conn: Connection, sink: str, *, sequence: int, generation_id: int, query_id: str, batch_id: int,
           row_count: int, batch: dict[str, Any], committed_at: datetime) -> None:
    conn.execute(text(f"INSERT INTO {COMMITS} (sink, sequence, generation_id, query_id, batch_id, row_count, batch, "
                      "committed_at) VALUES (:s, :q, :g, :qid, :b, :n, CAST(:doc AS jsonb), :at)"),
                 {"s": sink, "q": sequence, "g": generation_id, "qid": query_id, "b": batch_id, "n": row_count,
                  "doc": json.dumps(batch), "at": committed_at})
    conn.execute(text(f"UPDATE {FENCE} SET last_sequence = :q, generation_id = :g, batch_id = :b WHERE sink = :s"),
                 {"s": sink, "q": sequence, "g": generation_id, "b": batch_id})


def commits_after(conn: Connection, sink: str, sequence: int) -> list[Any]:
    """The target's commits of ``sink`` after ``sequence``, oldest first (none when the log does not exist)."""
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": COMMITS}).scalar() is None:
        return []
    return list(conn.execute(text(
        f"SELECT sequence, generation_id, query_id, batch_id, row_count, batch, committed_at FROM {COMMITS} "
        "WHERE sink = :s AND sequence > :q ORDER BY sequence"), {"s": sink, "q": sequence}))
