"""Read-side queries for replays: which query a batch id belongs to, and the ranges batches read.

The ranges are read from ``offset_ranges`` itself (a row per batch, source and topic) and expanded to a
range per partition here (``expand``): through the per-partition view ``v_batch_offsets`` the database
unnested every row and joined ``batches`` back by (query id, batch id) to filter and order them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import batches, checkpoint_generations, offset_ranges, runs


def expand(partitions: Sequence[int], from_offsets: Sequence[int | None],
           until_offsets: Sequence[int]) -> list[tuple[int, int | None, int]]:
    """A compact row's ranges, (partition, from_offset, until_offset) in partition order (a start may be None).

    Partitions are unique within a row, so the sort never compares the (possibly None) starts.
    """
    return sorted(zip(partitions, from_offsets, until_offsets))


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
    b, r = batches, offset_ranges
    stmt = (select(b.c.query_id, b.c.batch_id, r.c.source_index, r.c.topic, r.c.partitions, r.c.from_offsets,
                   r.c.until_offsets, b.c.batch_time)
            .select_from(b.join(r, r.c.batch_pk == b.c.id))
            .where(b.c.pipeline == pipeline, b.c.consumer_group == consumer_group))
    if query_id is not None:
        stmt = stmt.where(b.c.query_id == query_id)
    if batch_id is not None:
        stmt = stmt.where(b.c.batch_id == batch_id)
    if since is not None:
        stmt = stmt.where(b.c.batch_time >= since)
    if until is not None:
        stmt = stmt.where(b.c.batch_time < until)
    out: list[dict[str, Any]] = []
    for q, bid, source, topic, parts, froms, untils, at in conn.execute(
            stmt.order_by(b.c.batch_time, b.c.batch_id, r.c.source_index, r.c.topic)):
        out.extend({"query_id": q, "batch_id": bid, "source_index": source, "topic": topic, "partition": p,
                    "from_offset": f, "until_offset": u, "batch_time": at} for p, f, u in expand(parts, froms, untils))
    return out


_CHUNK = 500  # (query, batch) pairs per IN list: 1,000 parameters, under SQLite's limit


def previous_ends(conn: Connection, batches_of: Collection[tuple[str, int]]) -> dict[tuple[str, int, int, str, int], int]:
    """``until_offset`` of every range of the given (query id, batch id) batches.

    Keyed (query id, batch id, source index, topic, partition). Query ids are Spark's UUIDs and the
    ranges are unique on that key, so no pipeline filter is needed.
    """
    out: dict[tuple[str, int, int, str, int], int] = {}
    pairs = sorted(batches_of)
    b, r = batches, offset_ranges
    for i in range(0, len(pairs), _CHUNK):
        rows = conn.execute(select(b.c.query_id, b.c.batch_id, r.c.source_index, r.c.topic, r.c.partitions,
                                   r.c.until_offsets)
                            .select_from(b.join(r, r.c.batch_pk == b.c.id))
                            .where(tuple_(b.c.query_id, b.c.batch_id).in_(pairs[i:i + _CHUNK])))
        for q, bid, source, topic, parts, untils in rows:
            for p, u in zip(parts, untils):
                out[(q, bid, source, topic, p)] = u
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
