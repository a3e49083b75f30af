"""The pipeline lock: what serialises resets, new generations and the recorder's position moves.

On PostgreSQL a transaction-scoped advisory lock per (pipeline, consumer group): resets, restarts
and a sink's commit take it exclusively; so does the recorder, on both paths, for a transaction that
records batches (the one-statement path: a plain UPDATE of the positions, in no fixed row order,
``fast_batch``; the general path: its gap check reads the batch before each one it writes, and a
batch another writer of the query has inserted but not yet committed would be invisible to it, a
false gap: ``position_rules.find_gaps``); its position moves then take it shared again (held already).
Always before any row lock, in one order (sorted keys).
SQLite has one writer at a time: a no-op write opens the write transaction at once (like
``BEGIN IMMEDIATE``), so whatever the caller reads afterwards cannot change before it commits.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from sqlalchemy import text
from sqlalchemy.engine import Connection


def pipeline_lock_key(pipeline: str, consumer_group: str) -> int:
    """The advisory lock key of one pipeline and consumer group (a signed 32-bit value fits bigint)."""
    return zlib.crc32(f"offset-ledger-pipeline:{pipeline}\0{consumer_group}".encode())


def lock_pipeline(conn: Connection, pipeline: str, consumer_group: str) -> None:
    """Hold the pipeline exclusively until the transaction ends."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": pipeline_lock_key(pipeline, consumer_group)})
    elif conn.dialect.name == "sqlite":
        # Any write takes SQLite's RESERVED lock for the rest of the transaction, even one that
        # changes no row; pysqlite begins the transaction right before it.
        conn.execute(text("UPDATE checkpoint_generations SET id = id WHERE 1 = 0"))


def lock_pipelines(conn: Connection, keys: Iterable[tuple[str, str]]) -> None:
    """Hold each (pipeline, consumer group) exclusively until the transaction ends, in one order."""
    if conn.dialect.name != "postgresql":
        return  # SQLite: the recorder's first INSERT takes the one write lock, before its gap check reads
    for k in sorted({pipeline_lock_key(p, g) for p, g in keys}):
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": k})


def share_pipelines(conn: Connection, keys: Iterable[tuple[str, str]]) -> None:
    """Hold each (pipeline, consumer group) shared until the transaction ends, in one order."""
    if conn.dialect.name != "postgresql":
        return
    for k in sorted({pipeline_lock_key(p, g) for p, g in keys}):
        conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": k})
