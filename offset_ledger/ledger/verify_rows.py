"""The range rows verify sweeps, streamed from the ledger in the sweep's order (``rules.verify.sort_key``):
the server-side cursor over ``batch_offsets``, the few rows whose start was not reported and the
reads of pruned islands (``pruned_ranges``) merged in, and each row tagged with its incarnation and the finding that accounts for its extra reads (marked
not landed when a sink refused that batch's output: ``rules.verify``).
``ledger.verify_reads`` reads everything else (``read_inputs``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import literal, null, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.batch_ranges import first_batch_starts
from offset_ledger.ledger.tables import batch_offsets, pruned_ranges
from offset_ledger.ledger.verify_reads import VerifyInputs
from offset_ledger.rules.pruned import island_reads
from offset_ledger.rules.verify import RangeRow, sort_key

#: Rows fetched per round trip from the server-side cursor.
YIELD_PER = 20_000


def _topic_order(conn: Connection) -> Any:
    # Byte order, as Python compares str, whatever the database's collation.
    return batch_offsets.c.topic.collate("C") if conn.dialect.name == "postgresql" else batch_offsets.c.topic


def unknown_start_rows(conn: Connection, pipeline: str, group: str, topic: str | None = None) -> list[RangeRow]:
    """Ranges recorded without a start, given the start their generation resolved where there is one; sorted."""
    b = batch_offsets
    stmt = select(b.c.topic, b.c.partition, b.c.until_offset, b.c.query_id, b.c.batch_id).where(
        b.c.pipeline == pipeline, b.c.consumer_group == group, b.c.from_offset.is_(None))
    if topic is not None:
        stmt = stmt.where(b.c.topic == topic)
    rows = [RangeRow(r.topic, r.partition, None, r.until_offset, r.query_id, r.batch_id) for r in conn.execute(stmt)]
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


def stream_rows(conn: Connection, pipeline: str, group: str, topic: str | None = None) -> Iterator[Any]:
    """Every range with a start, ordered (topic, partition, from, until), from a server-side cursor.

    The rows carry ``incarnation`` 0 and no ``extra_read`` (literal columns) so the sweep can take
    them as they come when nothing needs tagging.
    """
    b = batch_offsets
    stmt = (select(b.c.topic, b.c.partition, b.c.from_offset, b.c.until_offset, b.c.query_id, b.c.batch_id,
                   literal(0).label("incarnation"), null().label("extra_read"))
            .where(b.c.pipeline == pipeline, b.c.consumer_group == group, b.c.from_offset.is_not(None))
            .order_by(_topic_order(conn), b.c.partition, b.c.from_offset, b.c.until_offset))
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
