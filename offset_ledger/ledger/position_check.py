"""Did a pipeline's positions move since they were read? Answered by Postgres, not by reading them again.

A restart reads the positions, asks the cluster, resolves, then takes the pipeline lock and must be
sure nothing moved meanwhile (a batch or a reset committed). Sending what was read as three array
literals and counting the differences in one statement costs a fraction of reading them all again
and comparing in Python inside the lock (docs/benchmarks.md).
SQLite (tests, single process) reads and compares in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Connection

from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.records import pg_int_array, pg_text_array
from offset_ledger.rules.model import Position

# Differences counted as a symmetric difference of (topic, partition, next offset) rows: a row
# that moved counts twice (its old and its new value), one that appeared or vanished once.
_PG_MOVED = text("""
    WITH seen AS (
        SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:offsets AS bigint[]))
               AS u (topic, part, next_offset)
    ), now AS (
        -- the rows per topic (0024) unnested here: only the two arrays compared, not v_positions' columns
        SELECT t.topic, u.part, u.next_offset
        FROM topic_positions t CROSS JOIN LATERAL unnest(t.partitions, t.next_offsets) AS u (part, next_offset)
        WHERE t.pipeline = :pipeline AND t.consumer_group = :consumer_group AND t.topic = ANY(CAST(:wanted AS text[]))
    )
    SELECT COALESCE(SUM(CASE WHEN now.topic IS NULL OR seen.topic IS NULL THEN 1 ELSE 2 END), 0)
    FROM now FULL JOIN seen ON now.topic = seen.topic AND now.part = seen.part
    WHERE now.next_offset IS DISTINCT FROM seen.next_offset
""")


def positions_moved(conn: Connection, pipeline: str, consumer_group: str, topics: Sequence[str],
                    seen: Iterable[Position]) -> int:
    """How many (topic, partition, next offset) rows of ``topics`` differ from ``seen`` (0: none moved)."""
    wanted = set(topics)
    mine = [p for p in seen if p.topic in wanted]
    if conn.dialect.name != "postgresql":
        theirs = current_positions(conn, pipeline, consumer_group, list(topics))
        return len(set(theirs) ^ set(mine))
    return int(conn.execute(_PG_MOVED, {
        "pipeline": pipeline, "consumer_group": consumer_group, "wanted": pg_text_array(sorted(wanted)),
        "topics": pg_text_array([p.topic for p in mine]), "partitions": pg_int_array([p.partition for p in mine]),
        "offsets": pg_int_array([p.next_offset for p in mine])}).scalar_one())
