"""The status window's rows: every position read in one statement with what the window's batches did there.

``operate.lag_insight.positions_and_window`` turns the rows into positions and window facts; the
statement lives here with the ledger's other SQL. On PostgreSQL the rows come from one row per topic
(``queries.positions_and_window_pg``, issue 49); the per-partition statement over ``v_positions``
(``_window_compact`` on PostgreSQL, ``_window`` through ``v_batch_offsets`` on SQLite) answers SQLite
and is the PostgreSQL reader's oracle in tests/integration/test_position_reads_pg.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Select, and_, bindparam, case, func, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.queries import positions_and_window_pg
from offset_ledger.ledger.tables import batch_offsets, batches, offset_ranges, positions


def window_rows(conn: Connection, since: datetime, pipeline: str | None = None,
                consumer_group: str | None = None) -> Iterable[Any]:
    """Every position (of every pipeline, or of one pipeline and group), sorted by pipeline, group, topic
    and partition, as ``(pipeline, group, topic, partition, next_offset, moved, lo, hi)``: ``moved`` 1
    when a batch moved it since ``since``; ``lo``/``hi`` the lowest start and highest end of the window's
    batches on its partition (None: none).

    One statement: the position is read with the batches (read apart, a batch committed in between
    would end past an older position and look like a rewind), and a list costs one round trip.
    """
    if conn.dialect.name == "postgresql":  # one row per topic, unrolled (issue 49)
        return positions_and_window_pg(conn, since, pipeline, consumer_group)
    params: dict[str, Any] = {"since": since}
    if pipeline is not None:
        params.update(pipeline=pipeline, consumer_group=consumer_group)
    return conn.execute(_positions_and_window_stmt(pipeline is not None), params).all()


def _window(g: Any, since: Any) -> Any:
    """Per partition of the (pipeline, group, topic) triples ``g``: lowest start and highest end of the
    window's batches (SQLite, through the view; PostgreSQL: ``_window_compact``).

    Driven from the triples that have positions, so each is one range scan of the (pipeline, topic,
    consumer_group, batch_time) index: filtered on batch_time alone, the planner scanned the whole
    history (docs/benchmarks.md). Partitions without a
    position are never asked about.
    """
    return (select(batch_offsets.c.pipeline, batch_offsets.c.consumer_group, batch_offsets.c.topic,
                   batch_offsets.c.partition, func.min(batch_offsets.c.from_offset).label("lo"),
                   func.max(batch_offsets.c.until_offset).label("hi"))
            .select_from(g.join(batch_offsets, and_(
                batch_offsets.c.pipeline == g.c.pipeline, batch_offsets.c.topic == g.c.topic,
                batch_offsets.c.consumer_group == g.c.consumer_group, batch_offsets.c.batch_time >= since)))
            .group_by(batch_offsets.c.pipeline, batch_offsets.c.consumer_group, batch_offsets.c.topic,
                      batch_offsets.c.partition)).subquery("w")


def _window_compact(g: Any, since: Any) -> Any:
    """PostgreSQL: ``_window`` read from ``offset_ranges`` itself, per (triple number ``g.n``, partition).

    Same answer as through ``v_batch_offsets``, in about half the time (docs/benchmarks.md): the
    arrays are unnested in the select list (a
    ProjectSet, where the view's ``LATERAL unnest`` fills a tuplestore per row) and the 30,000
    elements are grouped on two integers instead of the pipeline's, group's and topic's text. The
    window's batches are still found from each triple's (pipeline, consumer_group, batch_time) index
    range on ``batches``; their compact rows by primary key.
    """
    x = (select(g.c.n, func.unnest(offset_ranges.c.partitions).label("partition"),
                func.unnest(offset_ranges.c.from_offsets).label("from_offset"),
                func.unnest(offset_ranges.c.until_offsets).label("until_offset"))
         .select_from(g.join(batches, and_(
             batches.c.pipeline == g.c.pipeline, batches.c.consumer_group == g.c.consumer_group,
             batches.c.batch_time >= since)).join(offset_ranges, and_(
                 offset_ranges.c.batch_pk == batches.c.id, offset_ranges.c.topic == g.c.topic)))).subquery("x")
    return (select(x.c.n, x.c.partition, func.min(x.c.from_offset).label("lo"), func.max(x.c.until_offset).label("hi"))
            .group_by(x.c.n, x.c.partition)).subquery("w")


@cache
def _positions_and_window_stmt(one_pipeline: bool, compact: bool = False) -> Select[Any]:
    since = bindparam("since")
    triples = select(positions.c.pipeline, positions.c.consumer_group, positions.c.topic).distinct()
    stmt = select(positions.c.pipeline, positions.c.consumer_group, positions.c.topic, positions.c.partition,
                  positions.c.next_offset)
    if one_pipeline:
        mine = (positions.c.pipeline == bindparam("pipeline"), positions.c.consumer_group == bindparam("consumer_group"))
        triples = triples.where(*mine)
        stmt = stmt.where(*mine)
    moved = case((and_(positions.c.updated_at >= since, positions.c.query_id.is_not(None)), 1), else_=0)
    stmt = stmt.add_columns(moved.label("moved"))
    order = (positions.c.pipeline, positions.c.consumer_group, positions.c.topic, positions.c.partition)
    if compact:
        # Each position finds its triple's number (the positions' primary key starts with the triple).
        t = triples.subquery("d")
        g = select(t.c.pipeline, t.c.consumer_group, t.c.topic, func.row_number().over().label("n")).cte("g")
        w = _window_compact(g, since)
        return (stmt.add_columns(w.c.lo, w.c.hi)
                .select_from(positions.join(g, and_(
                    g.c.pipeline == positions.c.pipeline, g.c.consumer_group == positions.c.consumer_group,
                    g.c.topic == positions.c.topic)).outerjoin(w, and_(
                        w.c.n == g.c.n, w.c.partition == positions.c.partition)))
                .order_by(*order))
    w = _window(triples.subquery("g"), since)
    return (stmt.add_columns(w.c.lo, w.c.hi)
            .select_from(positions.outerjoin(w, and_(
                w.c.pipeline == positions.c.pipeline, w.c.consumer_group == positions.c.consumer_group,
                w.c.topic == positions.c.topic, w.c.partition == positions.c.partition)))
            .order_by(*order))
