"""Plain batches on PostgreSQL in one round trip: the prepared statement and the path that uses it.

One job, the ``Recorder``'s collaborator (``offset_ledger.ledger.recorder``): the steady state of a
listener, written without the general path's SELECTs: one batch when the listener keeps up, the
batches that queued (all in one statement) when it fell behind.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from sqlalchemy.engine import Connection

from offset_ledger.ledger.locks import pipeline_lock_key
from offset_ledger.ledger.records import (
    BatchRecord,
    Known,
    MovedPosition,
    Record,
    RecordOutcome,
    Transaction,
    batch_ends,
    gaps,
    offset_rows,
    pg_int_array,
    pg_text_array,
    pg_time_array,
    position_ends,
    stateful_values,
    utc,
)
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from offset_ledger.rules.read_shortfall import read_shortfalls

log = logging.getLogger("offset_ledger.ledger.recorder")


_FAST_BATCH_ABORT = "offset-ledger: not a plain batch"

# Both statements below, in the same parameters ($1 pipeline, $2 consumer group, $3 query id, $4 run
# id): the position UPDATE's rule, the forward-only and pending-reset rule of _move_positions in its
# plainest case: the run is on the current generation (or the pipeline has none), no reset is
# pending and the topic's positions were last moved by this query or placed by a restart or reset.
# Since 0024 a topic's positions are one row (``tables.topic_positions``): the batch's partitions of
# the topic must be exactly the row's, placed by one mover (``stamps`` NULL), so the rule reads that
# mover, and the row's next version has the batch as its one mover again.
_MOVE_RULE = """\
    WHERE p.pipeline = $1 AND p.consumer_group = $2 AND p.topic = {topic}
      AND p.partitions = {partitions} AND p.stamps IS NULL
      -- Authority: the run is on the current generation, or there is none.
      AND (SELECT max(g.id) FROM checkpoint_generations g WHERE g.pipeline = $1 AND g.consumer_group = $2)
          IS NOT DISTINCT FROM (SELECT r.generation_id FROM runs r WHERE r.run_id = $4)
      AND (p.moved_query_ids[1] IS NULL OR p.moved_query_ids[1] = $3)
      AND (p.moved_reset_ids[1] IS NULL
           OR NOT EXISTS (SELECT FROM resets r WHERE r.id = p.moved_reset_ids[1] AND r.status = 'pending'))
"""
_GROUPED_RULE = _MOVE_RULE.format(topic="e.topic", partitions="e.partitions")

# The batch's ends per topic, partitions ascending (Python sends them sorted): ``e`` of the UPDATEs.
_ENDS = """(SELECT topic, array_agg(partition ORDER BY partition) AS partitions,
                 array_agg(first_end ORDER BY partition) AS first_ends,
                 array_agg(until_offset ORDER BY partition) AS until_offsets, max(batch_id) AS batch_id
          FROM unnest({args}) AS e (topic, partition, first_end, until_offset, batch_id)
          GROUP BY topic) AS e"""

# The row's next version: the batch's ends, the batch its one mover (time, batch, no reset; the
# generation and query id unchanged, so they stay in the record's unchanged suffix).
_MOVE_SET = """\
    UPDATE topic_positions AS p SET next_offsets = {ends}, moved_at = ARRAY[{at}],
                                    moved_batch_ids = ARRAY[{batch}], moved_reset_ids = '{{NULL}}',
                                    moved_query_ids = ARRAY[CAST($3 AS text)]
"""

# Plain batches on PostgreSQL in one round trip: "BEGIN; <pipeline lock>; EXECUTE <statement>;
# COMMIT" sent as one string. The statement writes the batches of one run, their offsets, the
# positions (once, where the last of them ends) and the run; it is prepared once per connection (no
# parse, plan or SQLAlchemy compile per call). Everything arrives as array literals, one parameter a
# column, which Postgres parses far faster than a VALUES row per partition.
# Positions move by a plain UPDATE of the rows that exist (a missing one aborts: the general path
# inserts it), not an INSERT ... ON CONFLICT DO UPDATE: that one WAL-logs a row lock before each
# update (a Heap/LOCK record: a quarter of a position's WAL per batch, docs/benchmarks.md).
# An UPDATE locks its rows in the order its plan meets them, not the sorted order
# every other writer of positions keeps, so this path holds the pipeline lock EXCLUSIVELY: every
# writer of positions takes that lock before any row lock (ledger.locks), so while this statement
# runs no other transaction holds or can take a row lock on the pipeline's positions, and it never
# waits for one (no deadlock, whatever the order). Recorders of one pipeline wait for each other
# here; they did before too, on the same position rows. The general path takes the lock (exclusive too)
# before it writes any row of its batches, so none of them can hold a row this statement needs
# while waiting for the lock. The statement's snapshot is taken after the lock is granted: it reads
# the positions at their latest committed version.
# With several batches the rule must hold for each of them, not only the last: a position ahead of
# where the first of them ends there is a regression the general path reports, even if the last
# batch ends past it; Python made sure the ends only grow from batch to batch, so the first is the
# lowest and the UPDATE requires the position at or behind it. Anything a rule or idempotency would
# have to explain (a batch another writer already recorded, a position not moved: regression,
# pending_reset, foreign_run, shared_position, a partition without a position yet, a position a later
# batch of the query moved already: these batches are late, issue 47) makes the final
# SELECT fail on purpose, so the statement and its transaction leave nothing behind and the general
# path records the batches with their findings. Statement-level atomicity does the rest.
_BATCHES = "offset_ledger_record_batches_v4"
_BATCHES_SQL = f"""
PREPARE {_BATCHES} (text, text, text, text, timestamptz,
                    bigint[], timestamptz[], bigint[], timestamptz[], timestamptz[], timestamptz[],
                    bigint[], bigint[], bigint[],
                    int[], int[], text[], int[], bigint[], bigint[],
                    text[], int[], bigint[], bigint[], bigint[], bigint) AS
WITH new_batches AS (
    INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,
                         input_rows, watermark, event_time_min, event_time_max, state_rows_total,
                         state_rows_updated, state_rows_dropped_by_watermark)
    SELECT $1, $2, $3, $4, b.batch_id, b.batch_time, $5, b.input_rows, b.watermark, b.event_time_min,
           b.event_time_max, b.state_rows_total, b.state_rows_updated, b.state_rows_dropped
    FROM unnest($6, $7, $8, $9, $10, $11, $12, $13, $14)
         AS b (batch_id, batch_time, input_rows, watermark, event_time_min, event_time_max,
               state_rows_total, state_rows_updated, state_rows_dropped)
    ON CONFLICT (query_id, batch_id) DO NOTHING
    RETURNING id, batch_id
), new_offsets AS (
    -- one compact row per (batch, source, topic): its partitions' ranges as arrays, in the order sent
    INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
    SELECT nb.id, o.source_index, o.topic, array_agg(o.partition ORDER BY o.n),
           array_agg(o.from_offset ORDER BY o.n), array_agg(o.until_offset ORDER BY o.n)
    FROM unnest($15, $16, $17, $18, $19, $20) WITH ORDINALITY
         AS o (batch, source_index, topic, partition, from_offset, until_offset, n)
    JOIN new_batches nb ON nb.batch_id = $6[o.batch]
    GROUP BY nb.id, o.source_index, o.topic
    -- no ON CONFLICT: the batch's key is the one just made (a speculative insert logs a confirm record)
), moved AS (
{_MOVE_SET.format(ends="e.until_offsets", at="$5", batch="e.batch_id")}    FROM {_ENDS.format(args="$21, $22, $23, $24, $25")}
{_GROUPED_RULE}      -- forward only from the first batch's end (the lowest)
      AND NOT EXISTS (SELECT FROM unnest(p.next_offsets, e.first_ends) AS x (cur, first_end) WHERE cur > first_end)
      -- a later batch of the query moved it already: these are late (the general path's business)
      AND (p.moved_batch_ids[1] IS NULL OR p.moved_query_ids[1] IS NULL OR p.moved_batch_ids[1] < $6[1])
    RETURNING 1
), run AS (
    UPDATE runs SET last_batch_id = $6[cardinality($6)], last_heartbeat_at = (SELECT max(t) FROM unnest($7) t),
                    max_batch_ms = greatest(max_batch_ms, $26)  -- $26: the longest batch's duration or NULL
    WHERE run_id = $4
)
-- A data-dependent cast error (a constant one would fail at plan time): the abort described above.
SELECT (CASE WHEN (SELECT count(*) FROM new_batches) = cardinality($6)
              AND (SELECT count(*) FROM moved) = (SELECT count(DISTINCT t) FROM unnest($21) t)
             THEN '1' ELSE '{_FAST_BATCH_ABORT}' END)::int
"""
# The pipeline lock comes first, as on the general path (ledger.locks); exclusive (see above).
# The plan is the prepared generic one from the first call: Postgres' default plans the first five
# executions on a connection afresh for their parameters (custom plans), which here cost twice the
# write itself and take a lock on every index the planner looks at, before it settles on the generic
# plan anyway; a fleet's listener pays those five on every new pooled connection. SET LOCAL keeps the
# setting to this transaction (the connection's other transactions keep the server's default).
_GENERIC = "SET LOCAL plan_cache_mode = force_generic_plan; "
_BATCHES_CALL = (f"BEGIN; {_GENERIC}SELECT pg_advisory_xact_lock(%s); "
                 f"EXECUTE {_BATCHES} ({', '.join(['%s'] * 26)}); COMMIT")


# What the two one-batch statements share, in the same parameters ($1-$8: pipeline, group, query id,
# run id, batch id, batch time, recorded at, input rows): the batch's row, its forward-only and not-late
# rule for ``ends`` (the new next offsets, partitions ascending) and the run it moves.
_NEW_BATCH = """\
    INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,
                         input_rows, watermark, event_time_min, event_time_max, state_rows_total,
                         state_rows_updated, state_rows_dropped_by_watermark)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, {stateful})
    ON CONFLICT (query_id, batch_id) DO NOTHING
    RETURNING id
"""
_ONE_BATCH_RULE = """\
      -- forward only
      AND NOT EXISTS (SELECT FROM unnest(p.next_offsets, {ends}) AS x (cur, until_offset) WHERE cur > until_offset)
      -- not late (see above)
      AND (p.moved_batch_ids[1] IS NULL OR p.moved_query_ids[1] IS NULL OR p.moved_batch_ids[1] < $5)
"""
_ONE_BATCH_RUN = """\
    UPDATE runs SET last_batch_id = $5, last_heartbeat_at = $6,
                    max_batch_ms = greatest(max_batch_ms, {duration})  -- the batch's duration or NULL
    WHERE run_id = $4
"""

# A listener that keeps up sends one batch a call: the same statement for one batch, with its
# per-batch values as scalars and nothing to check between batches: cheaper per call than ``_BATCHES``
# given a single batch (docs/benchmarks.md), so that case keeps its own.
_ONE_BATCH = "offset_ledger_record_batch_v4"
_ONE_BATCH_SQL = f"""
PREPARE {_ONE_BATCH} (text, text, text, text, bigint, timestamptz, timestamptz, bigint,
                       int[], text[], int[], bigint[], bigint[], text[], int[], bigint[], bigint,
                       timestamptz, timestamptz, timestamptz, bigint, bigint, bigint) AS
WITH new_batch AS (
{_NEW_BATCH.format(stateful="$18, $19, $20, $21, $22, $23")}), new_offsets AS (
    -- one compact row per (source, topic): its partitions' ranges as arrays, in the order sent
    INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
    SELECT nb.id, o.source_index, o.topic, array_agg(o.partition ORDER BY o.n),
           array_agg(o.from_offset ORDER BY o.n), array_agg(o.until_offset ORDER BY o.n)
    FROM new_batch nb, unnest($9, $10, $11, $12, $13) WITH ORDINALITY
         AS o (source_index, topic, partition, from_offset, until_offset, n)
    GROUP BY nb.id, o.source_index, o.topic
    -- no ON CONFLICT: the batch's key is the one just made (a speculative insert logs a confirm record)
), moved AS (
{_MOVE_SET.format(ends="e.until_offsets", at="$7", batch="$5")}    FROM {_ENDS.format(args="$14, $15, $16, $16, NULL::bigint[]")}
{_GROUPED_RULE}{_ONE_BATCH_RULE.format(ends="e.until_offsets")}    RETURNING 1
), run AS (
{_ONE_BATCH_RUN.format(duration="$17")})
-- A data-dependent cast error (a constant one would fail at plan time): the abort described above.
SELECT (CASE WHEN (SELECT count(*) FROM new_batch) = 1
              AND (SELECT count(*) FROM moved) = (SELECT count(DISTINCT t) FROM unnest($14) t)
             THEN '1' ELSE '{_FAST_BATCH_ABORT}' END)::int
"""
_ONE_BATCH_CALL = (f"BEGIN; {_GENERIC}SELECT pg_advisory_xact_lock(%s); "
                   f"EXECUTE {_ONE_BATCH} ({', '.join(['%s'] * 23)}); COMMIT")


# The commonest batch of all: one Kafka source reading one topic. Its ranges are then one
# ``offset_ranges`` row and one ``topic_positions`` row whose partitions are the ranges' own, sorted
# (Python sorts them): the arrays go in as they are, with no unnest, sort and array_agg per column to
# rebuild what Python already had. The rules are the one-batch statement's, word for word.
_ONE_TOPIC = "offset_ledger_record_topic_batch_v4"
_ONE_TOPIC_SQL = f"""
PREPARE {_ONE_TOPIC} (text, text, text, text, bigint, timestamptz, timestamptz, bigint,
                      int, text, int[], bigint[], bigint[], bigint,
                      timestamptz, timestamptz, timestamptz, bigint, bigint, bigint) AS
WITH new_batch AS (
{_NEW_BATCH.format(stateful="$15, $16, $17, $18, $19, $20")}), new_offsets AS (
    INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
    SELECT nb.id, $9, $10, $11, $12, $13 FROM new_batch nb
), moved AS (
{_MOVE_SET.format(ends="$13", at="$7", batch="$5")}{_MOVE_RULE.format(topic="$10", partitions="$11")}{_ONE_BATCH_RULE.format(ends="$13")}    RETURNING 1
), run AS (
{_ONE_BATCH_RUN.format(duration="$14")})
SELECT (CASE WHEN (SELECT count(*) FROM new_batch) = 1 AND (SELECT count(*) FROM moved) = 1
             THEN '1' ELSE '{_FAST_BATCH_ABORT}' END)::int
"""
_ONE_TOPIC_CALL = (f"BEGIN; {_GENERIC}SELECT pg_advisory_xact_lock(%s); "
                   f"EXECUTE {_ONE_TOPIC} ({', '.join(['%s'] * 20)}); COMMIT")


def _one_topic_ranges(batch: BatchOffsets) -> tuple[SourceProgress, str, list[PartitionRange]] | None:
    """(its source, its topic, its ranges by partition) when ``batch`` reads one topic through one Kafka
    source, each partition once: the batch ``_ONE_TOPIC`` writes; else None."""
    if len(batch.sources) != 1 or not batch.sources[0].ranges:
        return None
    source = batch.sources[0]
    topic = source.ranges[0].topic
    if any(r.topic != topic for r in source.ranges):
        return None
    ranges = sorted(source.ranges, key=lambda r: r.partition)
    if any(a.partition == b.partition for a, b in pairwise(ranges)):
        return None
    return source, topic, ranges


def _one_topic_params(rec: BatchRecord, source: SourceProgress, topic: str, ranges: list[PartitionRange],
                      txn: Transaction) -> tuple[Any, ...]:
    """The parameters of ``_ONE_TOPIC`` after the lock key (``_one_topic_ranges`` gave the rest)."""
    b = rec.batch
    return (rec.pipeline, rec.consumer_group, b.query_id, b.run_id, b.batch_id, utc(b.batch_time), txn.now,
            b.input_rows, source.source_index, topic, pg_int_array([r.partition for r in ranges]),
            pg_int_array([r.from_offset for r in ranges]), pg_int_array([r.until_offset for r in ranges]),
            b.duration_ms, *stateful_values(b))


def _one_batch_params(rec: BatchRecord, ends: dict[tuple[str, int], list[int]], keys: list[tuple[str, int]],
                      txn: Transaction) -> tuple[Any, ...]:
    """The parameters of ``_ONE_BATCH`` after the lock key (``ends`` and ``keys`` as for ``_batches_params``)."""
    b = rec.batch
    offsets = offset_rows(b)
    return (rec.pipeline, rec.consumer_group, b.query_id, b.run_id, b.batch_id, utc(b.batch_time), txn.now,
            b.input_rows,
            pg_int_array([o[0] for o in offsets]), pg_text_array([o[1] for o in offsets]),
            pg_int_array([o[2] for o in offsets]), pg_int_array([o[3] for o in offsets]),
            pg_int_array([o[4] for o in offsets]),
            pg_text_array([k[0] for k in keys]), pg_int_array([k[1] for k in keys]),
            pg_int_array([ends[k][1] for k in keys]), b.duration_ms, *stateful_values(b))


def _batches_params(recs: Sequence[BatchRecord], ends: dict[tuple[str, int], list[int]],
                    keys: list[tuple[str, int]], txn: Transaction) -> tuple[Any, ...]:
    """The parameters of ``_BATCHES`` after the lock key; ``ends``: (topic, partition) -> [first end,
    last end, batch id of the last], ``keys`` its keys in lock order."""
    head = recs[0]
    # each offset row with its batch's place in the batch arrays (1-based, as Postgres counts)
    offsets = [(i, *row) for i, rec in enumerate(recs, 1) for row in offset_rows(rec.batch)]
    stateful = [stateful_values(rec.batch) for rec in recs]
    durations = [rec.batch.duration_ms for rec in recs if rec.batch.duration_ms is not None]
    return (head.pipeline, head.consumer_group, head.batch.query_id, head.batch.run_id, txn.now,
            pg_int_array([rec.batch.batch_id for rec in recs]),
            pg_time_array([rec.batch.batch_time for rec in recs]),
            pg_int_array([rec.batch.input_rows for rec in recs]),
            *(pg_time_array([v[i] for v in stateful]) for i in range(3)),
            *(pg_int_array([v[i] for v in stateful]) for i in range(3, 6)),
            # offsets: batch (its place), source index, topic, partition, from, until
            pg_int_array([o[0] for o in offsets]), pg_int_array([o[1] for o in offsets]),
            pg_text_array([o[2] for o in offsets]), pg_int_array([o[3] for o in offsets]),
            pg_int_array([o[4] for o in offsets]), pg_int_array([o[5] for o in offsets]),
            pg_text_array([k[0] for k in keys]), pg_int_array([k[1] for k in keys]),
            pg_int_array([ends[k][0] for k in keys]), pg_int_array([ends[k][1] for k in keys]),
            pg_int_array([ends[k][2] for k in keys]), max(durations) if durations else None)


class FastBatchPath:
    """The one-round-trip path on PostgreSQL with psycopg2; ``known``: the recorder's committed knowledge."""

    def __init__(self, dbapi: Any, known: Known) -> None:
        self.dbapi = dbapi
        self.known = known
        #: False once prepared statements proved not to survive on the connection (a pooler)
        self.usable = True

    def batches(self, records: Sequence[Record]) -> list[BatchRecord] | None:
        """The batches of ``records`` when the one statement can write them all, else None (the general path).

        That is the steady state of a listener: batches of one run only, each newer than the one
        before it (the last one this recorder committed for the query, then the one before it in
        ``records``), so no re-delivery to compare and the previous ends for the gap check are
        known; of a run whose start is cached (the pending-reset rule needs it); leaving no gap
        (findings are the general path's business; ``record`` refuses a position that would
        go backwards inside the fold as it collects the ends). A listener that keeps up writes one
        batch per call; one that fell behind (a busy ledger, a slow core) folds what queued, and
        that is when a round trip per statement would cost most.
        """
        if not self.usable or not records:
            return None
        first = records[0]
        if not isinstance(first, BatchRecord):
            return None
        latest = self.known.latest.get(first.batch.query_id)
        if latest is None or first.batch.run_id not in self.known.runs:
            return None
        out: list[BatchRecord] = []
        prev_id, prev_ends = latest
        for rec in records:
            if not isinstance(rec, BatchRecord):
                return None
            b = rec.batch
            if ((rec.pipeline, rec.consumer_group, b.query_id, b.run_id)
                    != (first.pipeline, first.consumer_group, first.batch.query_id, first.batch.run_id)
                    or b.batch_id <= prev_id or b.recorded_by is not None):
                return None
            if out:  # the ends of the batch before it in ``records``, made when a batch follows it
                prev_ends = batch_ends(out[-1].batch)
            if any(gaps(b, prev_ends)) or any(r.from_offset is None for s in b.sources for r in s.ranges):
                return None
            if read_shortfalls(b):
                return None  # records skipped: a data_loss finding, the general path's business
            prev_id = b.batch_id
            out.append(rec)
        return out

    def record(self, conn: Connection, recs: Sequence[BatchRecord], txn: Transaction) -> RecordOutcome | None:
        """Record ``recs`` in one round trip, one transaction; None: nothing written, use the general path."""
        head = recs[0]
        lock = pipeline_lock_key(head.pipeline, head.consumer_group)
        one_topic = _one_topic_ranges(head.batch) if len(recs) == 1 else None
        if one_topic is not None:
            # One batch: nothing folded, so the checks between batches (``_folded_plan``) do not apply.
            source, topic, ranges = one_topic
            name, prepare, call = _ONE_TOPIC, _ONE_TOPIC_SQL, _ONE_TOPIC_CALL
            params = (lock, *_one_topic_params(head, source, topic, ranges, txn))
            moved_ends = [(topic, r.partition, r.until_offset) for r in ranges]
        else:
            plan = _folded_plan(recs, txn)
            if plan is None:
                return None
            name, prepare, call, params, moved_ends = plan
            params = (lock, *params)
        # The held connection is between transactions here. In autocommit mode psycopg2 sends no
        # BEGIN of its own (a round trip), so the string's BEGIN ... COMMIT is the transaction.
        raw: Any = conn.connection.dbapi_connection
        info = conn.connection.info
        dbapi: Any = self.dbapi
        raw.autocommit = True
        try:
            with raw.cursor() as cursor:
                if not info.get(name):
                    # Once per session: a prepared statement outlives transactions, rolled back or not.
                    cursor.execute(prepare)
                    info[name] = True
                try:
                    cursor.execute(call, params)
                except dbapi.Error as exc:
                    # The string stopped at the failing statement, inside its transaction block.
                    if not raw.closed:
                        cursor.execute("ROLLBACK")
                    if isinstance(exc, dbapi.DataError) and _FAST_BATCH_ABORT in str(exc):
                        return None
                    if getattr(exc, "pgcode", None) == "26000":
                        # invalid_sql_statement_name: the prepared statement vanished between calls,
                        # as behind a transaction-pooling proxy (pgbouncer). Use the general path.
                        log.warning("offset-ledger: prepared statements do not survive on this connection "
                                    "(a transaction pooler?); recording without the one-round-trip path")
                        self.usable = False
                        return None
                    raise
                except BaseException:
                    # The server may be inside the string's transaction: never hand this to the pool.
                    conn.invalidate()
                    raise
        finally:
            if not raw.closed:
                raw.autocommit = False
        last = recs[-1].batch
        txn.latest[last.query_id] = (last.batch_id, batch_ends(last))
        # The statement commits only when every end moved its position (anything else aborts it);
        # what moved is reported as the general path does: the pipeline's positions in lock order.
        moved = tuple(MovedPosition(head.pipeline, head.consumer_group, t, p, end) for t, p, end in moved_ends)
        return RecordOutcome(len(recs), 0, (), moved)


def _folded_plan(recs: Sequence[BatchRecord], txn: Transaction) -> tuple[str, str, str, tuple[Any, ...],
                                                                    list[tuple[str, int, int]]] | None:
    """(statement, its PREPARE, its call, parameters after the lock key, the positions moved in lock
    order) for batches the one-topic statement does not take; None: the general path's to write."""
    # (topic, partition) -> [first end, last end, the batch that ended it last]
    ends: dict[tuple[str, int], list[int]] = {}
    for rec in recs:
        for topic, partition, until_offset in position_ends(rec.batch):
            end = ends.get((topic, partition))
            if end is None:
                ends[(topic, partition)] = [until_offset, until_offset, rec.batch.batch_id]
            elif until_offset < end[1]:
                # The position would go backwards inside the fold: a regression of the later
                # batch that the general path reports. Nothing is written yet.
                return None
            else:
                end[1:] = [until_offset, rec.batch.batch_id]
    keys = sorted(ends)  # lock order
    last_batch: dict[str, int] = {}
    for (topic, _), end in ends.items():
        if last_batch.setdefault(topic, end[2]) != end[2]:
            # Partitions of one topic last moved by different batches of the fold: more than one
            # mover for the topic's row (``tables.topic_positions``), the general path's to write.
            return None
    moved_ends = [(t, p, ends[(t, p)][1]) for t, p in keys]
    if len(recs) == 1:
        return _ONE_BATCH, _ONE_BATCH_SQL, _ONE_BATCH_CALL, _one_batch_params(recs[0], ends, keys, txn), moved_ends
    return _BATCHES, _BATCHES_SQL, _BATCHES_CALL, _batches_params(recs, ends, keys, txn), moved_ends
