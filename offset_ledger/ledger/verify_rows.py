"""The range rows verify sweeps, streamed from the ledger in the sweep's order (``rules.verify.sort_key``):
the server-side cursor over ``batch_offsets``, the few rows whose start was not reported and the
reads of pruned islands (``pruned_ranges``) merged in, and each row tagged with its incarnation and the finding that accounts for its extra reads (marked
not landed when a sink refused that batch's output: ``rules.verify``).
``ledger.verify_reads`` reads everything else (``read_inputs``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import literal, null, select, text
from sqlalchemy.engine import Connection

from offset_ledger.ledger.batch_ranges import expand, first_batch_starts
from offset_ledger.ledger.tables import batch_offsets, batches, offset_ranges, pruned_ranges
from offset_ledger.ledger.verify_reads import VerifyInputs
from offset_ledger.rules.pruned import island_reads
from offset_ledger.rules.verify import RangeRow, sort_key

#: Rows fetched per round trip from the server-side cursor.
YIELD_PER = 20_000


def unknown_start_rows(conn: Connection, pipeline: str, group: str, topic: str | None = None) -> list[RangeRow]:
    """Ranges recorded without a start, given the start their generation resolved where there is one; sorted.

    Only the compact rows holding a NULL start are read and expanded (PostgreSQL: ``array_position`` finds
    it without unnesting; SQLite: the JSON text holds ``null``), not every range of the pipeline.
    """
    b, r = batches, offset_ranges
    has_null = (text("array_position(offset_ranges.from_offsets, NULL) IS NOT NULL")
                if conn.dialect.name == "postgresql" else text("offset_ranges.from_offsets LIKE '%null%'"))
    stmt = (select(r.c.topic, r.c.partitions, r.c.from_offsets, r.c.until_offsets, b.c.query_id, b.c.batch_id)
            .select_from(b.join(r, r.c.batch_pk == b.c.id))
            .where(b.c.pipeline == pipeline, b.c.consumer_group == group, has_null))
    if topic is not None:
        stmt = stmt.where(r.c.topic == topic)
    rows = [RangeRow(t, p, None, u, q, bid) for t, parts, froms, untils, q, bid in conn.execute(stmt)
            for p, f, u in expand(parts, froms, untils) if f is None]
    out = resolve_starts(conn, pipeline, group, rows)
    out.sort(key=sort_key)
    return out


def resolve_starts(conn: Connection, pipeline: str, group: str, rows: Sequence[RangeRow]) -> list[RangeRow]:
    """Rows without a start, batch 0's given the start its generation resolved (when it can have begun there)."""
    if not rows:
        return []
    starts = first_batch_starts(conn, pipeline, group, {r.query_id for r in rows if r.batch_id == 0})
    out = []
    for r in rows:
        start = starts.get((r.query_id, r.topic, r.partition)) if r.batch_id == 0 else None
        if start is not None and start > r.until_offset:
            start = None  # not where this range can have begun: keep it unknown
        out.append(r._replace(from_offset=start))
    return out


def pruned_rows(conn: Connection, pipeline: str, group: str, topic: str | None = None) -> list[RangeRow]:
    """The reads of the islands prune deleted (``rules.pruned.island_reads``), swept like the rows they were; sorted.

    Few (a row per island, not per batch), so read whole. An island's unknown start is resolved as
    its row was (``resolve_starts``). 0009's islands (``counts_reads`` false) are not reads: they
    only explain gaps (``verify_reads``).
    """
    pr = pruned_ranges
    stmt = select(pr.c.topic, pr.c.partition, pr.c.query_id, pr.c.from_batch_id, pr.c.until_batch_id,
                  pr.c.from_offset, pr.c.first_until_offset, pr.c.until_offset).where(
        pr.c.pipeline == pipeline, pr.c.consumer_group == group, pr.c.counts_reads.is_(True))
    if topic is not None:
        stmt = stmt.where(pr.c.topic == topic)
    rows = [x for r in conn.execute(stmt) for x in island_reads(*r)]
    out = [r for r in rows if r.from_offset is not None]
    out.extend(resolve_starts(conn, pipeline, group, [r for r in rows if r.from_offset is None]))
    out.sort(key=sort_key)
    return out


# The sweep's order from the compact rows, one topic at a time: unnested, and only integers sorted
# (partition, from, until; the batch's numeric key carried): sorting on the topic's text and the batch's
# query id is far slower at a million ranges (docs/benchmarks.md).
_PG_STREAM = """
SELECT u."partition", u.from_offset, u.until_offset, r.batch_pk
FROM batches b
JOIN offset_ranges r ON r.batch_pk = b.id
CROSS JOIN LATERAL unnest(r.partitions, r.from_offsets, r.until_offsets) AS u ("partition", from_offset, until_offset)
WHERE b.pipeline = %(pipeline)s AND b.consumer_group = %(group)s AND r.topic = %(topic)s
  AND u.from_offset IS NOT NULL
ORDER BY u."partition", u.from_offset, u.until_offset
"""


def stream_rows(conn: Connection, pipeline: str, group: str, topic: str | None = None) -> Iterator[Any]:
    """Every range with a start, ordered (topic, partition, from, until), from a server-side cursor.

    The rows carry ``incarnation`` 0 and no ``extra_read`` so the sweep can take them as they come when
    nothing needs tagging. On PostgreSQL each topic is one sorted stream (topics in Python's order, which
    is UTF-8 byte order), and a batch's (query id, batch id) come from a map of the pipeline's batches
    read first (one entry per batch, not per range).
    """
    if conn.dialect.name != "postgresql":
        yield from _stream_view(conn, pipeline, group, topic)
        return
    b, r = batches, offset_ranges
    mine = (b.c.pipeline == pipeline, b.c.consumer_group == group)
    topics = [topic] if topic is not None else sorted(conn.execute(
        select(r.c.topic).distinct().select_from(b.join(r, r.c.batch_pk == b.c.id)).where(*mine)).scalars())
    ids: dict[int, tuple[str, int]] = {}
    queries: dict[str, str] = {}
    for pk, q, bid in conn.execute(select(b.c.id, b.c.query_id, b.c.batch_id).where(*mine)):
        ids[pk] = (queries.setdefault(q, q), bid)
    for t in topics:
        for p, f, u, pk in _sorted_ranges(conn, {"pipeline": pipeline, "group": group, "topic": t}):
            q, bid = ids[pk]
            yield (t, p, f, u, q, bid, 0, None)


def _sorted_ranges(conn: Connection, params: dict[str, Any]) -> Iterator[tuple[int, int, int, int]]:
    """``_PG_STREAM``'s rows in chunks from a server-side cursor. On psycopg2 its own named cursor, in the
    connection's transaction: SQLAlchemy's result rows cost as much again as the sort (1 s per 1,000,000)."""
    if conn.dialect.driver != "psycopg2":
        result = conn.execution_options(stream_results=True, yield_per=YIELD_PER).exec_driver_sql(_PG_STREAM, params)
        try:
            for chunk in result.partitions():
                yield from chunk  # type: ignore[misc]
        finally:
            result.close()
        return
    cursor = conn.connection.dbapi_connection.cursor(name="offset_ledger_verify_rows")  # type: ignore[union-attr]
    try:
        cursor.execute(_PG_STREAM, params)
        while chunk := cursor.fetchmany(YIELD_PER):
            yield from chunk
    finally:
        cursor.close()


def _stream_view(conn: Connection, pipeline: str, group: str, topic: str | None) -> Iterator[Any]:
    """SQLite: the per-partition view, sorted by the database (its JSON arrays unnest only in SQL)."""
    b = batch_offsets
    stmt = (select(b.c.topic, b.c.partition, b.c.from_offset, b.c.until_offset, b.c.query_id, b.c.batch_id,
                   literal(0).label("incarnation"), null().label("extra_read"))
            .where(b.c.pipeline == pipeline, b.c.consumer_group == group, b.c.from_offset.is_not(None))
            .order_by(b.c.topic, b.c.partition, b.c.from_offset, b.c.until_offset))
    if topic is not None:
        stmt = stmt.where(b.c.topic == topic)
    result = conn.execution_options(stream_results=True, yield_per=YIELD_PER).execute(stmt)
    try:
        yield from result
    finally:
        result.close()


def merged(main: Iterable[Any], side: Sequence[RangeRow]) -> Iterator[Any]:
    """The ordered stream with the (few, sorted) rows whose start was resolved apart merged in."""
    if not side:
        yield from main
        return
    i, n = 0, len(side)
    nxt = sort_key(side[0])
    for row in main:
        key = (row[0], row[1], row[2], row[3])
        while i < n and nxt <= key:
            yield side[i]
            i += 1
            if i < n:
                nxt = sort_key(side[i])
        yield row
    while i < n:
        yield side[i]
        i += 1


def tagged(rows: Iterable[Any], inputs: VerifyInputs) -> Iterator[Any]:
    """Rows with their incarnation and the finding that accounts for their extra reads (when any)."""
    if not inputs.needs_tagging:
        yield from rows
        return
    flags = inputs.run_flags
    unlanded = inputs.unlanded
    gen_of = inputs.generation_of_query
    has_bounds = bool(inputs.boundaries or inputs.topic_boundaries)
    for r in rows:
        t, p, q, bid = r[0], r[1], r[4], r[5]
        inc = 0
        if has_bounds:
            gen = gen_of.get(q)
            if gen is None:
                gen = inputs.generation_at(inputs.query_started.get(q))
            inc = inputs.incarnation(t, p, gen)
        flag = None
        if flags:
            for ft, fp, why in flags.get((q, bid), ()):
                if ft is None or (ft == t and fp == p):
                    flag = why
                    break
        if flag is not None and (q, bid) in unlanded:
            flag = replace(flag, landed=False)  # a sink refused its output: its reads cover nothing
        if inc or flag is not None:
            yield RangeRow(t, p, r[2], r[3], q, bid, inc, flag)
        else:
            yield r
