"""The write side of the ledger: runs, batches, their offsets, positions, findings and listener health.

One call to :meth:`Recorder.record` is one transaction over any number of listener events, with
multi-row inserts, so a writer that fell behind catches up in a few round trips. Batches are
idempotent on (query id, batch id) and (query id, batch id, source, topic, partition): a re-run
batch or a re-delivered event changes nothing. Positions move in the same transaction, forward
only; a batch that ends behind the current position is a ``regression`` finding. A position a
reset placed stays put until the reset is consumed through a fresh checkpoint: batches of a run
that started before such a pending reset are ``pending_reset`` findings, so a still-running (or
zombie) query never silently overwrites an operator's reset.
A batch whose start differs from the previous batch's end in the same query is a ``gap`` finding.

On PostgreSQL with psycopg2, an isolated batch (a listener that keeps up writes one per call) takes
one round trip: a prepared statement that writes everything inside its own BEGIN ... COMMIT, and
aborts itself, leaving nothing, when a rule would have to explain something (then the general path
below records the batch and its findings). See ``_FAST_BATCH_SQL``.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any, NamedTuple, Union

from sqlalchemy import Table, func, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import (
    SQLAlchemyError,
)

from offset_ledger.authority import GenerationRef, PositionState, decide, match_generation, same_location
from offset_ledger.errors import LedgerError
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.activity import run_is_active
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.finding_store import store_findings
from offset_ledger.ledger.locks import pipeline_lock_key, share_pipelines
from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    checkpoint_generations,
    findings,
    listener_health,
    positions,
    resets,
    runs,
)
from offset_ledger.model import BatchOffsets, Finding, PartitionRange, SourceProgress

log = logging.getLogger(__name__)

# Below this many rows a multi-row VALUES statement beats COPY's extra round trip.
_COPY_MIN_ROWS = 200

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
# The shared pipeline lock comes first, as on the general path (ledger.locks).
_FAST_BATCH_CALL = (f"BEGIN; SELECT pg_advisory_xact_lock_shared(%s); "
                    f"EXECUTE {_FAST_BATCH} ({', '.join(['%s'] * 23)}); COMMIT")


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


# (source_index, topic, partition) -> until_offset of one batch
_Ends = dict[tuple[int, str, int], int]


@dataclass(frozen=True)
class RunStart:
    """A query run began."""

    pipeline: str
    consumer_group: str
    query_id: str
    run_id: str
    query_name: str | None
    started_at: datetime
    app_version: str | None = None
    checkpoint_location: str | None = None


@dataclass(frozen=True)
class RunHeartbeat:
    """A run is alive (an idle event, or a progress report that moved nothing)."""

    pipeline: str
    consumer_group: str
    query_id: str
    run_id: str
    at: datetime


@dataclass(frozen=True)
class RunEnd:
    """A run ended; ``exception`` is Spark's text when it failed."""

    pipeline: str
    consumer_group: str
    query_id: str
    run_id: str
    at: datetime
    exception: str | None = None


@dataclass(frozen=True)
class BatchRecord:
    """A committed micro-batch of a pipeline."""

    pipeline: str
    consumer_group: str
    batch: BatchOffsets


Record = Union[RunStart, RunHeartbeat, RunEnd, BatchRecord]


@dataclass(frozen=True)
class RecordOutcome:
    """What one transaction did."""

    batches_written: int = 0
    duplicates: int = 0
    findings: tuple[Finding, ...] = ()
    # Positions this transaction moved (what a Kafka consumer-group mirror follows):
    # (pipeline, consumer group, topic, partition, next offset), in lock order.
    moved: tuple[MovedPosition, ...] = ()


class MovedPosition(NamedTuple):
    """A position a committed batch moved."""

    pipeline: str
    consumer_group: str
    topic: str
    partition: int
    next_offset: int


@dataclass
class _Pos:
    next_offset: int
    updated_at: datetime
    reset_id: int | None
    query_id: str | None
    batch_id: int | None
    reset_pending: bool = False


@dataclass(frozen=True)
class _Run:
    """What the position rules need of a run: when it started and which generation it is on."""

    started_at: datetime
    generation_id: int | None


@dataclass
class _Txn:
    """State of one transaction, folded into the recorder's caches only after COMMIT."""

    now: datetime
    findings: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[str, tuple[int, _Ends]] = field(default_factory=dict)
    runs: dict[str, _Run] = field(default_factory=dict)
    foreign_reported: set[tuple[str, int]] = field(default_factory=set)
    moved: list[MovedPosition] = field(default_factory=list)
    #: batches another run recorded first: not history again, but heard by the position rules
    other_runs: list[BatchRecord] = field(default_factory=list)


def utc(value: datetime) -> datetime:
    """Aware UTC (SQLite hands back naive datetimes; everything stored is UTC)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _csv_text(value: str) -> str:
    """One CSV field for COPY: quoted when it must be (an empty string too, or COPY reads NULL)."""
    if value == "" or any(c in value for c in ',"\n\r') or value != value.strip():
        return '"' + value.replace('"', '""') + '"'
    return value


def _csv_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[Any]:
    """Rows for COPY ... (FORMAT csv): None stays an unquoted empty field (NULL), datetimes ISO text."""
    get = itemgetter(*columns)
    data: list[Any] = [get(r) for r in rows] if len(columns) > 1 else [(get(r),) for r in rows]
    moments = [i for i, v in enumerate(data[0]) if isinstance(v, datetime)]
    if not moments:
        return data
    iso: dict[datetime, str] = {}  # a batch's rows share one batch_time: format it once
    out = []
    for row in data:
        row = list(row)
        for i in moments:
            value = row[i]
            if value is not None:
                text = iso.get(value)
                if text is None:
                    text = iso[value] = value.isoformat()
                row[i] = text
        out.append(row)
    return out


#: The batch's event-time and state figures, in this order on both write paths ($18..$23 above).
_STATEFUL_COLUMNS = ("watermark", "event_time_min", "event_time_max", "state_rows_total",
                     "state_rows_updated", "state_rows_dropped_by_watermark")


def _stateful_values(batch: BatchOffsets) -> tuple[Any, ...]:
    """The batch's watermark, min / max event time (UTC) and state row counts; None where not reported."""
    return (*(None if t is None else utc(t)
              for t in (batch.watermark, batch.event_time_min, batch.event_time_max)),
            batch.state_rows_total, batch.state_rows_updated, batch.state_rows_dropped_by_watermark)


def _ends(batch: BatchOffsets) -> _Ends:
    return {(s.source_index, r.topic, r.partition): r.until_offset for s in batch.sources for r in s.ranges}


def _offset_rows(batch: BatchOffsets) -> list[tuple[int, str, int, int | None, int]]:
    return sorted((s.source_index, r.topic, r.partition, r.from_offset, r.until_offset)
                  for s in batch.sources for r in s.ranges)


def _gaps(batch: BatchOffsets, prev_ends: _Ends) -> Iterator[tuple[SourceProgress, PartitionRange, int, int]]:
    """(source, range, from_offset, previous end) of each range not starting where the previous batch ended."""
    for s in batch.sources:
        for r in s.ranges:
            expected = prev_ends.get((s.source_index, r.topic, r.partition))
            if r.from_offset is not None and expected is not None and expected != r.from_offset:
                yield s, r, r.from_offset, expected


def _position_starts(batch: BatchOffsets) -> dict[tuple[str, int], int]:
    """(topic, partition) -> where the batch started reading it (the lower start of a self-union)."""
    out: dict[tuple[str, int], int] = {}
    for s in batch.sources:
        for r in s.ranges:
            if r.from_offset is not None:
                key = (r.topic, r.partition)
                out[key] = min(out.get(key, r.from_offset), r.from_offset)
    return out


def _position_ends(batch: BatchOffsets) -> list[tuple[str, int, int]]:
    """(topic, partition, until_offset) per partition the batch read, in lock order (sorted)."""
    if len(batch.sources) == 1:
        return sorted((r.topic, r.partition, r.until_offset) for r in batch.sources[0].ranges)
    # Two sources on one topic (a self-union) share the partition's position, and a restart hands
    # both the same startingOffsets: the lower end is the one from which neither skips a record.
    merged: dict[tuple[str, int], int] = {}
    for s in batch.sources:
        for r in s.ranges:
            key = (r.topic, r.partition)
            merged[key] = min(merged.get(key, r.until_offset), r.until_offset)
    return sorted((t, p, u) for (t, p), u in merged.items())


def translate(exc: Exception) -> LedgerError:
    """A driver error as LedgerUnavailable (retriable: connection lost or refused) or LedgerError."""
    return translate_db_error(exc, "writing")


class Recorder:
    """Writes listener events to the ledger; not thread-safe (one writer thread owns it)."""

    def __init__(self, engine: Engine, *, owns_engine: bool = False) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        dialect = engine.dialect.name
        if dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        else:
            raise LedgerError(f"unsupported ledger database {dialect!r} (use PostgreSQL or SQLite)")
        self._insert = insert
        self._execute_values: Any = None
        if engine.dialect.driver == "psycopg2":
            from psycopg2.extras import execute_values  # type: ignore[import-untyped]

            self._execute_values = execute_values
        # The one-statement path for an isolated batch needs Postgres and the raw psycopg2 cursor.
        self._fast = dialect == "postgresql" and engine.dialect.driver == "psycopg2"
        self._conn: Connection | None = None
        # Committed knowledge that saves a SELECT per transaction on the hot path.
        self._latest: dict[str, tuple[int, _Ends]] = {}
        self._runs: dict[str, _Run] = {}
        self._foreign_reported: set[tuple[str, int]] = set()
        # generation id -> its resolved starting offsets, to give a fresh run's first batch its start
        self._generation_offsets: dict[int, dict[tuple[str, int], int]] = {}

    # ------------------------------------------------------------------ public

    def record(self, records: Sequence[Record], *, now: datetime | None = None) -> RecordOutcome:
        """Write ``records`` in one transaction; raises LedgerUnavailable / LedgerError."""
        txn = _Txn(now=utc(now or datetime.now(timezone.utc)))
        dbapi = self.engine.dialect.dbapi
        try:
            # One connection held across transactions: no pool checkout (and pre-ping round trip)
            # per batch. Any failure drops it; the next call checks a fresh one out of the pool.
            if self._conn is None or self._conn.closed or self._conn.invalidated:
                self._conn = self.engine.connect()
            conn = self._conn
            try:
                outcome = None
                fast = self._fast_batch(records)
                if fast is not None:
                    try:
                        outcome = self._record_fast(conn, fast, txn)
                    except dbapi.Error as exc:  # type: ignore[union-attr]
                        raise self._raw_error(conn, exc) from exc
                if outcome is None:
                    with conn.begin():
                        try:
                            outcome = self._record(conn, records, txn)
                        except dbapi.Error as exc:  # type: ignore[union-attr]
                            raise self._raw_error(conn, exc) from exc
            except BaseException as exc:
                # After a transient error the session itself may be the problem (a read-only one
                # after a failover keeps its setting): never hand it back to the pool.
                self._drop_connection(invalidate=isinstance(exc, Exception) and translate(exc).retriable)
                raise
        except SQLAlchemyError as exc:
            raise translate(exc) from exc
        self._latest.update(txn.latest)
        self._runs.update(txn.runs)
        self._foreign_reported |= txn.foreign_reported
        return outcome

    def _raw_error(self, conn: Connection, exc: Exception) -> LedgerError:
        """A driver error raised on the raw cursor (SQLAlchemy did not wrap it), translated."""
        error = translate(exc)
        if error.retriable:
            conn.invalidate()
        return error

    def close(self) -> None:
        """Return the held connection to the pool (and dispose of the engine if this recorder made it)."""
        self._drop_connection()
        if self._owns_engine:
            self.engine.dispose()

    def _drop_connection(self, *, invalidate: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if invalidate and not conn.invalidated:
                    conn.invalidate()
                conn.close()
            except SQLAlchemyError:
                log.debug("closing a broken ledger connection failed", exc_info=True)

    def report_health(self, listener_id: str, pipeline: str | None, host: str,
                      counters: Mapping[str, int], last_error: str | None,
                      *, now: datetime | None = None) -> None:
        """Upsert this listener's cumulative counters into ``listener_health``."""
        row = {"listener_id": listener_id, "pipeline": pipeline, "host": host,
               "reported_at": utc(now or datetime.now(timezone.utc)), "last_error": last_error,
               **{k: int(counters.get(k, 0)) for k in ("queued", "written", "retried", "spilled", "failed")}}
        stmt = self._insert(listener_health)
        stmt = stmt.on_conflict_do_update(
            index_elements=[listener_health.c.listener_id],
            set_={k: stmt.excluded[k] for k in row if k != "listener_id"})
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt, [row])
        except SQLAlchemyError as exc:
            raise translate(exc) from exc

    # ------------------------------------------------------------------ the transaction

    def _copy_upsert(self, conn: Connection, table: Table, columns: list[str], csv_text: str,
                     tail: str, returning: bool) -> list[tuple[Any, ...]]:
        """COPY ``csv_text`` into a session-temporary stage, then INSERT ... SELECT ``tail`` from it."""
        quote = conn.dialect.identifier_preparer.quote
        cols = ", ".join(quote(c) for c in columns)
        stage = quote(f"_ol_stage_{table.name}")
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            made = conn.connection.info.setdefault("offset_ledger_stages", set())
            if stage not in made:
                cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} AS "
                               f"SELECT {cols} FROM {quote(table.name)} WITH NO DATA")
                made.add(stage)
            cursor.copy_expert(f"COPY {stage} ({cols}) FROM STDIN WITH (FORMAT csv)", io.StringIO(csv_text))
            # Emptying the stage in the same statement leaves it clean even if we fail later.
            cursor.execute(f"WITH staged AS (DELETE FROM {stage} RETURNING {cols}) "
                           f"INSERT INTO {quote(table.name)} ({cols}) SELECT {cols} FROM staged {tail}")
            return [tuple(r) for r in cursor.fetchall()] if returning else []
        finally:
            cursor.close()

    def _copy_offsets(self, conn: Connection, recs: list[BatchRecord]) -> None:
        """batch_offsets rows straight to CSV text: the hot path of a many-partition batch."""
        quoted: dict[str, str] = {}

        def q(value: str) -> str:
            out = quoted.get(value)
            if out is None:
                out = quoted[value] = _csv_text(value)
            return out

        lines: list[str] = []
        for rec in recs:
            b = rec.batch
            head = f"{q(rec.pipeline)},{q(rec.consumer_group)},{q(b.query_id)},{b.batch_id},"
            end = f",{utc(b.batch_time).isoformat()}\n"
            for s in b.sources:
                for r in s.ranges:
                    since = "" if r.from_offset is None else r.from_offset
                    lines.append(f"{head}{s.source_index},{q(r.topic)},{r.partition},{since},{r.until_offset}{end}")
        quote = conn.dialect.identifier_preparer.quote
        columns = ["pipeline", "consumer_group", "query_id", "batch_id", "source_index", "topic", "partition",
                   "from_offset", "until_offset", "batch_time"]
        conflict = ", ".join(quote(c) for c in ("query_id", "batch_id", "source_index", "topic", "partition"))
        self._copy_upsert(conn, batch_offsets, columns, "".join(lines),
                          f"ON CONFLICT ({conflict}) DO NOTHING", False)

    def _bulk(self, conn: Connection, table: Table, rows: list[dict[str, Any]], conflict: tuple[str, ...],
              *, update: tuple[str, ...] = (), returning: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        """Multi-row ``INSERT ... ON CONFLICT (conflict) DO NOTHING | DO UPDATE`` of ``rows``.

        On psycopg2, small sets go as one ``VALUES (...), (...)`` statement (``execute_values``;
        SQLAlchemy would send an ON CONFLICT executemany row by row), large ones are COPYed into a
        session-temporary staging table and inserted from there with the same ON CONFLICT clause:
        for 1000 rows, COPY plus INSERT ... SELECT measured 3-4x cheaper than one multi-row INSERT,
        whose parsing dominates.
        """
        if self._execute_values is not None:
            quote = conn.dialect.identifier_preparer.quote
            columns = list(rows[0])
            cols = ", ".join(quote(c) for c in columns)
            action = ("DO UPDATE SET " + ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in update)
                      if update else "DO NOTHING")
            tail = f"ON CONFLICT ({', '.join(quote(c) for c in conflict)}) {action}"
            if returning:
                tail += " RETURNING " + ", ".join(quote(c) for c in returning)
            cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            try:
                if len(rows) < _COPY_MIN_ROWS:
                    result = self._execute_values(
                        cursor, f"INSERT INTO {quote(table.name)} ({cols}) VALUES %s {tail}",
                        [tuple(r[c] for c in columns) for r in rows], page_size=1000, fetch=bool(returning))
                    return [tuple(r) for r in result] if returning else []
            finally:
                cursor.close()
            buffer = io.StringIO()
            csv.writer(buffer).writerows(_csv_rows(rows, columns))
            return self._copy_upsert(conn, table, columns, buffer.getvalue(), tail, bool(returning))
        stmt = self._insert(table)
        if update:
            stmt = stmt.on_conflict_do_update(index_elements=list(conflict),
                                              set_={c: stmt.excluded[c] for c in update})
        else:
            stmt = stmt.on_conflict_do_nothing(index_elements=list(conflict))
        if returning:
            return [tuple(r) for r in conn.execute(stmt.returning(*(table.c[c] for c in returning)), rows)]
        conn.execute(stmt, rows)
        return []

    def _record(self, conn: Connection, records: Sequence[Record], txn: _Txn) -> RecordOutcome:
        for rec in records:
            if isinstance(rec, RunStart):
                self._run_start(conn, rec, txn)
            elif isinstance(rec, RunHeartbeat):
                self._touch_run(conn, rec.pipeline, rec.consumer_group, rec.query_id, rec.run_id,
                                rec.at, {"last_heartbeat_at": utc(rec.at)})
            elif isinstance(rec, RunEnd):
                self._touch_run(conn, rec.pipeline, rec.consumer_group, rec.query_id, rec.run_id,
                                rec.at, {"terminated_at": utc(rec.at), "exception": rec.exception})
        recs = [r for r in records if isinstance(r, BatchRecord)]
        if recs:
            self._ensure_runs(conn, recs, txn)
            recs = self._with_first_starts(conn, recs, txn)
        new, duplicates = self._new_batches(conn, recs, txn)
        if new:
            written = self._write_batches(conn, new, txn)
            duplicates += len(new) - len(written)
            new = written
        if txn.other_runs:
            self._move_positions(conn, txn.other_runs, txn)
        return self._outcome(conn, txn, len(new), duplicates)

    def _outcome(self, conn: Connection, txn: _Txn, written: int, duplicates: int) -> RecordOutcome:
        """Write the transaction's findings and say what it did."""
        if txn.findings:
            store_findings(conn, self._insert, txn.findings)
        found = tuple(
            Finding(f["kind"], f["message"], f["topic"], f["partition"], f["details"]) for f in txn.findings)
        return RecordOutcome(written, duplicates, found, tuple(txn.moved))

    # ------------------------------------------------------------------ the isolated batch on Postgres

    def _fast_batch(self, records: Sequence[Record]) -> BatchRecord | None:
        """The batch of ``records`` when one statement can write it all, else None (the general path).

        That is the steady state of a listener that keeps up: one batch, newer than the last one this
        recorder committed for its query (so no re-delivery to compare, and the previous ends for the
        gap check are cached), of a run whose start is cached (the pending-reset rule needs it), that
        leaves no gap (findings are the general path's business).
        """
        if not self._fast or len(records) != 1 or not isinstance(records[0], BatchRecord):
            return None
        b = records[0].batch
        latest = self._latest.get(b.query_id)
        if latest is None or b.batch_id <= latest[0] or b.run_id not in self._runs or b.recorded_by is not None:
            return None
        if any(_gaps(b, latest[1])) or any(r.from_offset is None for s in b.sources for r in s.ranges):
            return None
        return records[0]

    def _record_fast(self, conn: Connection, rec: BatchRecord, txn: _Txn) -> RecordOutcome | None:
        """Record ``rec`` in one round trip, its own transaction; None: nothing written, use the general path."""
        b = rec.batch
        offsets = _offset_rows(b)
        ends = _position_ends(b)
        params = (rec.pipeline, rec.consumer_group, b.query_id, b.run_id, b.batch_id, utc(b.batch_time), txn.now,
                  b.input_rows,
                  _int_array([o[0] for o in offsets]), _text_array([o[1] for o in offsets]),
                  _int_array([o[2] for o in offsets]), _int_array([o[3] for o in offsets]),
                  _int_array([o[4] for o in offsets]),
                  _text_array([e[0] for e in ends]), _int_array([e[1] for e in ends]),
                  _int_array([e[2] for e in ends]), b.duration_ms) + _stateful_values(b)
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
                    cursor.execute(_FAST_BATCH_CALL, (pipeline_lock_key(rec.pipeline, rec.consumer_group),) + params)
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
        txn.latest[b.query_id] = (b.batch_id, _ends(b))
        # The statement commits only when every end moved its position (anything else aborts it).
        moved = tuple(MovedPosition(rec.pipeline, rec.consumer_group, t, p, u) for t, p, u in ends)
        return RecordOutcome(1, 0, (), moved)

    def _run_start(self, conn: Connection, rec: RunStart, txn: _Txn) -> None:
        generation_id = self._assign_generation(conn, rec.pipeline, rec.consumer_group, rec.query_id,
                                                rec.run_id, rec.checkpoint_location)
        row = {"run_id": rec.run_id, "query_id": rec.query_id, "pipeline": rec.pipeline,
               "consumer_group": rec.consumer_group, "query_name": rec.query_name,
               "app_version": rec.app_version, "checkpoint_location": rec.checkpoint_location,
               "started_at": utc(rec.started_at), "generation_id": generation_id}
        stmt = self._insert(runs)
        # The start event is authoritative; a row made earlier from a batch only guessed these.
        stmt = stmt.on_conflict_do_update(
            index_elements=[runs.c.run_id],
            set_={k: stmt.excluded[k] for k in ("query_name", "app_version", "checkpoint_location", "started_at",
                                                 "generation_id")})
        conn.execute(stmt, [row])
        txn.runs[rec.run_id] = _Run(utc(rec.started_at), generation_id)

    def _assign_generation(self, conn: Connection, pipeline: str, group: str, query_id: str, run_id: str,
                           checkpoint_location: str | None) -> int | None:
        """The generation a new run is on (see ``authority.match_generation``); claims it for the query."""
        rows = conn.execute(select(checkpoint_generations.c.id, checkpoint_generations.c.location,
                                   checkpoint_generations.c.query_id)
                            .where(checkpoint_generations.c.pipeline == pipeline,
                                   checkpoint_generations.c.consumer_group == group)).all()
        if not rows and checkpoint_location:
            rows = self._adopt_defaulted_group(conn, pipeline, group, checkpoint_location)
        if not rows:
            return None
        seen = conn.execute(select(runs.c.run_id).where(runs.c.query_id == query_id, runs.c.run_id != run_id)
                            .limit(1)).first() is not None
        found = match_generation([GenerationRef(r.id, r.location, r.query_id) for r in rows],
                                 checkpoint_location=checkpoint_location, query_id=query_id,
                                 query_seen_before=seen)
        if found is None:
            return None
        if found.query_id is None:
            conn.execute(update(checkpoint_generations)
                         .where(checkpoint_generations.c.id == found.id, checkpoint_generations.c.query_id.is_(None))
                         .values(query_id=query_id))
        return found.id

    def _adopt_defaulted_group(self, conn: Connection, pipeline: str, group: str,
                               checkpoint_location: str) -> list[Any]:
        """A run reporting ``group`` on a generation the helper opened under a group it only defaulted:
        that group yields (``generations.adopt_defaulted_group``); the generations, now ``group``'s."""
        for g in gens.defaulted_generations(conn, pipeline, group):
            if same_location(checkpoint_location, g.location):
                gens.adopt_defaulted_group(conn, pipeline, g.consumer_group, group)
                self._latest.clear()
                return conn.execute(select(checkpoint_generations.c.id, checkpoint_generations.c.location,
                                           checkpoint_generations.c.query_id)
                                    .where(checkpoint_generations.c.pipeline == pipeline,
                                           checkpoint_generations.c.consumer_group == group)).all()
        return []

    def _touch_run(self, conn: Connection, pipeline: str, group: str, query_id: str, run_id: str,
                   at: datetime, values: dict[str, Any]) -> None:
        done = conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))
        if done.rowcount == 0:
            # The listener was added after the query started: make the run row from what we know.
            stmt = self._insert(runs).on_conflict_do_nothing(index_elements=[runs.c.run_id])
            conn.execute(stmt, [{"run_id": run_id, "query_id": query_id, "pipeline": pipeline,
                                 "consumer_group": group, "started_at": utc(at), **values}])

    def _new_batches(self, conn: Connection, recs: list[BatchRecord],
                     txn: _Txn) -> tuple[list[BatchRecord], int]:
        """Drop batches already recorded (identical: idempotent; different: a finding)."""
        seen: dict[tuple[str, int], BatchRecord] = {}
        candidates: list[BatchRecord] = []
        duplicates = 0
        for rec in recs:
            key = (rec.batch.query_id, rec.batch.batch_id)
            if key in seen:
                duplicates += 1
                if _offset_rows(seen[key].batch) != _offset_rows(rec.batch):
                    self._conflict(rec, txn, "the same batch was reported twice with different offsets")
                continue
            seen[key] = rec
            candidates.append(rec)
        # Batches newer than the last one this recorder committed for their query cannot exist yet;
        # only the rest (re-deliveries, other writers) need a look at the table.
        suspects = [r for r in candidates
                    if r.batch.query_id not in self._latest
                    or r.batch.batch_id <= self._latest[r.batch.query_id][0]]
        if not suspects:
            return candidates, duplicates
        query_ids = sorted({r.batch.query_id for r in suspects})
        batch_ids = sorted({r.batch.batch_id for r in suspects})
        existing: dict[tuple[str, int], list[tuple[int, str, int, int | None, int]]] = {}
        rows = conn.execute(
            select(batch_offsets.c.query_id, batch_offsets.c.batch_id, batch_offsets.c.source_index,
                   batch_offsets.c.topic, batch_offsets.c.partition, batch_offsets.c.from_offset,
                   batch_offsets.c.until_offset)
            .where(batch_offsets.c.query_id.in_(query_ids), batch_offsets.c.batch_id.in_(batch_ids)))
        for r in rows:
            existing.setdefault((r.query_id, r.batch_id), []).append(
                (r.source_index, r.topic, r.partition, r.from_offset, r.until_offset))
        recorded_by_run: dict[tuple[str, int], str] = {}
        for r in conn.execute(select(batches.c.query_id, batches.c.batch_id, batches.c.run_id).where(
                batches.c.query_id.in_(query_ids), batches.c.batch_id.in_(batch_ids))):
            existing.setdefault((r.query_id, r.batch_id), [])
            recorded_by_run[(r.query_id, r.batch_id)] = r.run_id
        fresh: list[BatchRecord] = []
        for rec in candidates:
            key = (rec.batch.query_id, rec.batch.batch_id)
            if key not in existing:
                fresh.append(rec)
                continue
            duplicates += 1
            if sorted(existing[key]) != _offset_rows(rec.batch):
                self._conflict(rec, txn, "a recorded batch was reported again with different offsets")
            if recorded_by_run.get(key) not in (None, rec.batch.run_id):
                # Another run recorded this (query, batch) first: a copy of the checkpoint (same
                # query id), or a watcher beside the listener. History keeps the first row; the
                # position rules still hear this run, or a copy would hold the real run's positions back.
                txn.other_runs.append(rec)
        return fresh, duplicates

    def _conflict(self, rec: BatchRecord, txn: _Txn, message: str) -> None:
        txn.findings.append(self._finding(
            rec, txn, "other", message, None, None, None, None,
            {"offsets": [list(x) for x in _offset_rows(rec.batch)]}))

    def _write_batches(self, conn: Connection, recs: list[BatchRecord], txn: _Txn) -> list[BatchRecord]:
        self._ensure_runs(conn, recs, txn)
        batch_rows = [{"pipeline": rec.pipeline, "consumer_group": rec.consumer_group,
                       "query_id": rec.batch.query_id, "run_id": rec.batch.run_id, "batch_id": rec.batch.batch_id,
                       "batch_time": utc(rec.batch.batch_time), "recorded_at": txn.now,
                       "input_rows": rec.batch.input_rows, "source": rec.batch.recorded_by,
                       **dict(zip(_STATEFUL_COLUMNS, _stateful_values(rec.batch)))} for rec in recs]
        # RETURNING tells which batches another writer (a second listener on the same query) did not
        # already insert since we looked; only those go on to offsets, gaps and positions.
        inserted = set(self._bulk(conn, batches, batch_rows, ("query_id", "batch_id"),
                                  returning=("query_id", "batch_id")))
        if len(inserted) < len(recs):
            recs = [r for r in recs if (r.batch.query_id, r.batch.batch_id) in inserted]
        ranges = sum(len(s.ranges) for r in recs for s in r.batch.sources)
        if ranges >= _COPY_MIN_ROWS and self._execute_values is not None:
            self._copy_offsets(conn, recs)
        elif ranges:
            offset_rows = [{"pipeline": rec.pipeline, "consumer_group": rec.consumer_group,
                            "query_id": rec.batch.query_id, "batch_id": rec.batch.batch_id,
                            "source_index": s.source_index, "topic": r.topic, "partition": r.partition,
                            "from_offset": r.from_offset, "until_offset": r.until_offset,
                            "batch_time": utc(rec.batch.batch_time)}
                           for rec in recs for s in rec.batch.sources for r in s.ranges]
            self._bulk(conn, batch_offsets, offset_rows,
                       ("query_id", "batch_id", "source_index", "topic", "partition"))
        if not recs:
            return recs
        self._find_gaps(conn, recs, txn)
        self._move_positions(conn, recs, txn)
        self._update_runs(conn, recs)
        return recs

    def _ensure_runs(self, conn: Connection, recs: list[BatchRecord], txn: _Txn) -> None:
        """Know every run's start and generation (the position rules need them); make rows for unseen runs."""
        unknown = sorted({r.batch.run_id for r in recs} - set(self._runs) - set(txn.runs))
        if not unknown:
            return
        for r in conn.execute(select(runs.c.run_id, runs.c.started_at, runs.c.generation_id)
                              .where(runs.c.run_id.in_(unknown))):
            txn.runs[r.run_id] = _Run(utc(r.started_at), r.generation_id)
        missing: dict[str, dict[str, Any]] = {}
        for rec in recs:
            b = rec.batch
            if b.run_id in txn.runs or b.run_id in missing:
                continue
            # No start event (the listener came later, or lost it): no checkpoint location either.
            missing[b.run_id] = {"run_id": b.run_id, "query_id": b.query_id, "pipeline": rec.pipeline,
                                 "consumer_group": rec.consumer_group, "query_name": b.query_name,
                                 "started_at": utc(b.batch_time),
                                 "generation_id": self._assign_generation(conn, rec.pipeline, rec.consumer_group,
                                                                          b.query_id, b.run_id, None)}
        if missing:
            conn.execute(self._insert(runs).on_conflict_do_nothing(index_elements=[runs.c.run_id]),
                         list(missing.values()))
            for run_id, row in missing.items():
                txn.runs[run_id] = _Run(row["started_at"], row["generation_id"])

    def _run_of(self, run_id: str, txn: _Txn) -> _Run:
        return txn.runs.get(run_id) or self._runs[run_id]

    def _with_first_starts(self, conn: Connection, recs: list[BatchRecord], txn: _Txn) -> list[BatchRecord]:
        """Give ranges Spark reported without a start (a fresh checkpoint's first batch) the start
        the run's generation resolved, so every recorded range is a real ``[from, until)``."""
        out = []
        for rec in recs:
            b = rec.batch
            gen_id = self._run_of(b.run_id, txn).generation_id
            if gen_id is None or all(r.from_offset is not None for s in b.sources for r in s.ranges):
                out.append(rec)
                continue
            starts = self._resolved_offsets(conn, gen_id)
            sources = tuple(
                replace(s, ranges=tuple(
                    replace(r, from_offset=starts.get((r.topic, r.partition))) if r.from_offset is None else r
                    for r in s.ranges))
                for s in b.sources)
            out.append(replace(rec, batch=replace(b, sources=sources)))
        return out

    def _resolved_offsets(self, conn: Connection, generation_id: int) -> dict[tuple[str, int], int]:
        cached = self._generation_offsets.get(generation_id)
        if cached is None:
            raw = conn.execute(select(checkpoint_generations.c.resolved_offsets)
                               .where(checkpoint_generations.c.id == generation_id)).scalar() or {}
            cached = {(t, int(p)): int(o) for t, parts in raw.items() for p, o in parts.items()}
            self._generation_offsets[generation_id] = cached
        return cached

    def _latest_of(self, conn: Connection, query_id: str, txn: _Txn) -> tuple[int, _Ends] | None:
        if query_id in txn.latest:
            return txn.latest[query_id]
        if query_id in self._latest:
            return self._latest[query_id]
        found = self._batch_before(conn, query_id, None)
        if found is not None:
            txn.latest[query_id] = found
        return found

    def _batch_before(self, conn: Connection, query_id: str, batch_id: int | None) -> tuple[int, _Ends] | None:
        """The committed batch of ``query_id`` with the highest id (below ``batch_id``, if given)."""
        stmt = select(batches.c.batch_id).where(batches.c.query_id == query_id)
        if batch_id is not None:
            stmt = stmt.where(batches.c.batch_id < batch_id)
        prev = conn.execute(stmt.order_by(batches.c.batch_id.desc()).limit(1)).scalar()
        if prev is None:
            return None
        rows = conn.execute(select(batch_offsets.c.source_index, batch_offsets.c.topic,
                                   batch_offsets.c.partition, batch_offsets.c.until_offset)
                            .where(batch_offsets.c.query_id == query_id, batch_offsets.c.batch_id == prev))
        return int(prev), {(r.source_index, r.topic, r.partition): r.until_offset for r in rows}

    def _find_gaps(self, conn: Connection, recs: list[BatchRecord], txn: _Txn) -> None:
        for rec in recs:
            b = rec.batch
            latest = self._latest_of(conn, b.query_id, txn)
            if latest is None or latest[0] < b.batch_id:
                previous = latest
            else:
                # Out of order: this batch arrived after a later one of its query.
                previous = self._batch_before(conn, b.query_id, b.batch_id)
            if previous is not None:
                self._gap_findings(rec, txn, previous)
            if latest is None or latest[0] < b.batch_id:
                txn.latest[b.query_id] = (b.batch_id, _ends(b))

    def _gap_findings(self, rec: BatchRecord, txn: _Txn, previous: tuple[int, _Ends]) -> None:
        """``gap`` findings of ``rec`` against the ends of the batch before it."""
        b = rec.batch
        prev_id, prev_ends = previous
        for s, r, since, expected in _gaps(b, prev_ends):
            lost = since - expected
            txn.findings.append(self._finding(
                rec, txn, "gap",
                f"batch {b.batch_id} of {r.topic}-{r.partition} starts at {r.from_offset} "
                f"but batch {prev_id} ended at {expected}",
                r.topic, r.partition, expected, r.from_offset,
                {"previous_batch_id": prev_id, "source_index": s.source_index,
                 "skipped_records" if lost > 0 else "reread_records": abs(lost)}))

    def _move_positions(self, conn: Connection, recs: list[BatchRecord], txn: _Txn) -> None:
        groups: dict[tuple[str, str], set[str]] = {}
        for rec in recs:
            groups.setdefault((rec.pipeline, rec.consumer_group), set()).update(
                r.topic for s in rec.batch.sources for r in s.ranges)
        # Shared pipeline lock first: a reset or a restart (new generation) of these pipelines is
        # either committed before we read the generation and positions, or waits for us.
        share_pipelines(conn, groups)
        current: dict[tuple[str, str], dict[tuple[str, int], _Pos]] = {}
        generation: dict[tuple[str, str], int | None] = {}
        # One lock order for every writer: byte-wise, like Python's sorted() in the reset writer,
        # whatever the database's collation (SQLite has no "C" collation, nor row locks).
        topic_order = positions.c.topic.collate("C") if conn.dialect.name == "postgresql" else positions.c.topic
        for (pipeline, group), topics in sorted(groups.items()):
            # FOR UPDATE: a concurrent reset of these rows waits for us, and we for it.
            stmt = (select(positions.c.topic, positions.c.partition, positions.c.next_offset,
                           positions.c.updated_at, positions.c.reset_id, positions.c.query_id,
                           positions.c.batch_id, resets.c.status.label("reset_status"))
                    .select_from(positions.outerjoin(resets, resets.c.id == positions.c.reset_id))
                    .where(positions.c.pipeline == pipeline, positions.c.consumer_group == group,
                           positions.c.topic.in_(sorted(topics)))
                    .order_by(topic_order, positions.c.partition)
                    .with_for_update(of=positions))
            current[(pipeline, group)] = {
                (r.topic, r.partition): _Pos(r.next_offset, utc(r.updated_at), r.reset_id, r.query_id,
                                             r.batch_id, r.reset_status == "pending")
                for r in conn.execute(stmt)}
            generation[(pipeline, group)] = conn.execute(
                select(func.max(checkpoint_generations.c.id))
                .where(checkpoint_generations.c.pipeline == pipeline,
                       checkpoint_generations.c.consumer_group == group)).scalar()
        changed: dict[tuple[str, str], set[tuple[str, int]]] = {key: set() for key in current}
        active: dict[str, bool] = {}
        for rec in recs:
            b = rec.batch
            group_key = (rec.pipeline, rec.consumer_group)
            pos, moved = current[group_key], changed[group_key]
            run = self._run_of(b.run_id, txn)
            current_generation = generation[group_key]
            starts = _position_starts(b)
            for topic, partition, until_offset in _position_ends(b):
                key = (topic, partition)
                cur = pos.get(key)
                if (b.recorded_by is not None and cur is not None and cur.query_id == b.query_id
                        and cur.batch_id is not None and cur.batch_id > b.batch_id):
                    continue  # a hole in history filled from the checkpoint: its successors moved already
                other = cur.query_id if cur is not None and cur.query_id not in (None, b.query_id) else None
                if other is not None and current_generation is None and other not in active:
                    active[other] = self._query_active(conn, other, txn.now)
                verdict = decide(
                    None if cur is None else PositionState(cur.next_offset, cur.query_id, cur.updated_at,
                                                           cur.reset_pending),
                    until_offset, query_id=b.query_id, run_started_at=run.started_at,
                    run_generation_id=run.generation_id, current_generation_id=current_generation,
                    other_query_active=bool(other and active.get(other)), from_offset=starts.get(key))
                if verdict == "reset_overtaken":
                    assert cur is not None
                    txn.findings.append(self._kept_finding(rec, txn, verdict, cur, topic, partition, until_offset))
                if verdict in ("move", "reset_overtaken"):
                    if cur is None:
                        pos[key] = _Pos(until_offset, txn.now, None, b.query_id, b.batch_id)
                    else:
                        cur.next_offset, cur.updated_at, cur.reset_id, cur.query_id, cur.batch_id = (
                            until_offset, txn.now, None, b.query_id, b.batch_id)
                        cur.reset_pending = False
                    moved.add(key)
                elif verdict == "foreign_run":
                    assert current_generation is not None
                    self._foreign_finding(conn, rec, txn, run, current_generation)
                    break  # one finding per run and generation says it all; no partition moves
                elif verdict == "regression" and b.recorded_by is not None:
                    continue  # read back from the authoritative checkpoint: history, never a zombie
                else:
                    assert cur is not None
                    txn.findings.append(self._kept_finding(rec, txn, verdict, cur, topic, partition, until_offset))
        rows: list[dict[str, Any]] = [{"pipeline": pipeline, "consumer_group": group, "topic": key[0], "partition": key[1],
                 "next_offset": pos[key].next_offset, "updated_at": pos[key].updated_at,
                 "query_id": pos[key].query_id, "batch_id": pos[key].batch_id, "reset_id": None}
                for (pipeline, group), pos in current.items()
                for key in sorted(changed[(pipeline, group)])]
        if rows:
            self._bulk(conn, positions, rows, ("pipeline", "consumer_group", "topic", "partition"),
                       update=("next_offset", "updated_at", "query_id", "batch_id", "reset_id"))
            txn.moved.extend(MovedPosition(r["pipeline"], r["consumer_group"], r["topic"], r["partition"],
                                           r["next_offset"]) for r in rows)

    def _query_active(self, conn: Connection, query_id: str, now: datetime) -> bool:
        """Whether ``query_id`` has a run that counts as active (``ledger.activity``)."""
        rows = conn.execute(select(runs.c.started_at, runs.c.last_heartbeat_at, runs.c.terminated_at,
                                   runs.c.max_batch_ms).where(runs.c.query_id == query_id))
        return any(run_is_active(r.terminated_at, r.last_heartbeat_at, r.started_at, r.max_batch_ms, now=now)
                   for r in rows)

    def _foreign_finding(self, conn: Connection, rec: BatchRecord, txn: _Txn, run: _Run, generation_id: int) -> None:
        """One ``foreign_run`` finding per run and current generation, however many batches it reports."""
        b = rec.batch
        key = (b.run_id, generation_id)
        if key in self._foreign_reported or key in txn.foreign_reported:
            return
        txn.foreign_reported.add(key)
        if conn.execute(select(findings.c.id).where(findings.c.kind == "foreign_run", findings.c.run_id == b.run_id,
                                                    findings.c.generation_id == generation_id).limit(1)).first():
            return
        location = conn.execute(select(runs.c.checkpoint_location).where(runs.c.run_id == b.run_id)).scalar()
        current = conn.execute(select(checkpoint_generations.c.generation, checkpoint_generations.c.location)
                               .where(checkpoint_generations.c.id == generation_id)).first()
        where = f"checkpoint {location}" if location else "an unknown checkpoint"
        row = self._finding(
            rec, txn, "foreign_run",
            f"run {b.run_id} of query {b.query_id} reports batches from {where}, not from the current "
            f"checkpoint generation {current.generation if current else '?'} "
            f"({current.location if current else '?'}); its batches are history, positions are kept",
            None, None, None, None,
            {"run_id": b.run_id, "checkpoint_location": location, "run_generation_id": run.generation_id,
             "current_generation": current.generation if current else None,
             "current_location": current.location if current else None})
        row["generation_id"] = generation_id
        txn.findings.append(row)

    def _update_runs(self, conn: Connection, recs: list[BatchRecord]) -> None:
        last: dict[str, tuple[int, datetime, int | None]] = {}
        for rec in recs:
            b = rec.batch
            prev = last.get(b.run_id)
            longest = b.duration_ms if prev is None or prev[2] is None else max(prev[2], b.duration_ms or 0)
            last[b.run_id] = (max(prev[0], b.batch_id) if prev else b.batch_id,
                              max(prev[1], utc(b.batch_time)) if prev else utc(b.batch_time), longest)
        for run_id, (batch_id, at, longest) in last.items():
            values: dict[str, Any] = {"last_batch_id": batch_id, "last_heartbeat_at": at}
            if longest is not None:
                values["max_batch_ms"] = func.coalesce(
                    func.max(runs.c.max_batch_ms, longest) if conn.dialect.name == "sqlite"
                    else func.greatest(runs.c.max_batch_ms, longest), longest)
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))

    def _kept_finding(self, rec: BatchRecord, txn: _Txn, kind: str, cur: _Pos, topic: str, partition: int,
                      until_offset: int) -> dict[str, Any]:
        """The ``pending_reset``, ``shared_position`` or ``regression`` finding of a position ``rec`` did not
        move, or the ``reset_overtaken`` finding of one it moved past a pending reset."""
        b = rec.batch
        if kind == "reset_overtaken":
            return self._finding(
                rec, txn, kind,
                f"batch {b.batch_id} of query {b.query_id} moved {topic}-{partition} from {cur.next_offset}, "
                f"where pending reset {cur.reset_id} put it, to {until_offset} without starting there (a run "
                f"on the old checkpoint?); the reset stays pending until start_from_ledger applies it",
                topic, partition, cur.next_offset, until_offset,
                {"position_reset_id": cur.reset_id, "run_id": b.run_id})
        if kind == "pending_reset":
            return self._finding(
                rec, txn, kind,
                f"batch {b.batch_id} of query {b.query_id} ended {topic}-{partition} at {until_offset}, "
                f"but reset {cur.reset_id} is pending at {cur.next_offset}; position kept",
                topic, partition, cur.next_offset, until_offset,
                {"position_reset_id": cur.reset_id, "run_id": b.run_id})
        if kind == "shared_position":
            return self._finding(
                rec, txn, kind,
                f"batch {b.batch_id} of query {b.query_id} ended {topic}-{partition} at {until_offset}, but "
                f"query {cur.query_id}, still active, records the same partition of this pipeline; position "
                f"kept at {cur.next_offset} (give each query its own pipeline: pipeline= may map query names)",
                topic, partition, cur.next_offset, until_offset,
                {"position_query_id": cur.query_id, "position_batch_id": cur.batch_id, "run_id": b.run_id})
        return self._finding(
            rec, txn, kind,
            f"batch {b.batch_id} of query {b.query_id} ended {topic}-{partition} at {until_offset}, "
            f"behind the current position {cur.next_offset}; position kept",
            topic, partition, cur.next_offset, until_offset,
            {"position_query_id": cur.query_id, "position_batch_id": cur.batch_id,
             "position_reset_id": cur.reset_id, "run_id": b.run_id})

    def _finding(self, rec: BatchRecord, txn: _Txn, kind: str, message: str, topic: str | None,
                 partition: int | None, expected: int | None, actual: int | None,
                 details: dict[str, Any]) -> dict[str, Any]:
        return {"pipeline": rec.pipeline, "consumer_group": rec.consumer_group, "kind": kind,
                "topic": topic, "partition": partition, "query_id": rec.batch.query_id,
                "batch_id": rec.batch.batch_id, "expected_offset": expected, "actual_offset": actual,
                "message": message, "details": details, "created_at": txn.now, "run_id": rec.batch.run_id,
                "generation_id": None}
