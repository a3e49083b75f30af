"""The Delta Lake sink: ``txnAppId``/``txnVersion`` from the ledger's sequence, the table version recorded.

Commit order for batch ``n`` of generation ``g`` (``docs/sinks.md``)::

    1. read the batch's offsets from the checkpoint; under the ledger's pipeline lock: (g, n)
       committed? skip; g not current, or an older generation committed past the positions after
       g opened (a zombie, ``rules.sink_ahead.late_commit``)? SinkFenced; else its sequence s = last + 1
    2. df.write.format("delta").option("txnAppId", sink).option("txnVersion", s)
         .option("userMetadata", <the batch's ledger record>)     <- the atomic step (Delta's commit)
    3. find the table version whose txn is (sink, s) in _delta_log; record sink_batches (g, n -> s,
       version, rows), the batch and its positions in one ledger transaction

A crash after 2 and before 3 leaves the ledger behind the table, never ahead: Spark re-runs the
batch on the same checkpoint with the same s (Delta skips the write; step 3 records it), and
``start_from_ledger(..., sinks=[sink])`` records it from the Delta log before planning a clean
checkpoint. Batch ids restarting at 0 never collide: the txn version is the sequence.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.config import settings
from offset_ledger.errors import CheckpointFormatError, ConfigError, SinkFenced
from offset_ledger.ledger import reconcile_store, sink_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.rules.delta_log import DeltaCommit, commit_version, parse_commit
from offset_ledger.rules.model import Finding
from offset_ledger.rules.sink_batch import batch_doc
from offset_ledger.rules.sink_identity import BatchIdentity, SinkDecision, foreign_commit, identity_of
from offset_ledger.sinks import held as held_records
from offset_ledger.sinks.postgres import check_target
from offset_ledger.sinks.table_batch import TableCommit, prepare_batch, record_found_commit, record_table_commit


class DeltaSink:
    """``foreachBatch(DeltaSink(path=..., ...))``: exactly-once appends to a Delta table (delta-spark on Spark)."""

    kind = "delta"

    def __init__(self, *, path: str, pipeline: str, checkpoint_location: str | None = None,
                 consumer_group: str | None = None, dsn: str | None = None, name: str | None = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        if not path or not path.strip():
            raise ConfigError("the Delta sink needs the table's path")
        if dsn is None:
            dsn = settings().dsn
        if not dsn:
            raise ConfigError("the Delta sink needs a ledger DSN (dsn or OFFSET_LEDGER_DSN)")
        self.path = path.rstrip("/")
        self.pipeline = pipeline
        self.consumer_group = consumer_group or pipeline
        self.checkpoint_location = checkpoint_location
        self.dsn = dsn
        self.name = name or f"{pipeline}:{self.path}"
        self.storage_options = storage_options
        self.last: SinkDecision | None = None

    @property
    def spec(self) -> sink_store.SinkSpec:
        return sink_store.SinkSpec(self.name, self.pipeline, self.consumer_group, self.kind, self.path, None)

    def bind(self, checkpoint_location: str) -> DeltaSink:
        bound = copy.copy(self)
        bound.checkpoint_location = checkpoint_location
        return bound

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write(df, int(batch_id))

    def write(self, df: Any, batch_id: int) -> SinkDecision:
        prepared = prepare_batch(self.spec, self.dsn, self.checkpoint_location, self.storage_options, batch_id)
        ledger, decision, records = prepared.ledger, prepared.decision, prepared.records
        generation_id, query_id = prepared.generation_id, prepared.query_id
        self.last = decision
        prepared.refuse_if_fenced(self.spec, batch_id, list(df.columns))
        if decision.verdict == "skip":
            return decision
        assert decision.sequence is not None
        if prepared.held.whole:  # a restart planned this sink to skip what it holds: all of this batch
            return prepared.record_held(self.spec)
        df = held_records.without_held(df, prepared.held)
        identity = BatchIdentity(self.name, generation_id, batch_id, query_id)
        doc = {**identity.as_doc(), "sequence": decision.sequence,
               "batch": batch_doc(records[-1].batch, self.checkpoint_location) if records else None}
        (df.write.format("delta").mode("append").option("txnAppId", self.name)
         .option("txnVersion", decision.sequence).option("userMetadata", json.dumps(doc)).save(self.path))
        commit = self._find(decision.sequence, identity)
        self._record(ledger, TableCommit(decision.sequence, generation_id, query_id, batch_id,
                                         commit.output_rows, commit.version), records)
        return decision

    def _find(self, sequence: int, identity: BatchIdentity) -> DeltaCommit:
        """The table version that carries txn (this sink, ``sequence``) *and names this batch*.

        Written now or by an earlier attempt of the same batch. A version that carries the txn but
        names another batch is a collision: Delta skipped this write, so it is refused
        (``SinkFenced``), never recorded as this batch's commit.
        """
        for commit in reversed(self._commits()):
            if commit.txn_app_id == self.name and commit.txn_version == sequence:
                why = foreign_commit(identity, sequence, commit.version, identity_of(_metadata(commit)))
                if why is not None:
                    self.last = SinkDecision("fenced", None, why)
                    raise SinkFenced(f"sink {self.name!r}: {why}", sink=self.name, batch_id=identity.batch_id,
                                     generation_id=identity.generation_id, table_version=commit.version)
                return commit
        raise ConfigError(f"sink {self.name!r}: no version of {self.path} carries txn {sequence}: was the table "
                          f"written by another application id with a higher txnVersion?", sink=self.name)

    def _commits(self, after_version: int = -1) -> list[DeltaCommit]:
        files = checkpoint_files(self.path, self.storage_options)
        versions = sorted(v for v in map(commit_version, files.list("_delta_log")) if v is not None and v > after_version)
        out = []
        for v in versions:
            data = files.read(f"_delta_log/{v:020d}.json")
            if data is not None:
                out.append(parse_commit(v, data, f"{self.path}/_delta_log/{v:020d}.json"))
        return out

    def _record(self, ledger: Engine, commit: TableCommit, records: list[Any]) -> None:
        # One method, so that a test driver can die between the table's commit and the ledger's.
        record_table_commit(ledger, self.spec, commit, records)

    def reconcile(self, ledger: Engine) -> tuple[Finding, ...]:
        """Record in the ledger the table versions this sink wrote and the ledger lacks (before a restart plans)."""
        check_target(ledger, self.spec, register=False)
        try:
            checkpoint_files(self.path, self.storage_options)
        except CheckpointFormatError:
            return ()  # no table yet
        try:
            with ledger.connect() as conn:
                known, last_version = reconcile_store.sink_sequence_and_version(conn, self.name)
            missing = [c for c in self._commits(int(last_version)) if c.txn_app_id == self.name
                       and c.txn_version is not None and c.txn_version > int(known)]
            for commit in missing:
                found = identity_of(_metadata(commit))
                if found is None or found.sink != self.name:
                    raise SinkFenced(
                        f"sink {self.name!r}: table version {commit.version} of {self.path} carries this sink's txn "
                        f"({self.name}, {commit.txn_version}) but its userMetadata does not name a batch of this "
                        f"sink: another writer used the sink's application id; nothing was recorded",
                        sink=self.name, table_version=commit.version)
                doc = json.loads(commit.user_metadata or "{}")
                batch = doc.get("batch") or {}
                record_found_commit(ledger, self.spec, TableCommit(
                    int(doc["sequence"]), int(doc["generation_id"]), batch.get("query_id", ""),
                    int(batch.get("batch_id", -1)), commit.output_rows, commit.version), batch)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"reconciling sink {self.name} with {self.path}") from exc
        if not missing:
            return ()
        versions = [c.version for c in missing]
        return (Finding("sink_reconciled",
                        f"the ledger lacked {len(missing)} version(s) sink {self.name!r} had written to {self.path} "
                        f"(table versions {versions[0]}-{versions[-1]}): recorded from the Delta log",
                        details={"sink": self.name, "table_versions": versions}),)


def _metadata(commit: DeltaCommit) -> dict[str, Any] | None:
    """A commit's ``userMetadata`` as the sink wrote it (None: absent or not the sink's JSON)."""
    try:
        doc = json.loads(commit.user_metadata) if commit.user_metadata else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
