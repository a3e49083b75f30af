"""Positions with their status window, read from the rows per topic (0024) on PostgreSQL: ``/metrics``,
``/lag`` and the pipelines list (``operate.lag_insight.positions_and_window``).

Through ``v_positions`` the statement unnested every position into a row, numbered the (pipeline, group,
topic) triples by a DISTINCT over those rows, joined each row back to its triple on three text keys, sorted
all of them and sent them one by one: at 10,000 positions most of ``/metrics``' ledger read (issue 49,
docs/benchmarks.md). Here Postgres sends one row per topic: its partitions and next offsets as they are
stored, which of its movers moved inside the window, and the window's lowest start and highest end per
partition as three arrays; the positions are unrolled in Python, in the same order and the same tuples.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection

# One row per topic row. ``w``: the window's ranges per (topic row, partition) straight from
# ``offset_ranges`` (arrays unnested in the select list), the window's batches found from each topic row's
# (pipeline, consumer_group, batch_time) index range on ``batches``, as ``lag_insight._window_compact``.
# ``moved``: the movers (``stamps``' 1-based indexes) that placed positions inside the window by a batch.
_PG = """
WITH g AS MATERIALIZED (
    SELECT t.pipeline, t.consumer_group, t.topic, t.partitions, t.next_offsets, t.stamps, t.moved_at,
           t.moved_query_ids, row_number() OVER () AS n
    FROM topic_positions t {where}
), x AS (
    SELECT g.n, unnest(r.partitions) AS part, unnest(r.from_offsets) AS from_offset,
           unnest(r.until_offsets) AS until_offset
    FROM g JOIN batches b ON b.pipeline = g.pipeline AND b.consumer_group = g.consumer_group
                         AND b.batch_time >= :since
           JOIN offset_ranges r ON r.batch_pk = b.id AND r.topic = g.topic
), w AS (
    SELECT n, array_agg(part ORDER BY part) AS parts, array_agg(lo ORDER BY part) AS los,
           array_agg(hi ORDER BY part) AS his
    FROM (SELECT n, part, min(from_offset) AS lo, max(until_offset) AS hi FROM x GROUP BY n, part) y
    GROUP BY n
)
SELECT g.pipeline, g.consumer_group, g.topic, g.partitions, g.next_offsets, g.stamps,
       ARRAY(SELECT i FROM generate_subscripts(g.moved_at, 1) AS i
             WHERE g.moved_at[i] >= :since AND g.moved_query_ids[i] IS NOT NULL) AS moved,
       w.parts, w.los, w.his
FROM g LEFT JOIN w ON w.n = g.n
ORDER BY g.pipeline, g.consumer_group, g.topic
"""
_ALL = text(_PG.format(where=""))
_ONE = text(_PG.format(where="WHERE t.pipeline = :pipeline AND t.consumer_group = :consumer_group"))

Row = tuple[str, str, str, int, int, int, "int | None", "int | None"]


def positions_and_window_pg(conn: Connection, since: datetime, pipeline: str | None = None,
                            consumer_group: str | None = None) -> Iterator[Row]:
    """(pipeline, group, topic, partition, next offset, moved 0/1, window's lowest start or None, its highest
    end or None) per position, sorted by pipeline, group, topic and partition: the rows of the per-partition
    statement over ``v_positions`` (``lag_insight._positions_and_window_stmt``), PostgreSQL only."""
    params: dict[str, object] = {"since": since}
    if pipeline is not None:
        params.update(pipeline=pipeline, consumer_group=consumer_group)
    rows = conn.execute(_ONE if pipeline is not None else _ALL, params).all()
    for pipe, group, topic, parts, offsets, stamps, moved, wparts, los, his in rows:
        window = dict(zip(wparts, zip(los, his))) if wparts else {}
        moved_by = set(moved)
        if stamps is None:  # one mover placed them all (``tables.topic_positions``)
            flags = [1 if 1 in moved_by else 0] * len(parts)
        else:
            flags = [1 if s in moved_by else 0 for s in stamps]
        unrolled = zip(parts, offsets, flags)
        if any(a >= b for a, b in zip(parts, parts[1:])):  # a row some writer left unsorted
            unrolled = iter(sorted(unrolled))
        for part, offset, flag in unrolled:
            lo, hi = window.get(part, (None, None))
            yield pipe, group, topic, part, offset, flag, lo, hi
