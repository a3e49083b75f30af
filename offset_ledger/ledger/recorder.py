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

On PostgreSQL with psycopg2, plain batches of one run (one per call from a listener that keeps
up, several from one that fell behind) take one round trip: a prepared statement that writes them
all inside its own BEGIN ... COMMIT, and aborts itself, leaving nothing, when a rule would have to
explain something (then the general path below records the batches and their findings):
``offset_ledger.ledger.fast_batch``. The general path (``GeneralPath``, here) keeps its rules for
runs and generations in a ``run_book.RunBook``, those for positions and findings in a
``position_rules.PositionRules``: collaborators given exactly what they use (the dialect's INSERT,
the bulk writer, the recorder's committed knowledge ``records.Known``). A writer that joins its own
transaction (a transactional sink) records through ``record_in_transaction``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.errors import LedgerError
from offset_ledger.ledger.bulk_write import BulkWriter, compact_ranges
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.fast_batch import FastBatchPath
from offset_ledger.ledger.finding_store import store_findings
from offset_ledger.ledger.locks import lock_pipelines
from offset_ledger.ledger.position_rules import PositionRules
from offset_ledger.ledger.records import (
    STATEFUL_COLUMNS,
    BatchRecord,
    Known,
    Record,
    RecordOutcome,
    RunEnd,
    RunHeartbeat,
    RunStart,
    Transaction,
    finding_row,
    offset_rows,
    stateful_values,
    utc,
)
from offset_ledger.ledger.run_book import RunBook
from offset_ledger.ledger.tables import batch_offsets, batches, findings, listener_health, offset_ranges, runs
from offset_ledger.rules.model import Finding
from offset_ledger.rules.read_shortfall import read_shortfalls

log = logging.getLogger(__name__)


def translate(exc: Exception) -> LedgerError:
    """A driver error as LedgerUnavailable (retriable: connection lost or refused) or LedgerError."""
    return translate_db_error(exc, "writing")


def record_in_transaction(conn: Connection, records: Sequence[Record], *, now: datetime) -> RecordOutcome:
    """Write ``records`` by the general path's rules on ``conn``, inside the caller's transaction.

    For a writer that commits its own rows with the batch (``ledger.sink_store.record_commit``):
    nothing is cached, since the caller owns COMMIT (a rollback must leave no knowledge behind).
    """
    return GeneralPath(conn.dialect, Known()).record(conn, records, Transaction(now=utc(now)))


class Recorder:
    """Writes listener events to the ledger; not thread-safe (one writer thread owns it)."""

    def __init__(self, engine: Engine, *, owns_engine: bool = False) -> None:
        self.engine = engine
        self._owns_engine = owns_engine
        # Committed knowledge that saves a SELECT per transaction on the hot path.
        self._known = Known()
        self._general = GeneralPath(engine.dialect, self._known)
        # The one-statement path for an isolated batch needs Postgres and the raw psycopg2 cursor.
        self._fast = (FastBatchPath(engine.dialect.dbapi, self._known)
                      if engine.dialect.name == "postgresql" and engine.dialect.driver == "psycopg2" else None)
        self._conn: Connection | None = None

    # ------------------------------------------------------------------ public

    def record(self, records: Sequence[Record], *, now: datetime | None = None) -> RecordOutcome:
        """Write ``records`` in one transaction; raises LedgerUnavailable / LedgerError."""
        txn = Transaction(now=utc(now or datetime.now(timezone.utc)))
        dbapi = self.engine.dialect.dbapi
        try:
            # One connection held across transactions: no pool checkout (and pre-ping round trip)
            # per batch. Any failure drops it; the next call checks a fresh one out of the pool.
            if self._conn is None or self._conn.closed or self._conn.invalidated:
                self._conn = self.engine.connect()
            conn = self._conn
            try:
                outcome = None
                fast = self._fast.batches(records) if self._fast is not None else None
                if fast is not None:
                    assert self._fast is not None
                    try:
                        outcome = self._fast.record(conn, fast, txn)
                    except dbapi.Error as exc:  # type: ignore[union-attr]
                        raise self._raw_error(conn, exc) from exc
                if outcome is None:
                    with conn.begin():
                        try:
                            outcome = self._general.record(conn, records, txn)
                        except dbapi.Error as exc:  # type: ignore[union-attr]
                            raise self._raw_error(conn, exc) from exc
            except BaseException as exc:
                # After a transient error the session itself may be the problem (a read-only one
                # after a failover keeps its setting): never hand it back to the pool.
                self._drop_connection(invalidate=isinstance(exc, Exception) and translate(exc).retriable)
                raise
        except SQLAlchemyError as exc:
            raise translate(exc) from exc
        self._known.fold(txn, records)
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
        stmt = self._general.insert(listener_health)
        stmt = stmt.on_conflict_do_update(
            index_elements=[listener_health.c.listener_id],
            set_={k: stmt.excluded[k] for k in row if k != "listener_id"})
        try:
            # On the connection record() holds (the same writer thread calls both): a second one
            # would stay in the pool, two server connections per listener for the process's life.
            if self._conn is None or self._conn.closed or self._conn.invalidated:
                self._conn = self.engine.connect()
            try:
                with self._conn.begin():
                    self._conn.execute(stmt, [row])
            except BaseException as exc:
                self._drop_connection(invalidate=isinstance(exc, Exception) and translate(exc).retriable)
                raise
        except SQLAlchemyError as exc:
            raise translate(exc) from exc


class GeneralPath:
    """Records any mix of events by every rule, on a connection inside its caller's transaction.

    ``known`` is what committed transactions taught (read here, folded by the caller after COMMIT).
    """

    def __init__(self, dialect: Dialect, known: Known) -> None:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        elif dialect.name == "sqlite":
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        else:
            raise LedgerError(f"unsupported ledger database {dialect.name!r} (use PostgreSQL or SQLite)")
        execute_values: Any = None
        if dialect.driver == "psycopg2":
            from psycopg2.extras import execute_values  # type: ignore[import-untyped,no-redef]
        self.insert: Any = insert
        self.bulk = BulkWriter(insert, execute_values)
        self.known = known
        self.run_book = RunBook(insert, known)
        self.positions = PositionRules(self.bulk, known)

    def record(self, conn: Connection, records: Sequence[Record], txn: Transaction) -> RecordOutcome:
        recs = [r for r in records if isinstance(r, BatchRecord)]
        if recs:
            # The pipeline lock, exclusively, before any row (the run records' too): the
            # one-statement path holds it while it inserts its batches and updates its run
            # (fast_batch), so a transaction that inserted the same batch or touched the run first
            # and only then waited for the lock would deadlock with it. Exclusive, not shared: the
            # gap check (position_rules.find_gaps) reads the batch before each one written here,
            # and must see every batch of the query another writer has inserted by then, i.e.
            # committed ones only. (move_positions takes it shared again: held already.)
            lock_pipelines(conn, {(r.pipeline, r.consumer_group) for r in recs})
        for rec in records:
            if isinstance(rec, RunStart):
                self.run_book.run_start(conn, rec, txn)
            elif isinstance(rec, RunHeartbeat):
                values: dict[str, Any] = {"last_heartbeat_at": utc(rec.at)}
                plain = dict(values, max_gap_ms=rec.max_gap_ms)
                if rec.max_gap_ms is not None:  # the listener saw a longer silence: widens the run's bound
                    values["max_gap_ms"] = func.coalesce(
                        func.max(runs.c.max_gap_ms, rec.max_gap_ms) if conn.dialect.name == "sqlite"
                        else func.greatest(runs.c.max_gap_ms, rec.max_gap_ms), rec.max_gap_ms)
                self.run_book.touch_run(conn, rec.pipeline, rec.consumer_group, rec.query_id, rec.run_id, rec.at, values,
                                plain)
            elif isinstance(rec, RunEnd):
                self.run_book.touch_run(conn, rec.pipeline, rec.consumer_group, rec.query_id, rec.run_id,
                                rec.at, {"terminated_at": utc(rec.at), "exception": rec.exception})
                self.run_book.end_query_runs(conn, rec.query_id, rec.run_id, rec.at)
        if recs:
            self.run_book.ensure_runs(conn, recs, txn)
            recs = self.run_book.with_first_starts(conn, recs, txn)
        new, duplicates = self._new_batches(conn, recs, txn)
        if new:
            written = self._write_batches(conn, new, txn)
            if len(written) < len(new):
                # Another writer of the query recorded one of them, past what this recorder last
                # saw of it (a sink, a second listener): judged like any recorded batch, never a
                # silent duplicate. (The exclusive pipeline lock held: its row is committed, visible.)
                kept = {id(r) for r in written}
                self._against_recorded(conn, [r for r in new if id(r) not in kept], txn)
            duplicates += len(new) - len(written)
            new = written
        if duplicates:
            kept = {id(r) for r in new}
            self.run_book.hear_duplicates(conn, [r for r in recs if id(r) not in kept])
        if txn.other_runs:
            self.positions.move_positions(conn, txn.other_runs, txn)
        # A sink or watcher may have recorded the batch first (rows not counted): the listener's
        # report of it (another run) still brings Spark's row counts.
        self._shortfall_findings(conn, new, txn.other_runs, txn)
        return self._outcome(conn, txn, len(new), duplicates)

    def _shortfall_findings(self, conn: Connection, new: Sequence[BatchRecord], others: Sequence[BatchRecord],
                            txn: Transaction) -> None:
        """A ``data_loss`` finding per source that read fewer rows than it spanned (``rules.read_shortfall``).

        ``others``: batches another run recorded first; one the listener already reported (a spool
        replay after a sink recorded it) has its finding, and gets no second one. A run's first batch
        that read nothing at all did not read its DataFrame: Spark re-ran the batch a crash left
        uncommitted and the job skipped it as done (the transactional sinks do, as does any
        idempotent ``foreachBatch``); no finding. Nothing at all: the batch total, not the Kafka
        source's count, is 0 (a ``rate`` source's rows read beside it say the DataFrame was read).
        A source whose rows nobody counted is a ``rows_unknown`` finding (``rules.read_shortfall``)."""
        firsts: dict[str, int] = {}
        for rec in [*new, *others]:
            b = rec.batch
            firsts[b.run_id] = min(firsts.get(b.run_id, b.batch_id), b.batch_id)
        shorts = [(rec, s) for rec in [*new, *others] for s in read_shortfalls(rec.batch)
                  if not (rec.batch.input_rows == 0 and rec.batch.run_id not in self.known.runs_batched
                          and firsts[rec.batch.run_id] == rec.batch.batch_id)]
        if not shorts:
            return
        known: set[tuple[str, int]] = set()
        if others:
            keys = {(rec.batch.query_id, rec.batch.batch_id) for rec in others}
            known = {(r.query_id, r.batch_id) for r in conn.execute(
                select(findings.c.query_id, findings.c.batch_id).where(
                    findings.c.kind == "data_loss", findings.c.query_id.in_(sorted({k[0] for k in keys})),
                    findings.c.batch_id.in_(sorted({k[1] for k in keys}))))}
        for rec, short in shorts:
            if (rec.batch.query_id, rec.batch.batch_id) in known:
                continue
            one = short.partition_range
            topics = {r.topic for r in short.ranges}
            # No expected/actual offsets: verify must not take it for a restart's clamp (a skip).
            txn.findings.append(finding_row(
                rec, txn, "data_loss", short.message(rec.batch.batch_id),
                topics.pop() if len(topics) == 1 else None, one.partition if one is not None else None,
                None, None, short.details()))

    def _outcome(self, conn: Connection, txn: Transaction, written: int, duplicates: int) -> RecordOutcome:
        """Write the transaction's findings and say what it did."""
        if txn.findings:
            store_findings(conn, self.insert, txn.findings)
        found = tuple(
            Finding(f["kind"], f["message"], f["topic"], f["partition"], f["details"]) for f in txn.findings)
        return RecordOutcome(written, duplicates, found, tuple(txn.moved))

    def _new_batches(self, conn: Connection, recs: list[BatchRecord],
                     txn: Transaction) -> tuple[list[BatchRecord], int]:
        """Drop batches already recorded (identical: idempotent; different: a finding)."""
        seen: dict[tuple[str, int], BatchRecord] = {}
        candidates: list[BatchRecord] = []
        duplicates = 0
        for rec in recs:
            key = (rec.batch.query_id, rec.batch.batch_id)
            if key in seen:
                duplicates += 1
                if offset_rows(seen[key].batch) != offset_rows(rec.batch):
                    self._conflict(rec, txn, "the same batch was reported twice with different offsets")
                continue
            seen[key] = rec
            candidates.append(rec)
        # Batches newer than the last one this recorder committed for their query are not looked up
        # before the write (the steady state: nobody else wrote them); if another writer of the query
        # did, the write skips them and ``record`` judges them after it (``_against_recorded``).
        suspects = [r for r in candidates
                    if r.batch.query_id not in self.known.latest
                    or r.batch.batch_id <= self.known.latest[r.batch.query_id][0]]
        if not suspects:
            return candidates, duplicates
        recorded = self._against_recorded(conn, suspects, txn)
        fresh = [r for r in candidates if (r.batch.query_id, r.batch.batch_id) not in recorded]
        return fresh, duplicates + len(candidates) - len(fresh)

    def _against_recorded(self, conn: Connection, recs: list[BatchRecord],
                          txn: Transaction) -> set[tuple[str, int]]:
        """The (query, batch) keys of ``recs`` the ledger holds already, each judged against its row:
        different offsets are an ``other`` finding, another run's row makes the batch one the
        position rules still hear (``txn.other_runs``)."""
        query_ids = sorted({r.batch.query_id for r in recs})
        batch_ids = sorted({r.batch.batch_id for r in recs})
        existing: dict[tuple[str, int], list[tuple[int, str, int, int | None, int]]] = {}
        # The batches first, their ranges after: a batch another writer commits between the two
        # reads then shows its ranges too (they commit together), never a batch row without them
        # (which would read as the same batch with different offsets).
        recorded_by_run: dict[tuple[str, int], str] = {}
        for r in conn.execute(select(batches.c.query_id, batches.c.batch_id, batches.c.run_id).where(
                batches.c.query_id.in_(query_ids), batches.c.batch_id.in_(batch_ids))):
            existing.setdefault((r.query_id, r.batch_id), [])
            recorded_by_run[(r.query_id, r.batch_id)] = r.run_id
        rows = conn.execute(
            select(batch_offsets.c.query_id, batch_offsets.c.batch_id, batch_offsets.c.source_index,
                   batch_offsets.c.topic, batch_offsets.c.partition, batch_offsets.c.from_offset,
                   batch_offsets.c.until_offset)
            .where(batch_offsets.c.query_id.in_(query_ids), batch_offsets.c.batch_id.in_(batch_ids)))
        for r in rows:
            existing.setdefault((r.query_id, r.batch_id), []).append(
                (r.source_index, r.topic, r.partition, r.from_offset, r.until_offset))
        recorded: set[tuple[str, int]] = set()
        for rec in recs:
            key = (rec.batch.query_id, rec.batch.batch_id)
            if key not in existing:
                continue
            recorded.add(key)
            if sorted(existing[key]) != offset_rows(rec.batch):
                self._conflict(rec, txn, "a recorded batch was reported again with different offsets")
            if recorded_by_run.get(key) not in (None, rec.batch.run_id):
                # Another run recorded this (query, batch) first: a copy of the checkpoint (same
                # query id), or a watcher beside the listener. History keeps the first row; the
                # position rules still hear this run, or a copy would hold the real run's positions back.
                txn.other_runs.append(rec)
        return recorded

    def _conflict(self, rec: BatchRecord, txn: Transaction, message: str) -> None:
        txn.findings.append(finding_row(
            rec, txn, "other", message, None, None, None, None,
            {"offsets": [list(x) for x in offset_rows(rec.batch)]}))

    def _write_batches(self, conn: Connection, recs: list[BatchRecord], txn: Transaction) -> list[BatchRecord]:
        self.run_book.ensure_runs(conn, recs, txn)
        batch_rows = [{"pipeline": rec.pipeline, "consumer_group": rec.consumer_group,
                       "query_id": rec.batch.query_id, "run_id": rec.batch.run_id, "batch_id": rec.batch.batch_id,
                       "batch_time": utc(rec.batch.batch_time), "recorded_at": txn.now,
                       "input_rows": rec.batch.input_rows, "source": rec.batch.recorded_by,
                       **dict(zip(STATEFUL_COLUMNS, stateful_values(rec.batch)))} for rec in recs]
        # RETURNING tells which batches another writer (a second listener on the same query) did not
        # already insert since we looked; only those go on to offsets, gaps and positions.
        inserted = {(q, b): pk for q, b, pk in self.bulk.upsert(conn, batches, batch_rows, ("query_id", "batch_id"),
                                                          returning=("query_id", "batch_id", "id"))}
        if len(inserted) < len(recs):
            recs = [r for r in recs if (r.batch.query_id, r.batch.batch_id) in inserted]
        ranges = compact_ranges(recs, inserted, literal=self.bulk.execute_values is not None)
        if ranges:
            self.bulk.upsert(conn, offset_ranges, ranges, ("batch_pk", "source_index", "topic"))
        if not recs:
            return recs
        self.positions.find_gaps(conn, recs, txn)
        self.positions.move_positions(conn, recs, txn)
        self.positions.update_runs(conn, recs)
        return recs
