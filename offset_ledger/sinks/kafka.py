"""The Kafka sink: Kafka's consume-transform-produce transaction, per source partition, for ``foreachBatch``.

Spark's own Kafka sink is at-least-once. This one writes each *source* partition's outputs in one
Kafka transaction that also commits the source position to a consumer group the sink owns, so that
"output written" and "input consumed up to X" are one fact in Kafka itself. Commit order for batch
``n`` of generation ``g`` (``docs/sinks.md`` draws it)::

    1. read offsets/n from the checkpoint; under the ledger's pipeline lock: (g, n) committed? skip;
       g not current, or a zombie's late commit? SinkFenced; else its sequence s      (table_batch)
    2. the executors, each source partition whole in one task (no row goes through the driver; the rows
       as Arrow batches), for each source partition a task saw rows of: init_transactions (fences every
       older attempt of that partition), read the group's position, send_offsets_to_transaction(the
       batch's end of the partition, a mark naming (s, g, n)), produce the rows at or past the position;
       after the task's last row, commit_transaction for each               <- the atomic steps
       (the driver does the same, position and mark only, for a partition none of whose rows survived)
    3. record sink_batches (g, n -> s, rows), the batch and its positions in one ledger transaction

A crash in 2 leaves some partitions committed: a retried task, a re-run of the batch or a restart from
the ledger's positions reads each partition's group position first and writes only what lies past
it. A crash after 2 and before 3 leaves the ledger behind Kafka: the re-run on the same checkpoint
skips every row and records the batch; ``start_from_ledger(..., sinks=[sink])`` records it from the
group's marks (``reconcile``) before it plans a clean checkpoint.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from functools import partial
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.config import settings
from offset_ledger.errors import ConfigError, KafkaError, SinkInputRefused
from offset_ledger.ledger import sink_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.rules.kafka_sink import (Mark, PartitionRun, batch_partitions, default_group, missing_columns,
                                            refusal, scan_assignment, task_totals, unrecorded)
from offset_ledger.rules.model import Finding
from offset_ledger.rules.sink_batch import batch_doc
from offset_ledger.rules.sink_identity import SinkDecision
from offset_ledger.sinks import held as held_records
from offset_ledger.sinks._kafka_tx import STATUS_SCHEMA, commit_empty, write_batches
from offset_ledger.sinks.postgres import check_target
from offset_ledger.sinks.table_batch import TableCommit, prepare_batch, record_found_commit, record_table_commit

log = logging.getLogger(__name__)


class KafkaSink:
    """``foreachBatch(KafkaSink(topic=..., bootstrap_servers=..., ...))``: exactly-once output to a Kafka topic.

    The batch must keep Spark's Kafka columns ``topic``, ``partition``, ``offset`` (the *source* record of
    each row) beside ``value`` (string or binary), and may carry ``key`` (string or binary), ``headers``
    (Spark's ``array<struct<key: string, value: binary>>``) and an output partition (``partition_column``,
    default ``output_partition``; else Kafka's partitioner on the key). ``group_id``: the consumer group
    the sink owns, its position per source partition (default ``offset-ledger-sink.<name>``); never let
    anything else commit to it. ``kafka_config``: librdkafka settings for every client (security);
    ``producer_config``: the producer's on top. ``transaction_timeout_ms``: a task's share of a batch (its
    source partitions' transactions stay open until its last row) must be written within it
    (docs/sinks.md). ``skip_shuffle``: write a batch whose Kafka scan reads one whole source partition per
    Spark partition without a shuffle (checked per batch); False always groups the rows by a shuffle.
    """

    kind = "kafka"

    def __init__(self, *, topic: str, bootstrap_servers: str, pipeline: str, checkpoint_location: str | None = None,
                 consumer_group: str | None = None, dsn: str | None = None, name: str | None = None,
                 group_id: str | None = None, kafka_config: dict[str, Any] | None = None,
                 producer_config: dict[str, Any] | None = None, transaction_timeout_ms: int = 60_000,
                 partition_column: str | None = None, storage_options: dict[str, Any] | None = None,
                 timeout_s: float = 60.0, skip_shuffle: bool = True) -> None:
        if not topic or not topic.strip():
            raise ConfigError("the Kafka sink needs an output topic")
        if not bootstrap_servers:
            raise ConfigError("the Kafka sink needs the output cluster's bootstrap_servers")
        if dsn is None:
            dsn = settings().dsn
        if not dsn:
            raise ConfigError("the Kafka sink needs a ledger DSN (dsn or OFFSET_LEDGER_DSN)")
        if transaction_timeout_ms < 1000:
            raise ConfigError(f"transaction_timeout_ms must be at least 1000, not {transaction_timeout_ms}")
        self.topic = topic.strip()
        self.bootstrap_servers = bootstrap_servers
        self.pipeline = pipeline
        self.consumer_group = consumer_group or pipeline
        self.checkpoint_location = checkpoint_location
        self.dsn = dsn
        self.name = name or f"{pipeline}:{self.topic}"
        self.group_id = group_id or default_group(self.name)
        self.kafka_config = dict(kafka_config or {})
        self.producer_config = dict(producer_config or {})
        self.transaction_timeout_ms = int(transaction_timeout_ms)
        # Named: the batch must carry it (a typo refused, never the key's partitioner instead); by default the
        # column output_partition is used when the batch has one.
        self.partition_column_named = partition_column is not None
        self.partition_column = partition_column or "output_partition"
        self.storage_options = storage_options
        self.timeout_s = float(timeout_s)
        # False: always group the rows by a shuffle (the path every batch took before; for comparison).
        self.skip_shuffle = bool(skip_shuffle)
        #: True: the tasks hand their rows to one producer owner per executor (``sinks/_kafka_owner.py``), so a
        #: source partition keeps its producer whichever Python worker runs its task; False: each worker keeps
        #: its own (a partition moving between workers fences and replaces them; for comparison).
        self.producer_owner = True
        self.last: SinkDecision | None = None
        #: What the last batch did per source partition (written, skipped, committed position), for tests and logs.
        self.last_runs: list[PartitionRun] = []
        self.last_timings: dict[str, float] = {}
        #: How the last batch's rows reached their transactions: "scan" (each Spark partition of the Kafka scan
        #: is one source partition: no shuffle) or "shuffle".
        self.last_path = ""
        self._task_timings: list[dict[str, float]] = []

    @property
    def spec(self) -> sink_store.SinkSpec:
        return sink_store.SinkSpec(self.name, self.pipeline, self.consumer_group, self.kind, self.topic, None)

    def bind(self, checkpoint_location: str) -> KafkaSink:
        bound = copy.copy(self)
        bound.checkpoint_location = checkpoint_location
        return bound

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write(df, int(batch_id))

    # ------------------------------------------------------------------ the batch

    def write(self, df: Any, batch_id: int) -> SinkDecision:
        """Write ``df`` per source partition in Kafka transactions, then record the batch (or skip / fence it)."""
        if type(df).__module__.startswith("pyspark.sql.connect"):
            # The tasks' mapInArrow exists there, but the scan check reads the JVM lineage and no test runs the
            # sink over Connect yet: refused rather than run untested.
            raise ConfigError(f"sink {self.name!r} runs on classic Spark only: it is not tested over Spark Connect "
                              f"(docs/sinks.md, Kafka); nothing was written", sink=self.name)
        columns = list(df.columns)
        missing = missing_columns(columns, "value")
        if missing:  # before the ledger or Kafka is touched
            raise SinkInputRefused(refusal(self.name, missing, columns), sink=self.name, missing=missing)
        if self.partition_column_named and self.partition_column not in columns:
            raise SinkInputRefused(
                f"sink {self.name!r}: partition_column {self.partition_column!r} is not a column of the batch (it has "
                f"{', '.join(columns)}); nothing was written", sink=self.name, missing=[self.partition_column])
        started = time.perf_counter()
        prepared = prepare_batch(self.spec, self.dsn, self.checkpoint_location, self.storage_options, batch_id)
        decision = prepared.decision
        self.last, self.last_runs, self.last_path = decision, [], ""
        prepared.refuse_if_fenced(self.spec, batch_id, columns)
        if decision.verdict == "skip":
            return decision
        assert decision.sequence is not None
        if prepared.held.whole:  # a restart planned this sink to skip what it holds: all of this batch
            return prepared.record_held(self.spec)
        ranges = batch_partitions(held_records.batch_ranges(prepared.records))
        mark = Mark(self.name, decision.sequence, prepared.generation_id, batch_id, prepared.query_id, len(ranges),
                    batch_doc(prepared.records[-1].batch, self.checkpoint_location or "") if prepared.records else None)
        cfg = self._task_config(ranges, mark.encode())
        decided = time.perf_counter()
        self._task_timings, self.last_timings = [], {}
        runs = self._write_partitions(held_records.without_held(df, prepared.held), columns, cfg, ranges)
        job_done = time.perf_counter()
        done = {(r.topic, r.partition) for r in runs}
        rest = [tp for tp in ranges if tp not in done]
        if rest:
            runs += self._kafka(lambda: commit_empty(cfg, rest), f"committing {len(rest)} partition(s) with no rows")
        written = time.perf_counter()
        self.last_runs = sorted(runs, key=lambda r: (r.topic, r.partition))
        self._record(prepared.ledger, TableCommit(decision.sequence, prepared.generation_id, prepared.query_id,
                                                  batch_id, sum(r.written for r in runs), None), prepared.records)
        self.last_timings = {**self.last_timings, "prepare_ms": (decided - started) * 1000,
                             "kafka_ms": (written - decided) * 1000,
                             "job_ms": (job_done - decided) * 1000, "empty_ms": (written - job_done) * 1000,
                             "record_ms": (time.perf_counter() - written) * 1000,
                             **task_totals(self._task_timings)}
        log.debug("sink %s batch %d (%s): %s", self.name, batch_id, self.last_path, self.last_timings)
        return decision

    def _task_config(self, ranges: dict[tuple[str, int], tuple[int | None, int]], mark: str) -> dict[str, Any]:
        """What every task needs, as plain values (pickled to the executors)."""
        return {"client": {"bootstrap.servers": self.bootstrap_servers, **self.kafka_config},
                "producer": self.producer_config, "transaction_timeout_ms": self.transaction_timeout_ms,
                "pipeline": self.pipeline, "sink": self.name, "group": self.group_id, "topic": self.topic,
                "timeout_s": self.timeout_s, "mark": mark, "owner": self.producer_owner,
                "ranges": [(t, p, f, u) for (t, p), (f, u) in sorted(ranges.items())]}

    def _write_partitions(self, df: Any, columns: list[str], cfg: dict[str, Any],
                          ranges: dict[tuple[str, int], tuple[int | None, int]]) -> list[PartitionRun]:
        """The executors' transactions (``_kafka_tx.write_batches`` in a ``mapInArrow``); only one status row per
        committed source partition comes back.

        When the batch's rows are a one-to-one chain over Spark's Kafka scan and each Spark partition reads
        one whole source partition of the batch (``rules.kafka_sink.scan_assignment``, checked on the
        lineage, never assumed), no shuffle: each row carries the index of the split that read it, and the
        splits are handed whole to at most as many tasks as the cluster runs at once (a coalesce: each task
        then holds every row of its splits' partitions). Otherwise the rows are grouped by source partition
        (a shuffle on the JVM side) and sorted by offset. The rows reach Python as Arrow record batches and go
        on to the executor's producer owner as Arrow bytes.
        """
        from pyspark.sql import functions as F

        def col(name: str, cast: str, alias: str | None = None) -> Any:
            if name not in columns:
                return F.lit(None).cast(cast).alias(alias or name)
            return F.col(name).cast(cast).alias(alias or name)

        if not ranges:
            return []
        rows = df.select(F.col("topic"), F.col("partition"), F.col("offset"), col("value", "binary"),
                         col("key", "binary"), col("headers", "array<struct<key: string, value: binary>>"),
                         col(self.partition_column, "int", "_out"))
        tasks = _task_slots(df)
        t0 = time.perf_counter()
        # The lineage of the batch itself, not of the select above: a projection keeps every partition where it is,
        # so the select's partition i (where ``spark_partition_id()`` tags each row below) is the batch's partition
        # i; and the batch's plan is already made, where the select's would be planned once more just for this.
        assigned, why = scan_assignment(_scan_ranges(df) if self.skip_shuffle else None, ranges)
        self.last_timings["lineage_ms"] = (time.perf_counter() - t0) * 1000
        self.last_path = "scan" if assigned is not None else "shuffle"
        if assigned is not None:
            tagged = rows.withColumn("_split", F.spark_partition_id())
            # Fewer, longer tasks: each Python task costs Spark ~50 ms of its own (measured: 6 tasks of one row on
            # 2 cores 197 ms, the same rows in 2 tasks 75 ms); a coalesce hands whole splits to a task.
            if tasks and len(assigned) > tasks:
                grouped = tagged.coalesce(tasks)
                t0 = time.perf_counter()
                groups = _coalesced(grouped)
                self.last_timings["hint_ms"] = (time.perf_counter() - t0) * 1000
            else:
                grouped, groups = tagged, [[i] for i in range(len(assigned))]
            # Which partitions each task will read, so that it opens their transactions before its first row: a
            # hint only (a task commits a partition only for the rows it saw of it, each checked against its split).
            expected = None if groups is None else [
                [assigned[i] for i in group if 0 <= i < len(assigned) and assigned[i] is not None] for group in groups]
            job_cfg = {**cfg, "assigned": assigned, "expected": expected}
        else:
            log.debug("sink %s: rows grouped by a shuffle: %s", self.name, why)
            job_cfg = cfg
            grouped = rows.repartition(min(len(ranges), tasks or len(ranges)), "topic", "partition"
                                       ).sortWithinPartitions("topic", "partition", "offset")
        job = grouped.mapInArrow(partial(write_batches, job_cfg), STATUS_SCHEMA)
        out = self._kafka(job.collect, "writing the batch's partitions")
        self._task_timings = [json.loads(r["timings"]) for r in out]
        return [PartitionRun(r["topic"], int(r["partition"]), int(r["written"]), int(r["skipped"]),
                             int(r["committed"])) for r in out]

    def _kafka(self, call: Any, what: str) -> Any:
        try:
            return call()
        except Exception as exc:
            from confluent_kafka import KafkaException

            if isinstance(exc, KafkaException):
                raise KafkaError(f"sink {self.name!r}: {what} failed: {exc}", sink=self.name) from exc
            raise

    def _record(self, ledger: Engine, commit: TableCommit, records: list[Any]) -> None:
        # One method, so that a test driver can die between Kafka's commits and the ledger's.
        record_table_commit(ledger, self.spec, commit, records)

    # ------------------------------------------------------------------ the restart

    def group_marks(self) -> dict[tuple[str, int], tuple[int, Mark | None]]:
        """The sink's group as Kafka holds it: (position, mark) per source partition it committed."""
        from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, **self.kafka_config})
        try:
            future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(self.group_id)],
                                                       request_timeout=self.timeout_s)[self.group_id]
            found = future.result(timeout=self.timeout_s)
        except KafkaException as exc:
            raise KafkaError(f"sink {self.name!r}: reading consumer group {self.group_id!r} failed: {exc}",
                             sink=self.name) from exc
        return {(tp.topic, tp.partition): (tp.offset, Mark.decode(tp.metadata))
                for tp in found.topic_partitions or [] if tp.offset >= 0}

    def reconcile(self, ledger: Engine) -> tuple[Finding, ...]:
        """Record in the ledger the batches the sink's group holds whole and the ledger lacks (before a restart)."""
        check_target(ledger, self.spec, register=False)
        try:
            with ledger.connect() as conn:
                known = sink_store.last_sequence(conn, self.name)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, f"reconciling sink {self.name} with its group") from exc
        missing = unrecorded({tp: m for tp, (_, m) in self.group_marks().items()}, self.name, known)
        for mark in missing:
            assert mark.batch is not None
            try:
                record_found_commit(ledger, self.spec, TableCommit(mark.sequence, mark.generation_id, mark.query_id,
                                                                   mark.batch_id, None, None), mark.batch)
            except SQLAlchemyError as exc:
                raise translate_db_error(exc, f"reconciling sink {self.name} with its group") from exc
        if not missing:
            return ()
        seqs = [m.sequence for m in missing]
        return (Finding("sink_reconciled",
                        f"the ledger lacked {len(seqs)} batch(es) sink {self.name!r} had committed to Kafka topic "
                        f"{self.topic} (sequences {seqs[0]}-{seqs[-1]}): recorded from consumer group "
                        f"{self.group_id!r}'s commits",
                        details={"sink": self.name, "sequences": seqs}),)


def _scan_ranges(rows: Any) -> list[list[tuple[str, int, int, int]]] | None:
    """Per Spark partition of ``rows``, the Kafka ranges its split of Spark's Kafka scan reads; None when the
    lineage is not a chain of one-to-one dependencies down to that scan (``rules.kafka_sink.scan_assignment``).

    Read from the JVM's RDD lineage of the rows' plan (a ``foreachBatch`` DataFrame is a scan of the micro-batch's
    own RDD): a one-to-one dependency keeps partition ``i`` on its parent's ``i``, so the scan's split ``i`` is
    what Spark partition ``i`` holds. Anything the chain does not show (a Connect plan, another Spark's classes)
    is None: the shuffle.
    """
    try:
        rdd = rows._jdf.queryExecution().toRdd()
        count = len(rdd.partitions())
        while True:
            deps = rdd.dependencies()
            if deps.size() == 0:
                break
            if deps.size() != 1 or deps.apply(0).getClass().getSimpleName() != "OneToOneDependency":
                return None
            rdd = deps.apply(0).rdd()
            if len(rdd.partitions()) != count:
                return None
        if rdd.getClass().getSimpleName() != "DataSourceRDD":
            return None
        out = []
        for split in rdd.partitions():
            found = []
            for part in _input_partitions(split):
                if part.getClass().getSimpleName() != "KafkaBatchInputPartition":
                    return None
                r = part.offsetRange()
                tp = r.topicPartition()
                found.append((str(tp.topic()), int(tp.partition()), int(r.fromOffset()), int(r.untilOffset())))
            out.append(found)
        return out
    except Exception:  # noqa: BLE001 - a lineage we cannot read is one we do not rely on
        log.debug("the rows' lineage could not be read: the shuffle groups them", exc_info=True)
        return None


def _coalesced(df: Any) -> list[list[int]] | None:
    """Per Spark partition of ``df`` (a coalesce over a one-to-one chain), the partitions of the coalesce's parent it
    reads; None when the plan shows no such thing (then no task opens its transactions ahead)."""
    try:
        rdd = df._jdf.queryExecution().toRdd()
        while rdd.getClass().getSimpleName() != "CoalescedRDD":
            deps = rdd.dependencies()
            if deps.size() != 1 or deps.apply(0).getClass().getSimpleName() != "OneToOneDependency":
                return None
            rdd = deps.apply(0).rdd()
        return [[int(i) for i in part.parentsIndices()] for part in rdd.partitions()]
    except Exception:  # noqa: BLE001 - a hint: without it each transaction opens at its first row
        log.debug("the coalesce's groups could not be read", exc_info=True)
        return None


def _task_slots(df: Any) -> int | None:
    """How many tasks the cluster runs at once (Spark's default parallelism), None when it cannot be asked."""
    try:
        return max(1, int(df.sparkSession.sparkContext.defaultParallelism))
    except Exception:  # noqa: BLE001 - no SparkContext here (Spark Connect): one task per partition
        return None


#: Whether this JVM's ``DataSourceRDDPartition`` has ``inputPartition`` (Spark 4.2+) or ``inputPartitions``: asked once,
#: not per split (listing a class's methods over py4j costs ~1.5 ms).
_ONE_INPUT: list[bool] = []


def _input_partitions(split: Any) -> list[Any]:
    """A ``DataSourceRDDPartition``'s input splits: an Option since Spark 4.2, a Seq in Spark 3.5 to 4.1."""
    if not _ONE_INPUT:
        _ONE_INPUT.append("inputPartition" in {m.getName() for m in split.getClass().getMethods()})
    if _ONE_INPUT[0]:
        one = split.inputPartition()
        return [one.get()] if one.isDefined() else []
    many = split.inputPartitions()
    return [many.apply(i) for i in range(many.size())]
