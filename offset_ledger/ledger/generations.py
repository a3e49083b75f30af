"""Checkpoint generations and the pending resets they consume.

A generation is a checkpoint location ``<checkpoint_root>/gen-<n>-<short uuid>`` handed out by the
restart helper. Locations are built by joining strings and recorded here; nothing is ever listed or
deleted, so any location Spark accepts works (``s3a://``, ``hdfs://``, ``abfss://``, local paths).
The unique suffix keeps a generation empty even if an older run left files at a similar path.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from offset_ledger.errors import LedgerError
from offset_ledger.ledger.tables import checkpoint_generations, resets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointGeneration:
    """One checkpoint generation of a pipeline, as recorded in the ledger."""

    id: int
    pipeline: str
    consumer_group: str
    generation: int
    checkpoint_root: str
    location: str
    app_version: str | None
    reason: str
    created_at: datetime
    starting_offsets: Mapping[str, Mapping[str, int]] | None


def generation_location(checkpoint_root: str, generation: int, suffix: str) -> str:
    """``<root>/gen-<n>-<suffix>`` by string joining (a URI's scheme and authority are kept as is)."""
    root = checkpoint_root.rstrip("/") or "/"
    sep = "" if root.endswith("/") else "/"
    return f"{root}{sep}gen-{generation}-{suffix}"


def _row(r: Any) -> CheckpointGeneration:
    created_at = r.created_at
    if created_at.tzinfo is None:  # SQLite drops the zone; everything is written in UTC
        created_at = created_at.replace(tzinfo=timezone.utc)
    return CheckpointGeneration(
        id=r.id, pipeline=r.pipeline, consumer_group=r.consumer_group, generation=r.generation,
        checkpoint_root=r.checkpoint_root, location=r.location, app_version=r.app_version,
        reason=r.reason, created_at=created_at, starting_offsets=r.starting_offsets)


def current_generation(conn: Connection, pipeline: str, consumer_group: str) -> CheckpointGeneration | None:
    """The newest generation of the pipeline, or None before its first restart through the helper."""
    row = conn.execute(
        select(checkpoint_generations)
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group == consumer_group)
        .order_by(checkpoint_generations.c.generation.desc())
        .limit(1)
    ).first()
    return None if row is None else _row(row)


def generations(conn: Connection, pipeline: str, consumer_group: str) -> list[CheckpointGeneration]:
    """Every generation of the pipeline, oldest first."""
    rows = conn.execute(
        select(checkpoint_generations)
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group == consumer_group)
        .order_by(checkpoint_generations.c.generation)
    )
    return [_row(r) for r in rows]


def pending_reset_ids(conn: Connection, pipeline: str, consumer_group: str) -> list[int]:
    """Executed resets the restart helper has not yet applied through a fresh checkpoint."""
    rows = conn.execute(
        select(resets.c.id)
        .where(resets.c.pipeline == pipeline, resets.c.consumer_group == consumer_group,
               resets.c.status == "pending")
        .order_by(resets.c.id)
    )
    return [r.id for r in rows]


def _lock(conn: Connection, pipeline: str, consumer_group: str) -> None:
    # Two restarts of one pipeline at once must not both take generation n+1.
    if conn.dialect.name == "postgresql":
        key = zlib.crc32(f"offset-ledger-generation:{pipeline}\0{consumer_group}".encode())
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})


def create_generation(
    conn: Connection,
    *,
    pipeline: str,
    consumer_group: str,
    checkpoint_root: str,
    app_version: str | None,
    reason: str,
    starting_offsets: Mapping[str, Mapping[str, int]],
    consume_reset_ids: Sequence[int] = (),
    now: datetime | None = None,
) -> tuple[CheckpointGeneration, list[int]]:
    """Record generation n+1 and mark ``consume_reset_ids`` consumed by it; call inside one transaction.

    Returns the generation and the reset ids actually consumed (a reset another restart consumed
    meanwhile is left alone). Only resets the caller read *before* reading positions may be passed:
    their moves are then guaranteed to be in the plan being recorded.
    """
    at = now or datetime.now(timezone.utc)
    _lock(conn, pipeline, consumer_group)
    latest = conn.execute(
        select(func.max(checkpoint_generations.c.generation))
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group == consumer_group)
    ).scalar()
    number = (latest or 0) + 1
    location = generation_location(checkpoint_root, number, uuid.uuid4().hex[:8])
    offsets = {t: dict(parts) for t, parts in starting_offsets.items()}
    try:
        gen_id = conn.execute(insert(checkpoint_generations).values(
            pipeline=pipeline, consumer_group=consumer_group, generation=number,
            checkpoint_root=checkpoint_root, location=location, app_version=app_version,
            reason=reason, created_at=at, starting_offsets=offsets,
        ).returning(checkpoint_generations.c.id)).scalar_one()
    except IntegrityError as exc:  # SQLite has no advisory lock: a concurrent restart won
        raise LedgerError(f"another restart of {pipeline!r} created generation {number} concurrently; retry",
                          pipeline=pipeline) from exc
    consumed: list[int] = []
    if consume_reset_ids:
        done = conn.execute(
            update(resets)
            .where(resets.c.id.in_(list(consume_reset_ids)), resets.c.status == "pending")
            .values(status="consumed", consumed_at=at, consumed_by_generation=gen_id)
            .returning(resets.c.id)
        )
        consumed = sorted(r.id for r in done)
    log.info("checkpoint generation %s of %s/%s at %s (reason %s, resets consumed %s)",
             number, pipeline, consumer_group, location, reason, consumed)
    return CheckpointGeneration(gen_id, pipeline, consumer_group, number, checkpoint_root, location,
                                app_version, reason, at, offsets), consumed
