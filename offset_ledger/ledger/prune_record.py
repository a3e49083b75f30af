"""Before prune deletes ranges, record their islands in ``pruned_ranges`` (the rule: ``rules.pruned``).

One ``INSERT ... SELECT`` with window functions computes the islands in the database: Python would
have to fetch and walk every doomed row (docs/benchmarks.md). The statement
follows ``rules.pruned.islands`` step for step; the tests compare the two on the same rows.

On PostgreSQL it works on the compact rows (one per batch, source and topic: ``offset_ranges``), so
its cost follows batches, not partition-offsets: a fleet day is 170,000 rows, not 17M to sort per
partition (``_ISLANDS_COMPACT``). SQLite keeps the per partition-offset statement over the view
(``_ISLANDS``): its ledgers are small, and it has no arrays to compare.

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

# The same islands from the compact rows, in two steps.
# 1. Per (pipeline, group, query, topic) in (batch, source) order, a compact row *continues* the one
#    before when every partition of it does by the rule: the same partition list in the same order,
#    each start the previous end (array equality: a NULL start never equals an end, which is never
#    NULL), no end before its start (``back``: one unnest per row, filtered, no sort), the same run.
#    A maximal stretch of continuing rows is a *run of rows*; within it every partition is one piece
#    of an island. Only the run's first row (its partitions, starts and ends), its last row's ends and
#    its counts are kept: one row per run, not per partition-offset.
# 2. The runs are unnested (a partition list a run: ~1 row per query, topic and partition when the
#    history is unbroken) and joined per partition exactly as ``_ISLANDS`` joins ranges: a piece
#    continues the partition's previous piece (the previous run holding it, whose last row is the
#    partition's previous range) when it starts where that one ended, does not end before it, and has
#    the same run.
# Aggregates as ``_ISLANDS`` writes them: ``from_offset`` is the least start of the island's ranges,
# which is the first range's start, or its end when that is lower and a range follows
# (``least_from``); ``first_until_offset`` the least end (the first's); times MIN/MAX over the batches.
_ISLANDS_COMPACT = f"""
INSERT INTO pruned_ranges ({_KEY}, from_batch_id, until_batch_id, from_offset, until_offset, batches,
                           first_batch_time, cutoff, pruned_at, first_until_offset, last_batch_time, counts_reads,
                           run_id)
WITH doomed AS (
    SELECT b.pipeline, b.consumer_group, b.query_id, r.topic, b.batch_id, r.source_index, b.batch_time, b.run_id,
           r.partitions, r.from_offsets, r.until_offsets, x.back
    FROM offset_ranges r JOIN batches b ON b.id = r.batch_pk
    LEFT JOIN LATERAL (SELECT true AS back FROM unnest(r.from_offsets, r.until_offsets) AS u (f, t)
                       WHERE t < f LIMIT 1) x ON true
    WHERE b.batch_time < :cutoff {{pipeline}} AND NOT EXISTS (SELECT 1 FROM {_KEEP} k WHERE k.id = b.id)
), marked AS (
    SELECT d.*,
           CASE WHEN LAG(run_id) OVER w = run_id AND LAG(partitions) OVER w = partitions
                     AND LAG(until_offsets) OVER w = from_offsets AND back IS NULL THEN 0
                ELSE 1 END AS brk
    FROM doomed d
    WINDOW w AS (PARTITION BY query_id, pipeline, consumer_group, topic ORDER BY batch_id, source_index)
), numbered AS (
    SELECT m.*, SUM(brk) OVER w AS row_run, LEAD(brk, 1, 1) OVER w AS last_of_run
    FROM marked m
    WINDOW w AS (PARTITION BY query_id, pipeline, consumer_group, topic ORDER BY batch_id, source_index
                 ROWS UNBOUNDED PRECEDING)
), row_runs AS (
    SELECT pipeline, consumer_group, query_id, topic, row_run,
           MIN(batch_id) AS first_batch, MAX(batch_id) AS last_batch, COUNT(*) AS n,
           MIN(batch_time) AS first_time, MAX(batch_time) AS last_time, MIN(run_id) AS run_id,
           MIN(partitions) FILTER (WHERE brk = 1) AS partitions,
           MIN(from_offsets) FILTER (WHERE brk = 1) AS froms,
           MIN(until_offsets) FILTER (WHERE brk = 1) AS first_untils,
           MIN(until_offsets) FILTER (WHERE last_of_run = 1) AS last_untils
    FROM numbered
    GROUP BY pipeline, consumer_group, query_id, topic, row_run
), pieces AS (
    SELECT rr.pipeline, rr.consumer_group, rr.query_id, rr.topic, u."partition", rr.row_run, rr.first_batch,
           rr.last_batch, rr.n, rr.first_time, rr.last_time, rr.run_id, u.f, u.fu, u.lu,
           CASE WHEN rr.n > 1 AND u.fu < u.f THEN u.fu ELSE u.f END AS least_from
    FROM row_runs rr
    CROSS JOIN LATERAL unnest(rr.partitions, rr.froms, rr.first_untils, rr.last_untils) AS u ("partition", f, fu, lu)
), joined AS (
    SELECT p.*,
           CASE WHEN LAG(lu) OVER w IS NULL THEN 1
                WHEN f = LAG(lu) OVER w AND fu >= LAG(lu) OVER w AND run_id = LAG(run_id) OVER w THEN 0
                ELSE 1 END AS brk
    FROM pieces p
    WINDOW w AS (PARTITION BY {_KEY} ORDER BY row_run)
), numbered_pieces AS (
    SELECT j.*, SUM(brk) OVER (PARTITION BY {_KEY} ORDER BY row_run ROWS UNBOUNDED PRECEDING) AS island
    FROM joined j
)
SELECT {_KEY}, MIN(first_batch), MAX(last_batch),
       CASE WHEN COUNT(f) < COUNT(*) THEN NULL ELSE MIN(least_from) END, MAX(lu),
       SUM(n), MIN(first_time), :cutoff, :pruned_at, MIN(fu), MAX(last_time), :counts_reads, MIN(run_id)
FROM numbered_pieces
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
                  pruned_at: datetime, *, per_partition_offset: bool = False) -> int:
    """Insert the islands of the ranges about to be deleted (old, their batch's ``batches.id`` not in
    ``keep_ids``); returns how many.

    ``per_partition_offset``: on PostgreSQL too, the statement over one row per partition-offset (what
    prune ran before the compact one): the reference the tests and ``bench_prune`` compare it with.
    """
    conn.execute(text(f"CREATE TEMPORARY TABLE {_KEEP} (id BIGINT PRIMARY KEY)"))
    try:
        keep = table(_KEEP, column("id", Integer))
        ids = sorted(keep_ids)
        for i in range(0, len(ids), _KEEP_ROWS):
            conn.execute(keep.insert(), [{"id": x} for x in ids[i:i + _KEEP_ROWS]])
        pg = conn.dialect.name == "postgresql"
        where = f"AND {'b' if pg else 'bo'}.pipeline = :pipeline" if pipeline is not None else ""
        if pg and not per_partition_offset:
            sql = _ISLANDS_COMPACT.format(pipeline=where)
        else:
            sql = _ISLANDS.format(source=(_DOOMED_PG if pg else _DOOMED_VIEW).format(pipeline=where))
        stmt = text(sql).bindparams(
            # Typed: on SQLite a bare datetime would be compared as ISO text ('T' between date and
            # time) with the stored 'YYYY-MM-DD HH:MM:SS' form, and every row of the day would match.
            bindparam("cutoff", cutoff, type_=DateTime(timezone=True)),
            bindparam("pruned_at", pruned_at, type_=DateTime(timezone=True)),
            bindparam("counts_reads", True, type_=Boolean()))
        params = {"pipeline": pipeline} if pipeline is not None else {}
        islands = conn.execute(stmt, params).rowcount or 0
    except BaseException:
        # PostgreSQL: the failed statement aborted the transaction, whose rollback removes the table;
        # a DROP now would fail too ("current transaction is aborted") and hide the real error.
        if conn.dialect.name != "postgresql":
            conn.execute(text(f"DROP TABLE {_KEEP}"))
        raise
    conn.execute(text(f"DROP TABLE {_KEEP}"))
    return islands
