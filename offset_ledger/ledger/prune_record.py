"""Before prune deletes ranges, record their islands in ``pruned_ranges`` (the rule: ``rules.pruned``).

One ``INSERT ... SELECT`` with window functions computes the islands in the database (Postgres and
SQLite alike): Python would have to fetch and walk every doomed row (10 s for 500,000 rows in
``bench_prune``). The statement follows ``rules.pruned.islands`` step for step; the tests compare
the two on the same rows.

Written in one transaction before the first delete: an interrupted prune then has recorded more
than it deleted, which explains nothing wrongly (a range still in the ledger leaves no gap to
explain), where the reverse order could leave a deleted stretch nobody accounts for.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, Integer, bindparam, column, table, text
from sqlalchemy.engine import Connection

_KEEP = "prune_keep_ids"
_KEEP_ROWS = 5_000
_KEY = 'pipeline, consumer_group, query_id, topic, "partition"'
_KEY_BO = 'bo.pipeline, bo.consumer_group, bo.query_id, bo.topic, bo."partition"'

# brk = 1 where a new island starts: the first range of its key, one that does not start where the
# one before ended (a hole, an overlap, offsets going back, a second source of the same batch), or
# one whose start was not reported (NULL = anything is NULL: it starts an island of its own with an
# unknown start, ``rules.pruned``), or one another run read (a finding may flag that run). Within an island only the first start can be NULL, and ends
# never go back: MIN(until_offset) is the first batch's end.
_ISLANDS = f"""
INSERT INTO pruned_ranges ({_KEY}, from_batch_id, until_batch_id, from_offset, until_offset, batches,
                           first_batch_time, cutoff, pruned_at, first_until_offset, last_batch_time, counts_reads,
                           run_id)
SELECT {_KEY}, MIN(batch_id), MAX(batch_id),
       CASE WHEN COUNT(from_offset) < COUNT(*) THEN NULL ELSE MIN(from_offset) END, MAX(until_offset),
       COUNT(*), MIN(batch_time), :cutoff, :pruned_at, MIN(until_offset), MAX(batch_time), :counts_reads,
       MIN(run_id)
FROM (
    SELECT {_KEY}, batch_id, from_offset, until_offset, batch_time, run_id,
           SUM(brk) OVER (PARTITION BY {_KEY} ORDER BY batch_id, source_index ROWS UNBOUNDED PRECEDING) AS island
    FROM (
        SELECT {_KEY_BO}, bo.batch_id, source_index, from_offset, until_offset, bo.batch_time, bo.run_id,
               CASE WHEN LAG(until_offset) OVER w IS NULL THEN 1
                    WHEN from_offset = LAG(until_offset) OVER w AND until_offset >= LAG(until_offset) OVER w
                         AND bo.run_id = LAG(bo.run_id) OVER w THEN 0
                    ELSE 1 END AS brk
        FROM {{source}} bo
        WINDOW w AS (PARTITION BY {_KEY_BO} ORDER BY bo.batch_id, source_index)
    ) marked
) numbered
GROUP BY {_KEY}, island
"""

# The doomed ranges, one row per partition-offset with its batch's run. PostgreSQL unnests the compact
# rows itself after filtering them by batch (a row per batch, source and topic: 100x fewer than the
# view's rows, and one join of batches instead of two); SQLite reads the view.
_DOOMED_PG = f"""(
    SELECT b.pipeline, b.consumer_group, b.query_id, b.batch_id, r.source_index, r.topic, u."partition",
           u.from_offset, u.until_offset, b.batch_time, b.run_id
    FROM offset_ranges r JOIN batches b ON b.id = r.batch_pk
    CROSS JOIN LATERAL unnest(r.partitions, r.from_offsets, r.until_offsets) AS u ("partition", from_offset, until_offset)
    WHERE b.batch_time < :cutoff {{pipeline}} AND NOT EXISTS (SELECT 1 FROM {_KEEP} k WHERE k.id = b.id))"""
_DOOMED_VIEW = f"""(
    SELECT {_KEY_BO}, bo.batch_id, bo.source_index, bo.from_offset, bo.until_offset, bo.batch_time, b.run_id
    FROM v_batch_offsets bo JOIN batches b ON b.query_id = bo.query_id AND b.batch_id = bo.batch_id
    WHERE bo.batch_time < :cutoff {{pipeline}} AND NOT EXISTS (SELECT 1 FROM {_KEEP} k WHERE k.id = b.id))"""


def record_pruned(conn: Connection, cutoff: datetime, pipeline: str | None, keep_ids: set[int],
                  pruned_at: datetime) -> int:
    """Insert the islands of the ranges about to be deleted (old, their batch's ``batches.id`` not in
    ``keep_ids``); returns how many."""
    conn.execute(text(f"CREATE TEMPORARY TABLE {_KEEP} (id BIGINT PRIMARY KEY)"))
    try:
        keep = table(_KEEP, column("id", Integer))
        ids = sorted(keep_ids)
        for i in range(0, len(ids), _KEEP_ROWS):
            conn.execute(keep.insert(), [{"id": x} for x in ids[i:i + _KEEP_ROWS]])
        pg = conn.dialect.name == "postgresql"
        where = f"AND {'b' if pg else 'bo'}.pipeline = :pipeline" if pipeline is not None else ""
        source = (_DOOMED_PG if pg else _DOOMED_VIEW).format(pipeline=where)
        stmt = text(_ISLANDS.format(source=source)).bindparams(
            # Typed: on SQLite a bare datetime would be compared as ISO text ('T' between date and
            # time) with the stored 'YYYY-MM-DD HH:MM:SS' form, and every row of the day would match.
            bindparam("cutoff", cutoff, type_=DateTime(timezone=True)),
            bindparam("pruned_at", pruned_at, type_=DateTime(timezone=True)),
            bindparam("counts_reads", True, type_=Boolean()))
        params = {"pipeline": pipeline} if pipeline is not None else {}
        return conn.execute(stmt, params).rowcount or 0
    finally:
        conn.execute(text(f"DROP TABLE {_KEEP}"))
