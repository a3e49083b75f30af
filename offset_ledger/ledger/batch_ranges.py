"""Read-side queries for replays: which query a batch id belongs to, and the ranges batches read."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import batch_offsets, batches, checkpoint_generations, runs


def generation_row(conn: Connection, pipeline: str, consumer_group: str, generation: int | None) -> Any:
    """Generation number ``generation`` of the pipeline, or its newest when None; None when there is none."""
    stmt = select(checkpoint_generations.c.id, checkpoint_generations.c.generation,
                  checkpoint_generations.c.query_id, checkpoint_generations.c.location).where(
        checkpoint_generations.c.pipeline == pipeline, checkpoint_generations.c.consumer_group == consumer_group)
    if generation is not None:
        stmt = stmt.where(checkpoint_generations.c.generation == generation)
    return conn.execute(stmt.order_by(checkpoint_generations.c.generation.desc()).limit(1)).first()


def query_of_generation(conn: Connection, generation_id: int, claimed: str | None) -> str | None:
    """The query that ran on a generation: the one that claimed it, else the latest run matched to it."""
    if claimed:
        return claimed
    return conn.execute(select(runs.c.query_id).where(runs.c.generation_id == generation_id)
                        .order_by(runs.c.started_at.desc()).limit(1)).scalar()


def latest_query(conn: Connection, pipeline: str, consumer_group: str) -> str | None:
    """The query of the pipeline's most recent batch."""
    return conn.execute(select(batches.c.query_id).where(
        batches.c.pipeline == pipeline, batches.c.consumer_group == consumer_group)
        .order_by(batches.c.batch_time.desc(), batches.c.id.desc()).limit(1)).scalar()


def batch_ranges(
    conn: Connection, pipeline: str, consumer_group: str, *, query_id: str | None = None,
    batch_id: int | None = None, since: datetime | None = None, until: datetime | None = None,
) -> list[dict[str, Any]]:
    """Every partition range of the matching batches (``since`` inclusive, ``until`` exclusive)."""
    stmt = select(batch_offsets.c.query_id, batch_offsets.c.batch_id, batch_offsets.c.source_index,
                  batch_offsets.c.topic, batch_offsets.c.partition, batch_offsets.c.from_offset,
                  batch_offsets.c.until_offset, batch_offsets.c.batch_time).where(
        batch_offsets.c.pipeline == pipeline, batch_offsets.c.consumer_group == consumer_group)
    if query_id is not None:
        stmt = stmt.where(batch_offsets.c.query_id == query_id)
    if batch_id is not None:
        stmt = stmt.where(batch_offsets.c.batch_id == batch_id)
    if since is not None:
        stmt = stmt.where(batch_offsets.c.batch_time >= since)
    if until is not None:
        stmt = stmt.where(batch_offsets.c.batch_time < until)
    rows = conn.execute(stmt.order_by(batch_offsets.c.batch_time, batch_offsets.c.batch_id,
                                      batch_offsets.c.source_index, batch_offsets.c.topic,
                                      batch_offsets.c.partition))
    return [dict(r._mapping) for r in rows]
