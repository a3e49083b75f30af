"""The Postgres sink: a ``foreachBatch`` function whose output and ledger record commit as one.

Commit order for batch ``n`` of checkpoint generation ``g`` (``docs/sinks.md`` draws it)::

    Spark: offsets/n written -> foreachBatch(df, n):
      1. read offsets/n (and n-1) from the checkpoint: the batch's Kafka ranges
      2. already committed (g, n)? -> skip (a re-run after a crash); g not current -> SinkFenced;
         records this sink already holds (``sinks.held``: the restart that opened g planned it to
         skip them) are dropped from the batch, all of it when it holds all of it
      3. executors write the rows into this attempt's staging table (COPY or Spark's JDBC writer)
      4. one driver transaction: lock pipeline + sink row, decide again, INSERT INTO target
         SELECT the staged rows, delete them, record sink_batches (g, n -> sequence) and the
         batch and its positions, COMMIT
    Spark: commits/n written

A crash before 4 commits nothing (the orphan staging table is dropped by the next commit); a crash
after 4 and before ``commits/n`` re-runs batch ``n``, which step 2 skips. A clean-checkpoint restart
plans from the positions step 4 wrote, so output, ledger and offsets never disagree.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.addresses import LedgerAddress
from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.capture.reconcile import batch_records
from offset_ledger.config import settings
from offset_ledger.errors import ConfigError, SinkFenced
from offset_ledger.ledger import reconcile_store, sink_store, sink_target
from offset_ledger.ledger.engine import engine_for, ensure_schema, translate_db_error
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.rules.model import Finding
from offset_ledger.rules.sink_ahead import BatchHolding, SinkCommitRange, late_commit
from offset_ledger.rules.sink_batch import batch_doc, batch_from_doc, running_batch
from offset_ledger.rules.sink_identity import SinkDecision, decide
from offset_ledger.sinks import held as held_records
from offset_ledger.sinks.staging import StageMode, Staging

log = logging.getLogger(__name__)

#: The ``batches.source`` and run id prefix of batches a sink recorded.
SINK_SOURCE = "sink"

_ENGINES: dict[str, Engine] = {}
_ENGINES_LOCK = threading.Lock()


def sink_engine(dsn: str, *, ledger: bool = True) -> Engine:
    """One engine per DSN per process: the sink object itself holds only strings (it is pickled)."""
    with _ENGINES_LOCK:
        if dsn not in _ENGINES:
            engine = engine_for(LedgerAddress(dsn))  # the DSN the sink's constructor resolved
            if ledger:
                ensure_schema(engine)
            _ENGINES[dsn] = engine
        return _ENGINES[dsn]


def _where(dsn: str) -> str:
    """A target database as the ledger names it: host:port/dbname, never the credentials."""
    from sqlalchemy.engine import make_url

    url = make_url(dsn)
    return f"{url.host or 'localhost'}:{url.port or 5432}/{url.database or ''}"


def replace_location(sink: PostgresSink, checkpoint_location: str) -> PostgresSink:
    import copy

    bound = copy.copy(sink)
    bound.checkpoint_location = checkpoint_location
    return bound


def sink_run_id(query_id: str) -> str:
    """The run id under which a sink records a query's batches."""
    return f"{SINK_SOURCE}:{query_id}"


class PostgresSink:
    """``foreachBatch(PostgresSink(...))``: exactly-once output to a Postgres table.

    ``table``: the target (``schema.name`` or ``name``), created by the user; the batch's columns
    must exist in it. ``checkpoint_location``: the query's checkpoint, ``plan.checkpoint_location``
    of ``start_from_ledger`` (a generation the ledger handed out: that is the batch identity); it
    may be given later with ``bind``. ``dsn``: the ledger (default ``OFFSET_LEDGER_DSN``).
    ``target_dsn``: the target's database when it is not the ledger's; the commit is then atomic
    in the target (rows + sequence + the batch's record) and the ledger follows, reconciled on
    restart: pass the sink to ``start_from_ledger(..., sinks=[sink])``. ``name``: the sink's name
    in the ledger (default ``<pipeline>:<table>``). ``stage``: how the executors stage the batch,
    ``"copy"`` (Python workers, psycopg2 COPY; psycopg2 where the executors run) or ``"jdbc"``
    (Spark's JDBC writer; PostgreSQL's JDBC driver on Spark's classpath).
    """

    kind = "postgres"

    def __init__(self, *, table: str, pipeline: str, checkpoint_location: str | None = None,
                 consumer_group: str | None = None, dsn: str | None = None, target_dsn: str | None = None,
                 name: str | None = None, storage_options: dict[str, Any] | None = None,
                 stage: StageMode = "copy") -> None:
        if not table or not table.strip():
            raise ConfigError("the Postgres sink needs a target table")
        if dsn is None:
            dsn = settings().dsn
        if not dsn or not dsn.startswith("postgresql"):
            raise ConfigError("the Postgres sink needs a postgresql:// ledger DSN (dsn or OFFSET_LEDGER_DSN)")
        if target_dsn is not None and not target_dsn.startswith("postgresql"):
            raise ConfigError("the Postgres sink's target_dsn must be a postgresql:// DSN")
        self.table = table.strip()
        self.checkpoint_location = checkpoint_location
        self.pipeline = pipeline
        self.consumer_group = consumer_group or pipeline
        self.dsn = dsn
        self.target_dsn = target_dsn if target_dsn and target_dsn != dsn else None
        self.name = name or f"{pipeline}:{self.table}"
        self.storage_options = storage_options
        if stage not in ("copy", "jdbc"):
            raise ConfigError(f"unknown stage {stage!r}: use 'copy' or 'jdbc'")
        self.stage = stage
        #: Set by each call: what the last batch did (commit / skip), for tests and logs.
        self.last: SinkDecision | None = None
        self.last_timings: dict[str, float] = {}

    @property
    def spec(self) -> sink_store.SinkSpec:
        where = None if self.target_dsn is None else _where(self.target_dsn)
        return sink_store.SinkSpec(self.name, self.pipeline, self.consumer_group, self.kind, self.table, where)

    def bind(self, checkpoint_location: str) -> PostgresSink:
        """This sink on the query's checkpoint (``plan.checkpoint_location``)."""
        return replace_location(self, checkpoint_location)

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write(df, int(batch_id))

    # ------------------------------------------------------------------ the batch

    def write(self, df: Any, batch_id: int) -> SinkDecision:
        """Stage ``df`` on the executors and commit it with its ledger record (or skip / fence it)."""
        if not self.checkpoint_location:
            raise ConfigError(f"sink {self.name!r} has no checkpoint location: bind(plan.checkpoint_location)")
        started = time.perf_counter()
        ledger = sink_engine(self.dsn)
        check_target(ledger, self.spec, register=True)  # before anything is written anywhere
        target = ledger if self.target_dsn is None else sink_engine(self.target_dsn, ledger=False)
        files = checkpoint_files(self.checkpoint_location, self.storage_options)
        query_id, batch = running_batch(self.checkpoint_location, files, batch_id)
        columns = list(df.columns)
        try:
            generation_id, current, committed = self._read_ledger(ledger, batch_id, query_id)
            held = self._held(ledger, generation_id, query_id, batch)
            with target.connect() as conn:
                if self.target_dsn is not None:
                    sink_target.ensure_tables(conn)
                    committed = committed or sink_target.committed_sequence(conn, self.name, generation_id, batch_id)
                early = decide(sink_store.SinkState(), generation_id=generation_id, batch_id=batch_id,
                               current_generation_id=current, committed_sequence=committed)
                if early.verdict == "commit":
                    why = held_records.refusal(self.name, held, columns)
                    if why is not None:  # before anything is staged
                        early = SinkDecision("fenced", None, why)
                staging = Staging(self.table, self.name)
                # None: the sink holds the whole batch (a restart planned it to skip it): nothing to stage
                stage_table = None if held.whole else staging.name(generation_id, batch_id, uuid.uuid4().hex[:8])
                if early.verdict == "commit" and stage_table is not None:
                    staging.create(conn, stage_table, columns)
                conn.commit()
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, "preparing the sink") from exc
        if early.verdict != "commit":
            if early.verdict == "skip" and self.target_dsn is not None:
                self._tell_ledger(ledger, early, generation_id, query_id, batch, None)
            return self._done(early, batch_id, generation_id)
        prepared = time.perf_counter()
        if stage_table is not None:
            staging.write(held_records.without_held(df, held), stage_table, columns, self.stage,
                          self.target_dsn or self.dsn)
        staged = time.perf_counter()
        if self.target_dsn is None:
            decision = self._commit_here(ledger, staging, stage_table, columns, generation_id, query_id, batch)
        else:
            decision, rows = self._commit_remote(ledger, target, staging, stage_table, columns, generation_id,
                                                 query_id, batch)
            if decision.verdict != "fenced":
                self._tell_ledger(ledger, decision, generation_id, query_id, batch, rows)
        done = time.perf_counter()
        # Where a batch's time goes (the benchmark prints it): before the executors, their staging
        # write (reading the batch from Kafka included), the commit on the driver.
        self.last_timings = {"prepare_ms": (prepared - started) * 1000, "stage_ms": (staged - prepared) * 1000,
                             "commit_ms": (done - staged) * 1000}
        log.debug("sink %s batch %d: %s", self.name, batch_id, self.last_timings)
        return self._done(decision, batch_id, generation_id)

    def _held(self, ledger: Engine, generation_id: int, query_id: str, batch: Any) -> BatchHolding:
        """What this sink already holds of the batch (``sinks.held``: a restart planned it to skip them)."""
        with ledger.connect() as conn:
            records = self._records(None, query_id, batch, datetime.now(timezone.utc))
            return held_records.holding(conn, self.name, generation_id, records)

    def _read_ledger(self, ledger: Engine, batch_id: int, query_id: str) -> tuple[int, int | None, int | None]:
        """(the checkpoint's generation id, the pipeline's current one, the sequence if committed)."""
        with ledger.begin() as conn:  # begin: a checkpoint re-created in place records its incarnation
            generation_id = self._generation(conn, query_id)
            return (generation_id, sink_store.current_generation_id(conn, self.pipeline, self.consumer_group),
                    sink_store.committed_sequence(conn, self.name, generation_id, batch_id))

    def _commit_here(self, engine: Engine, staging: Staging, stage_table: str | None, columns: list[str],
                     generation_id: int, query_id: str, batch: Any) -> SinkDecision:
        """Target and ledger in one database: rows, sink row, batch and positions in one transaction."""
        now = datetime.now(timezone.utc)
        try:
            with engine.begin() as conn:
                state = sink_store.lock_sink(conn, self.spec, now)
                decision = decide(state, generation_id=generation_id, batch_id=batch.batch_id,
                                  current_generation_id=sink_store.current_generation_id(
                                      conn, self.pipeline, self.consumer_group),
                                  committed_sequence=sink_store.committed_sequence(
                                      conn, self.name, generation_id, batch.batch_id))
                if decision.verdict == "commit":
                    assert decision.sequence is not None
                    rows = 0 if stage_table is None else self._move(conn, staging, stage_table, columns)
                    sink_store.record_commit(
                        conn, self.spec, sink_store.SinkCommit(decision.sequence, generation_id, query_id,
                                                               batch.batch_id, row_count=rows),
                        committed_at=now, now=now, records=self._records(conn, query_id, batch, now))
                if decision.verdict != "fenced":  # a zombie never touches the live generation's staged rows
                    staging.clean(conn, generation_id, batch.batch_id)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"committing batch {batch.batch_id} to {self.table}") from exc
        return decision

    def _commit_remote(self, ledger: Engine, target: Engine, staging: Staging, stage_table: str | None,
                       columns: list[str], generation_id: int, query_id: str,
                       batch: Any) -> tuple[SinkDecision, int | None]:
        """Target elsewhere: rows, sequence and the batch's record in one target transaction."""
        now = datetime.now(timezone.utc)
        try:
            # Read just before: a restart that opens a newer generation after this read is the
            # documented window of the two-database mode (docs/sinks.md).
            _, current, _ = self._read_ledger(ledger, batch.batch_id, query_id)
            known, ahead = self._older_commits(ledger)
            with target.begin() as conn:
                state = sink_target.lock(conn, self.name)
                decision = decide(state, generation_id=generation_id, batch_id=batch.batch_id,
                                  current_generation_id=current, committed_sequence=sink_target.committed_sequence(
                                      conn, self.name, generation_id, batch.batch_id))
                if decision.verdict == "commit":
                    # A zombie's commit that landed after this generation opened, known to the ledger or
                    # only to the target's log (it died before telling the ledger): rules.sink_ahead.
                    why = late_commit([*ahead, *self._unrecorded_ahead(
                        ledger, sink_target.commits_after(conn, self.name, known))], self.name)
                    if why is not None:
                        decision = SinkDecision("fenced", None, why)
                        if stage_table is not None:
                            staging.drop(conn, stage_table)  # this batch's own staged rows: nothing is left
                rows = None
                if decision.verdict == "commit":
                    assert decision.sequence is not None
                    rows = 0 if stage_table is None else self._move(conn, staging, stage_table, columns)
                    records = self._records(None, query_id, batch, now)
                    doc = batch_doc(records[-1].batch, self.checkpoint_location or "") if records else {
                        "query_id": query_id, "batch_id": batch.batch_id, "sources": []}
                    sink_target.record(conn, self.name, sequence=decision.sequence, generation_id=generation_id,
                                      query_id=query_id, batch_id=batch.batch_id, row_count=rows, batch=doc,
                                      committed_at=now)
                if decision.verdict != "fenced":
                    staging.clean(conn, generation_id, batch.batch_id)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"committing batch {batch.batch_id} to {self.table}") from exc
        return decision, rows

    def _older_commits(self, ledger: Engine) -> tuple[int, list[SinkCommitRange]]:
        """(the highest sequence of this sink the ledger holds, the ledger's commits of older generations
        past the positions): read before the target's log, so a commit the ledger learns in between is in
        the target's log above that sequence."""
        with ledger.connect() as conn:
            known = sink_store.last_sequence(conn, self.name)
            return known, sink_store.older_commits_ahead(conn, self.pipeline, self.consumer_group)[0]

    def _unrecorded_ahead(self, ledger: Engine, commits: list[Any]) -> list[SinkCommitRange]:
        if not commits:
            return []
        with ledger.connect() as conn:
            return sink_store.unrecorded_commits_ahead(conn, self.pipeline, self.consumer_group, self.name, commits)

    def _tell_ledger(self, ledger: Engine, decision: SinkDecision, generation_id: int, query_id: str, batch: Any,
                     rows: int | None) -> None:
        """Record a batch the remote target committed in the ledger (idempotent: reconcile may race it)."""
        now = datetime.now(timezone.utc)
        try:
            with ledger.begin() as conn:
                sink_store.lock_sink(conn, self.spec, now)
                if sink_store.committed_sequence(conn, self.name, generation_id, batch.batch_id) is not None:
                    return
                assert decision.sequence is not None
                sink_store.record_commit(
                    conn, self.spec, sink_store.SinkCommit(decision.sequence, generation_id, query_id,
                                                           batch.batch_id, row_count=rows),
                    committed_at=now, now=now, records=self._records(conn, query_id, batch, now))
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"recording batch {batch.batch_id} of {self.name} in the ledger") from exc

    def reconcile(self, ledger: Engine) -> tuple[Finding, ...]:
        """Record in the ledger what the remote target committed and the ledger lacks (before a restart plans)."""
        check_target(ledger, self.spec, register=False)  # another target's log is not this sink's
        if self.target_dsn is None:
            return ()
        target = sink_engine(self.target_dsn, ledger=False)
        try:
            with ledger.connect() as conn:
                known = sink_store.last_sequence(conn, self.name)
            with target.connect() as conn:
                missing = sink_target.commits_after(conn, self.name, known)
            for row in missing:
                doc = row.batch if isinstance(row.batch, dict) else json.loads(row.batch)
                with ledger.begin() as conn:
                    sink_store.lock_sink(conn, self.spec, row.committed_at)
                    if sink_store.committed_sequence(conn, self.name, row.generation_id, row.batch_id) is not None:
                        continue
                    records: list[Any] = []
                    if doc.get("sources"):
                        run_id = sink_run_id(row.query_id)
                        records = [BatchRecord(self.pipeline, self.consumer_group,
                                               batch_from_doc(doc, run_id, SINK_SOURCE))]
                        if not reconcile_store.run_recorded(conn, run_id):
                            records.insert(0, RunStart(self.pipeline, self.consumer_group, row.query_id, run_id, None,
                                                       row.committed_at,
                                                       checkpoint_location=doc.get("checkpoint_location")))
                    sink_store.record_commit(
                        conn, self.spec, sink_store.SinkCommit(int(row.sequence), int(row.generation_id),
                                                               row.query_id, int(row.batch_id),
                                                               row_count=row.row_count),
                        committed_at=row.committed_at, now=datetime.now(timezone.utc), records=records)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"reconciling sink {self.name} with its target") from exc
        if not missing:
            return ()
        seqs = [int(r.sequence) for r in missing]
        return (Finding("sink_reconciled",
                        f"the ledger lacked {len(seqs)} batch(es) sink {self.name!r} had committed to {self.table} "
                        f"(sequences {seqs[0]}-{seqs[-1]}): recorded from the target's commit log",
                        details={"sink": self.name, "sequences": seqs}),)

    def _done(self, decision: SinkDecision, batch_id: int, generation_id: int) -> SinkDecision:
        self.last = decision
        if decision.verdict == "fenced":
            raise SinkFenced(f"sink {self.name!r}: {decision.reason}", sink=self.name, batch_id=batch_id,
                             generation_id=generation_id)
        if decision.verdict == "skip":
            log.warning("offset-ledger sink %s: %s; skipped", self.name, decision.reason)
        return decision

    def _generation(self, conn: Connection, query_id: str) -> int:
        generation_id = sink_store.generation_of(conn, self.pipeline, self.consumer_group, self.checkpoint_location,
                                                 query_id)
        if generation_id is None:
            raise ConfigError(
                f"sink {self.name!r}: checkpoint {self.checkpoint_location} is not a checkpoint generation the "
                f"ledger handed out for pipeline {self.pipeline!r} (group {self.consumer_group!r}); start the "
                f"query on start_from_ledger(...).checkpoint_location", sink=self.name)
        return generation_id

    def _move(self, conn: Connection, staging: Staging, stage_table: str, columns: list[str]) -> int:
        """The staged rows into the target (a seam the crash tests die in, between staging and commit)."""
        return staging.move(conn, stage_table, columns)

    def _records(self, conn: Connection | None, query_id: str, batch: Any, now: datetime) -> list[Any]:
        return batch_ledger_records(conn, self.pipeline, self.consumer_group, query_id, batch, now,
                                    self.checkpoint_location)


def check_target(ledger: Engine, spec: sink_store.SinkSpec, *, register: bool) -> None:
    """Refuse (``SinkTargetChanged``) a sink whose name the ledger bound to another target."""
    try:
        with ledger.begin() as conn:
            sink_store.bind_target(conn, spec, datetime.now(timezone.utc) if register else None)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, f"checking the target of sink {spec.sink}") from exc


def batch_ledger_records(conn: Connection | None, pipeline: str, consumer_group: str, query_id: str, batch: Any,
                         now: datetime, checkpoint_location: str | None) -> list[Any]:
    """A running batch as the ledger records it (the run first, when the ledger does not know it yet)."""
    run_id = sink_run_id(query_id)
    records: list[Any] = [replace(r, batch=replace(r.batch, run_id=run_id, recorded_by=SINK_SOURCE))
                          for r in batch_records(pipeline, consumer_group, query_id, [batch], fallback_time=now)]
    if records and conn is not None and not reconcile_store.run_recorded(conn, run_id):
        records.insert(0, RunStart(pipeline, consumer_group, query_id, run_id, None, now,
                                   checkpoint_location=checkpoint_location))
    return records
