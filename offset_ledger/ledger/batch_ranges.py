"""Read-side queries for replays: which query a batch id belongs to, and the ranges batches read."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_
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


_CHUNK = 500  # (query, batch) pairs per IN list: 1,000 parameters, under SQLite's limit


def previous_ends(conn: Connection, batches_of: Collection[tuple[str, int]]) -> dict[tuple[str, int, int, str, int], int]:
    """``until_offset`` of every range of the given (query id, batch id) batches.

    Keyed (query id, batch id, source index, topic, partition). Query ids are Spark's UUIDs and the
    ranges are unique on that key, so no pipeline filter is needed.
    """
    out: dict[tuple[str, int, int, str, int], int] = {}
    pairs = sorted(batches_of)
    for i in range(0, len(pairs), _CHUNK):
        rows = conn.execute(select(batch_offsets.c.query_id, batch_offsets.c.batch_id, batch_offsets.c.source_index,
                                   batch_offsets.c.topic, batch_offsets.c.partition, batch_offsets.c.until_offset)
                            .where(tuple_(batch_offsets.c.query_id, batch_offsets.c.batch_id).in_(pairs[i:i + _CHUNK])))
        for r in rows:
            out[(r.query_id, r.batch_id, r.source_index, r.topic, r.partition)] = r.until_offset
    return out


def first_batch_starts(conn: Connection, pipeline: str, consumer_group: str,
                       query_ids: Collection[str]) -> dict[tuple[str, str, int], int]:
    """Where batch 0 of each query started: the offsets its checkpoint generation resolved.

    Keyed (query id, topic, partition). A query's generation is the one it claimed or the one its
    runs were matched to. Adopted generations are left out: their query's batch 0 ran before the
    import, which resolved the offsets of a later batch. A query matched to several generations
    (it cannot be, short of hand edits) gets none rather than a guess.
    """
    if not query_ids:
        return {}
    g = checkpoint_generations
    ids = sorted(query_ids)
    by_query: dict[str, set[int]] = {}
    for r in conn.execute(select(g.c.query_id, g.c.id).where(
            g.c.pipeline == pipeline, g.c.consumer_group == consumer_group, g.c.query_id.in_(ids))):
        by_query.setdefault(r.query_id, set()).add(r.id)
    for r in conn.execute(select(runs.c.query_id, runs.c.generation_id).distinct().where(
            runs.c.query_id.in_(ids), runs.c.generation_id.is_not(None))):
        by_query.setdefault(r.query_id, set()).add(r.generation_id)
    chosen = {query: next(iter(gens)) for query, gens in by_query.items() if len(gens) == 1}
    if not chosen:
        return {}
    resolved = {r.id: r.resolved_offsets for r in conn.execute(select(g.c.id, g.c.resolved_offsets).where(
        g.c.id.in_(sorted(set(chosen.values()))), g.c.pipeline == pipeline, g.c.consumer_group == consumer_group,
        g.c.reason != "adopted"))}
    out: dict[tuple[str, str, int], int] = {}
    for query, gen_id in chosen.items():
        for topic, parts in (resolved.get(gen_id) or {}).items():
            for partition, offset in parts.items():
                out[(query, topic, int(partition))] = int(offset)
    return out
