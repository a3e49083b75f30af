"""The pipeline lock: what serialises resets, new generations and the recorder's position moves.

On PostgreSQL a transaction-scoped advisory lock per (pipeline, consumer group): resets and
restarts take it exclusively, the recorder's general path shared (recorders of one pipeline do not
wait for each other there, only for a reset or a restart in progress), its one-statement path
exclusively (a plain UPDATE of the positions, in no fixed row order: ``fast_batch``), always before
any row lock, in one order.
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


def share_pipelines(conn: Connection, keys: Iterable[tuple[str, str]]) -> None:
    """Hold each (pipeline, consumer group) shared until the transaction ends, in one order."""
    if conn.dialect.name != "postgresql":
        return
    for k in sorted({pipeline_lock_key(p, g) for p, g in keys}):
        conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": k})
