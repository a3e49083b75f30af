"""Plain batches on PostgreSQL in one round trip: the prepared statement and the path that uses it.

A mixin of ``Recorder`` (``offset_ledger.ledger.recorder``), kept apart because it is one job: the
steady state of a listener, written without the general path's SELECTs: one batch when the listener
keeps up, the batches that queued (one EXECUTE each, in one string) when it fell behind.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from offset_ledger.ledger.locks import pipeline_lock_key
from offset_ledger.ledger.records import (
    BatchRecord,
    MovedPosition,
    Record,
    RecordOutcome,
    _ends,
    _gaps,
    _offset_rows,
    _position_ends,
    _stateful_values,
    _Txn,
    utc,
)

log = logging.getLogger("offset_ledger.ledger.recorder")


# The isolated batch on PostgreSQL in one round trip: "BEGIN; EXECUTE <statement>; COMMIT" sent as
# one string. The statement writes the batch, its offsets, the positions and the run; it is prepared
# once per connection (no parse, plan or SQLAlchemy compile per batch). Offsets and ends arrive as
# array literals, one parameter each, which Postgres parses far faster than a VALUES row per
# partition. The positions upsert takes the row locks in (topic, partition) order, byte-wise like
# Python's sorted() that the reset writer and _move_positions use; ON CONFLICT DO UPDATE locks a row
# even when its WHERE refuses the update, and that WHERE is the forward-only and pending-reset rule
# of _move_positions in its plainest case: the run is on the current generation (or the pipeline has
# none), no reset is pending and the position was last moved by this query or placed by a restart or
# reset. Anything that rule or idempotency would have to explain (a batch another writer already
# recorded, a position not moved: regression, pending_reset, foreign_run, shared_position) makes the final
# SELECT fail on purpose, so the statement and its transaction leave nothing behind and the
# general path records the batch with its findings. Statement-level atomicity does the rest.
_FAST_BATCH = "offset_ledger_record_batch"
_FAST_BATCH_ABORT = "offset-ledger: not a plain batch"
_FAST_BATCH_SQL = f"""
PREPARE {_FAST_BATCH} (text, text, text, text, bigint, timestamptz, timestamptz, bigint,
                       int[], text[], int[], bigint[], bigint[], text[], int[], bigint[], bigint,
                       timestamptz, timestamptz, timestamptz, bigint, bigint, bigint) AS
WITH new_batch AS (
    INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,
                         input_rows, watermark, event_time_min, event_time_max, state_rows_total,
                         state_rows_updated, state_rows_dropped_by_watermark)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $18, $19, $20, $21, $22, $23)
    ON CONFLICT (query_id, batch_id) DO NOTHING
    RETURNING 1
), new_offsets AS (
    INSERT INTO batch_offsets (pipeline, consumer_group, query_id, batch_id, source_index, topic, "partition",
                               from_offset, until_offset, batch_time)
    SELECT $1, $2, $3, $5, o.source_index, o.topic, o.partition, o.from_offset, o.until_offset, $6
    FROM unnest($9, $10, $11, $12, $13) AS o (source_index, topic, partition, from_offset, until_offset)
    ON CONFLICT (query_id, batch_id, source_index, topic, "partition") DO NOTHING
), moved AS (
    INSERT INTO positions AS p (pipeline, consumer_group, topic, "partition", next_offset, updated_at,
                                query_id, batch_id, reset_id)
    SELECT $1, $2, e.topic, e.partition, e.until_offset, $7, $3, $5, NULL
    FROM unnest($14, $15, $16) AS e (topic, partition, until_offset)
    -- Authority, for new rows as for updates: the run is on the current generation, or there is none.
    WHERE (SELECT max(g.id) FROM checkpoint_generations g WHERE g.pipeline = $1 AND g.consumer_group = $2)
          IS NOT DISTINCT FROM (SELECT r.generation_id FROM runs r WHERE r.run_id = $4)
    ORDER BY e.topic COLLATE "C", e.partition
    ON CONFLICT (pipeline, consumer_group, topic, "partition") DO UPDATE
    SET next_offset = EXCLUDED.next_offset, updated_at = EXCLUDED.updated_at, query_id = EXCLUDED.query_id,
        batch_id = EXCLUDED.batch_id, reset_id = NULL
    WHERE p.next_offset <= EXCLUDED.next_offset
      AND (p.query_id IS NULL OR p.query_id = $3)
      AND (p.reset_id IS NULL
           OR NOT EXISTS (SELECT FROM resets r WHERE r.id = p.reset_id AND r.status = 'pending'))
    RETURNING 1
), run AS (
    UPDATE runs SET last_batch_id = $5, last_heartbeat_at = $6,
                    max_batch_ms = greatest(max_batch_ms, $17)  -- $17: the batch's duration or NULL
    WHERE run_id = $4
)
-- A data-dependent cast error (a constant one would fail at plan time): the abort described above.
SELECT (CASE WHEN (SELECT count(*) FROM new_batch) = 1 AND (SELECT count(*) FROM moved) = cardinality($16)
             THEN '1' ELSE '{_FAST_BATCH_ABORT}' END)::int
"""
def _fast_call(batches: int) -> str:
    """The one string of a transaction that writes ``batches`` batches of one pipeline.

    The shared pipeline lock comes first, as on the general path (ledger.locks)."""
    execute = f"EXECUTE {_FAST_BATCH} ({', '.join(['%s'] * 23)}); "
    return "BEGIN; SELECT pg_advisory_xact_lock_shared(%s); " + execute * batches + "COMMIT"


def _int_array(values: Sequence[int | None]) -> str:
    """A Postgres array literal of integers (None as NULL), sent as one text parameter."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def _text_array(values: Sequence[str]) -> str:
    """A Postgres array literal of strings: every element double-quoted, backslash and quote escaped."""
    quoted: dict[str, str] = {}
    out = []
    for v in values:
        q = quoted.get(v)
        if q is None:
            q = quoted[v] = '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        out.append(q)
    return "{" + ",".join(out) + "}"


class FastBatchPath:
    """``Recorder``'s one-round-trip path (the attributes it uses are ``Recorder``'s)."""

    _fast: bool
    _latest: dict[str, tuple[int, Any]]
    _runs: dict[str, Any]
    engine: Engine

    def _fast_batches(self, records: Sequence[Record]) -> list[BatchRecord] | None:
        """The batches of ``records`` when one statement each, in one round trip, can write them all,
        else None (the general path).

        That is the steady state of a listener: batches only, each newer than the last one of its
        query (committed by this recorder, or before it in ``records``), so no re-delivery to compare
        and the previous ends for the gap check are known; of a run whose start is cached (the
        pending-reset rule needs it); leaving no gap (findings are the general path's business). A
        listener that keeps up writes one batch per call; one that fell behind (a busy ledger, a
        slow core) folds what queued, and it is then that a round trip per statement costs most.
        """
        if not self._fast or not records:
            return None
        chain: dict[str, tuple[int, Any]] = {}
        out: list[BatchRecord] = []
        for rec in records:
            # One pipeline per string: its statements then lock rows of one pipeline only.
            if not isinstance(rec, BatchRecord) or (out and (rec.pipeline, rec.consumer_group)
                                                    != (out[0].pipeline, out[0].consumer_group)):
                return None
            b = rec.batch
            latest = chain.get(b.query_id) or self._latest.get(b.query_id)
            if latest is None or b.batch_id <= latest[0] or b.run_id not in self._runs or b.recorded_by is not None:
                return None
            if any(_gaps(b, latest[1])) or any(r.from_offset is None for s in b.sources for r in s.ranges):
                return None
            chain[b.query_id] = (b.batch_id, _ends(b))
            out.append(rec)
        return out

    def _record_fast(self, conn: Connection, recs: Sequence[BatchRecord], txn: _Txn) -> RecordOutcome | None:
        """Record ``recs`` in one round trip, one transaction; None: nothing written, use the general path.

        Each batch is one EXECUTE of the prepared statement, in order, so each sees what the ones
        before it wrote (its positions, its run), exactly as if it had come alone; any one aborting
        rolls the whole transaction back.
        """
        params: list[Any] = [pipeline_lock_key(recs[0].pipeline, recs[0].consumer_group)]
        final: dict[tuple[str, int], int] = {}  # (topic, partition) -> the last batch's end there
        for rec in recs:
            b = rec.batch
            offsets = _offset_rows(b)
            ends = _position_ends(b)
            params += [rec.pipeline, rec.consumer_group, b.query_id, b.run_id, b.batch_id, utc(b.batch_time),
                       txn.now, b.input_rows,
                       _int_array([o[0] for o in offsets]), _text_array([o[1] for o in offsets]),
                       _int_array([o[2] for o in offsets]), _int_array([o[3] for o in offsets]),
                       _int_array([o[4] for o in offsets]),
                       _text_array([e[0] for e in ends]), _int_array([e[1] for e in ends]),
                       _int_array([e[2] for e in ends]), b.duration_ms, *_stateful_values(b)]
            final.update(((t, p), u) for t, p, u in ends)
        # The held connection is between transactions here. In autocommit mode psycopg2 sends no
        # BEGIN of its own (a round trip), so the string's BEGIN ... COMMIT is the transaction.
        raw: Any = conn.connection.dbapi_connection
        info = conn.connection.info
        dbapi: Any = self.engine.dialect.dbapi
        raw.autocommit = True
        try:
            with raw.cursor() as cursor:
                if not info.get(_FAST_BATCH):
                    # Once per session: a prepared statement outlives transactions, rolled back or not.
                    cursor.execute(_FAST_BATCH_SQL)
                    info[_FAST_BATCH] = True
                try:
                    cursor.execute(_fast_call(len(recs)), params)
                except dbapi.Error as exc:
                    # The string stopped at the failing statement, inside its transaction block.
                    if not raw.closed:
                        cursor.execute("ROLLBACK")
                    if isinstance(exc, dbapi.DataError) and _FAST_BATCH_ABORT in str(exc):
                        return None
                    if getattr(exc, "pgcode", None) == "40P01" and len(recs) > 1:
                        # deadlock_detected: a later statement's row locks are not in the one order
                        # (a partition sorting before one an earlier batch locked, while a second
                        # writer of this pipeline holds it). Nothing was written; the general path
                        # takes every row lock in one order.
                        return None
                    if getattr(exc, "pgcode", None) == "26000":
                        # invalid_sql_statement_name: the prepared statement vanished between calls,
                        # as behind a transaction-pooling proxy (pgbouncer). Use the general path.
                        log.warning("offset-ledger: prepared statements do not survive on this connection "
                                    "(a transaction pooler?); recording without the one-round-trip path")
                        self._fast = False
                        return None
                    raise
                except BaseException:
                    # The server may be inside the string's transaction: never hand this to the pool.
                    conn.invalidate()
                    raise
        finally:
            if not raw.closed:
                raw.autocommit = False
        for rec in recs:
            txn.latest[rec.batch.query_id] = (rec.batch.batch_id, _ends(rec.batch))
        # The statements commit only when every end moved its position (anything else aborts them);
        # what moved is reported as the general path does: a pipeline's positions in lock order.
        pipeline, group = recs[0].pipeline, recs[0].consumer_group
        moved = tuple(MovedPosition(pipeline, group, t, p, u) for (t, p), u in sorted(final.items()))
        return RecordOutcome(len(recs), 0, (), moved)
