"""The Apache Iceberg sink: the ledger's sequence and the batch's identity in the snapshot summary.

Commit order for batch ``n`` of generation ``g`` (``docs/sinks.md``)::

    1. read the batch's offsets from the checkpoint; under the ledger's pipeline lock: (g, n)
       committed? skip; g not current? SinkFenced; else its sequence s = last + 1
    2. a snapshot of the table already carries (sink, s)? this batch's: record it, write nothing
       (an earlier attempt committed and died before the ledger heard); another batch's: SinkFenced
    3. df.writeTo(table).option("snapshot-property.offset-ledger.*", ...).append()
                                                        <- the atomic step (Iceberg's commit)
    4. find the snapshot carrying (sink, s); record sink_batches (g, n -> s, snapshot id, rows),
       the batch and its positions in one ledger transaction

A crash after 3 and before 4 leaves the ledger behind the table, never ahead: Spark re-runs the
batch on the same checkpoint with the same s and step 2 records it, and
``start_from_ledger(..., sinks=[sink])`` records it from the table's metadata before planning a
clean checkpoint. Batch ids restarting at 0 never collide: the key is the sequence.

The table's metadata is read from its files (a Hadoop catalog's ``metadata/v<N>.metadata.json``),
not through Spark, so ``start_from_ledger`` reconciles without a session.
"""

from __future__ import annotations

import copy
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.config import settings
from offset_ledger.errors import CheckpointFormatError, ConfigError, SinkFenced
from offset_ledger.ledger import sink_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.rules.iceberg_snapshots import (
    IcebergSnapshot,
    carrying,
    colliding,
    metadata_version,
    not_recorded,
    parse_metadata,
    snapshot_properties,
)
from offset_ledger.rules.model import Finding
from offset_ledger.rules.sink_batch import batch_doc
from offset_ledger.rules.sink_identity import BatchIdentity, SinkDecision, identity_of
from offset_ledger.sinks import held as held_records
from offset_ledger.sinks.postgres import check_target
from offset_ledger.sinks.table_batch import TableCommit, prepare_batch, record_found_commit, record_table_commit

CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"


class IcebergSink:
    """``foreachBatch(IcebergSink(table="db.orders", warehouse=..., ...))``: exactly-once Iceberg appends.

    ``table``: ``namespace.name`` in ``catalog``, a Hadoop catalog whose warehouse is ``warehouse``
    (the sink registers the catalog in the Spark session when the session lacks it).
    """

    kind = "iceberg"

    def __init__(self, *, table: str, pipeline: str, warehouse: str, catalog: str = "offset_ledger",
                 checkpoint_location: str | None = None, consumer_group: str | None = None, dsn: str | None = None,
                 name: str | None = None, storage_options: dict[str, Any] | None = None) -> None:
        parts = (table or "").split(".")
        if len(parts) < 2 or not all(p.strip() for p in parts):
            raise ConfigError(f"the Iceberg sink needs the table as namespace.name, got {table!r}")
        if not warehouse or not warehouse.strip():
            raise ConfigError("the Iceberg sink needs the Hadoop catalog's warehouse directory")
        if dsn is None:
            dsn = settings().dsn
        if not dsn:
            raise ConfigError("the Iceberg sink needs a ledger DSN (dsn or OFFSET_LEDGER_DSN)")
        self.table = table
        self.catalog = catalog
        self.warehouse = warehouse.rstrip("/")
        # A Hadoop catalog keeps namespace.name at <warehouse>/<namespace>/<name>.
        self.location = "/".join([self.warehouse, *parts])
        self.pipeline = pipeline
        self.consumer_group = consumer_group or pipeline
        self.checkpoint_location = checkpoint_location
        self.dsn = dsn
        self.name = name or f"{pipeline}:{catalog}.{table}"
        self.storage_options = storage_options
        self.last: SinkDecision | None = None

    @property
    def spec(self) -> sink_store.SinkSpec:
        return sink_store.SinkSpec(self.name, self.pipeline, self.consumer_group, self.kind, self.location, None)

    def spark_conf(self) -> dict[str, str]:
        """The session settings of the catalog (``SparkSession.builder.config(...)`` each)."""
        key = f"spark.sql.catalog.{self.catalog}"
        return {key: CATALOG_CLASS, f"{key}.type": "hadoop", f"{key}.warehouse": self.warehouse}

    def bind(self, checkpoint_location: str) -> IcebergSink:
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
        snap = self._own(identity, decision.sequence)  # an earlier attempt of this batch committed
        if snap is None:
            props = snapshot_properties(identity, decision.sequence,
                                        batch_doc(records[-1].batch, self.checkpoint_location) if records else None)
            self._ensure_catalog(df.sparkSession)
            writer = df.writeTo(f"{self.catalog}.{self.table}")
            for key, value in props.items():
                writer = writer.option(f"snapshot-property.{key}", value)
            writer.append()
            snap = self._own(identity, decision.sequence)
            if snap is None:
                raise ConfigError(f"sink {self.name!r}: no snapshot of {self.location} carries sequence "
                                  f"{decision.sequence} after the append: is {self.catalog}.{self.table} the Hadoop "
                                  f"table at {self.location}?", sink=self.name)
        self._record(ledger, TableCommit(decision.sequence, generation_id, query_id, batch_id,
                                         snap.added_records, snap.snapshot_id), records)
        return decision

    def _ensure_catalog(self, spark: Any) -> None:
        for key, value in self.spark_conf().items():
            if not spark.conf.get(key, None):
                spark.conf.set(key, value)

    def _own(self, identity: BatchIdentity, sequence: int) -> IcebergSnapshot | None:
        """The snapshot carrying (this sink, ``sequence``) when it names this batch; SinkFenced when another."""
        snap = carrying(self._snapshots(), self.name, sequence)
        if snap is None:
            return None
        why = colliding(identity, sequence, snap, self.location)
        if why is not None:
            self.last = SinkDecision("fenced", None, why)
            raise SinkFenced(f"sink {self.name!r}: {why}", sink=self.name, batch_id=identity.batch_id,
                             generation_id=identity.generation_id, table_version=snap.snapshot_id)
        return snap

    def _snapshots(self) -> list[IcebergSnapshot]:
        """The table's current snapshot and its ancestors, oldest first (none before the table exists)."""
        try:
            files = checkpoint_files(self.location, self.storage_options)
        except CheckpointFormatError:
            return []
        hint = files.read("metadata/version-hint.text")
        version = int(hint.decode().strip()) if hint and hint.decode().strip().isdigit() else max(
            (v for v in map(metadata_version, files.list("metadata")) if v is not None), default=None)
        if version is None:
            return []
        path = f"metadata/v{version}.metadata.json"
        data = files.read(path)
        if data is None:
            raise CheckpointFormatError(f"{self.location}/{path}", "the metadata file version-hint.text names is missing")
        return parse_metadata(data, f"{self.location}/{path}")

    def _record(self, ledger: Engine, commit: TableCommit, records: list[Any]) -> None:
        # One method, so that a test driver can die between the table's commit and the ledger's.
        record_table_commit(ledger, self.spec, commit, records)

    def reconcile(self, ledger: Engine) -> tuple[Finding, ...]:
        """Record in the ledger the snapshots this sink committed and the ledger lacks (before a restart plans)."""
        check_target(ledger, self.spec, register=False)
        snapshots = self._snapshots()
        if not snapshots:
            return ()
        try:
            with ledger.connect() as conn:
                known = sink_store.last_sequence(conn, self.name)
            missing = not_recorded(snapshots, self.name, int(known))
            for snap in missing:
                doc = snap.doc()
                if identity_of(doc) is None or doc is None:
                    raise SinkFenced(
                        f"sink {self.name!r}: snapshot {snap.snapshot_id} of {self.location} carries this sink's "
                        f"sequence {snap.sequence} but does not name a batch of the sink: another writer set the "
                        f"sink's snapshot properties; nothing was recorded", sink=self.name,
                        table_version=snap.snapshot_id)
                batch = doc.get("batch") or {}
                record_found_commit(ledger, self.spec, TableCommit(
                    int(doc["sequence"]), int(doc["generation_id"]), str(doc.get("query_id") or batch.get("query_id", "")),
                    int(doc["batch_id"]), snap.added_records, snap.snapshot_id), batch)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"reconciling sink {self.name} with {self.location}") from exc
        if not missing:
            return ()
        ids = [s.snapshot_id for s in missing]
        return (Finding("sink_reconciled",
                        f"the ledger lacked {len(missing)} snapshot(s) sink {self.name!r} had committed to "
                        f"{self.location} (sequences {missing[0].sequence}-{missing[-1].sequence}): recorded from "
                        f"the table's metadata", details={"sink": self.name, "snapshot_ids": ids}),)
