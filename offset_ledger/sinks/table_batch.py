"""The ledger's side of a batch for a sink whose target keeps its own commit log (Delta, Iceberg).

Both table sinks decide a batch the same way before they touch their table: the batch Spark is
running (from the checkpoint), the sink's row locked, the checkpoint's generation, the sequence
verdict (``rules.sink_identity.decide``), a zombie's late commit (``rules.sink_ahead``), and the
records the ledger will hold once the table committed. One function, so that a rule added for one
table format cannot be missing from the other (the late-commit fence once was). After the table
committed, both record the commit the same way: their own (``record_table_commit``) and one that
reconcile found in the table's log (``record_found_commit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.errors import ConfigError, SinkFenced
from offset_ledger.ledger import reconcile_store, sink_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.rules.sink_ahead import BatchHolding, late_commit
from offset_ledger.rules.sink_batch import batch_from_doc, running_batch
from offset_ledger.rules.sink_identity import SinkDecision, decide
from offset_ledger.sinks import held as held_records
from offset_ledger.sinks.postgres import SINK_SOURCE, batch_ledger_records, sink_engine, sink_run_id


@dataclass(frozen=True)
class PreparedBatch:
    """What the ledger says of one batch before the table is written."""

    ledger: Engine
    decision: SinkDecision
    generation_id: int
    query_id: str
    batch: Any  # the running batch read from the checkpoint
    records: list[Any]  # what the ledger records with the commit
    held: BatchHolding = BatchHolding()  # what the sink already holds of the batch (``sinks.held``)

    def refuse_if_fenced(self, spec: sink_store.SinkSpec, batch_id: int, columns: list[str] | None = None) -> None:
        """SinkFenced for a fenced batch, and for one whose held records its ``columns`` cannot tell apart."""
        why = self.decision.reason if self.decision.verdict == "fenced" else None
        if why is None and self.decision.verdict == "commit" and columns is not None:
            why = held_records.refusal(spec.sink, self.held, columns)
        if why is not None:
            raise SinkFenced(f"sink {spec.sink!r}: {why}", sink=spec.sink, batch_id=batch_id,
                             generation_id=self.generation_id)

    def record_held(self, spec: sink_store.SinkSpec) -> SinkDecision:
        """The batch the sink holds whole: recorded under its sequence with no rows, the table not written."""
        assert self.decision.sequence is not None
        record_table_commit(self.ledger, spec, TableCommit(self.decision.sequence, self.generation_id, self.query_id,
                                                           self.batch.batch_id, 0, None), self.records)
        return self.decision


def prepare_batch(spec: sink_store.SinkSpec, dsn: str, checkpoint_location: str | None,
                  storage_options: Any, batch_id: int) -> PreparedBatch:
    """Decide ``batch_id`` of the sink ``spec`` (its checkpoint at ``checkpoint_location``) in one ledger
    transaction: ConfigError for an unbound sink or a checkpoint the ledger did not hand out."""
    if not checkpoint_location:
        raise ConfigError(f"sink {spec.sink!r} has no checkpoint location: bind(plan.checkpoint_location)")
    ledger = sink_engine(dsn)
    query_id, batch = running_batch(checkpoint_location, checkpoint_files(checkpoint_location, storage_options),
                                    batch_id)
    now = datetime.now(timezone.utc)
    try:
        with ledger.begin() as conn:
            state = sink_store.lock_sink(conn, spec, now)
            generation_id = sink_store.generation_of(conn, spec.pipeline, spec.consumer_group,
                                                     checkpoint_location, query_id)
            if generation_id is None:
                raise ConfigError(f"sink {spec.sink!r}: checkpoint {checkpoint_location} is not a generation "
                                  f"the ledger handed out for pipeline {spec.pipeline!r}", sink=spec.sink)
            decision = decide(state, generation_id=generation_id, batch_id=batch_id,
                              current_generation_id=sink_store.current_generation_id(
                                  conn, spec.pipeline, spec.consumer_group),
                              committed_sequence=sink_store.committed_sequence(
                                  conn, spec.sink, generation_id, batch_id))
            if decision.verdict == "commit":
                # A zombie's commit of this sink that landed after this generation opened (rules.sink_ahead).
                why = late_commit(sink_store.older_commits_ahead(conn, spec.pipeline, spec.consumer_group)[0],
                                  spec.sink)
                if why is not None:
                    decision = SinkDecision("fenced", None, why)
            records = batch_ledger_records(conn, spec.pipeline, spec.consumer_group, query_id, batch, now,
                                           checkpoint_location)
            held = held_records.holding(conn, spec.sink, generation_id, records)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, f"preparing batch {batch_id} of {spec.sink}") from exc
    return PreparedBatch(ledger, decision, generation_id, query_id, batch, records, held)


@dataclass(frozen=True)
class TableCommit:
    """One commit of a table sink as the ledger records it: which batch, under which sequence, and
    what the table says it wrote (Delta: the table version; Iceberg: the snapshot id)."""

    sequence: int
    generation_id: int
    query_id: str
    batch_id: int
    row_count: int | None
    table_version: int | None


def record_table_commit(ledger: Engine, spec: sink_store.SinkSpec, commit: TableCommit, records: list[Any]) -> None:
    """Record the sink's own commit of a batch with the batch's ``records``, once: a retried batch whose
    commit the ledger already holds records nothing (the table skipped the write too)."""
    now = datetime.now(timezone.utc)
    try:
        with ledger.begin() as conn:
            sink_store.lock_sink(conn, spec, now)
            if sink_store.committed_sequence(conn, spec.sink, commit.generation_id, commit.batch_id) is not None:
                return
            _record(conn, spec, commit, records, now)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, f"recording batch {commit.batch_id} of {spec.sink}") from exc


def record_found_commit(ledger: Engine, spec: sink_store.SinkSpec, commit: TableCommit,
                        batch: dict[str, Any] | None) -> None:
    """Record a commit that reconcile found in the table's own log and the ledger lacks, with the batch
    its metadata names (``batch``: ``rules.sink_batch.batch_doc``) and that batch's run when the ledger
    never saw the run start (the writer died before it told the ledger anything)."""
    now = datetime.now(timezone.utc)
    records: list[Any] = []
    with ledger.begin() as conn:
        sink_store.lock_sink(conn, spec, now)
        if batch:
            run_id = sink_run_id(batch["query_id"])
            records = [BatchRecord(spec.pipeline, spec.consumer_group, batch_from_doc(batch, run_id, SINK_SOURCE))]
            if not reconcile_store.run_recorded(conn, run_id):
                records.insert(0, RunStart(spec.pipeline, spec.consumer_group, batch["query_id"], run_id,
                                           None, now, checkpoint_location=batch.get("checkpoint_location")))
        _record(conn, spec, commit, records, now)


def _record(conn: Connection, spec: sink_store.SinkSpec, commit: TableCommit, records: list[Any],
            now: datetime) -> None:
    sink_store.record_commit(conn, spec, sink_store.SinkCommit(commit.sequence, commit.generation_id, commit.query_id,
                                                               commit.batch_id, commit.row_count, commit.table_version),
                             committed_at=now, now=now, records=records)
