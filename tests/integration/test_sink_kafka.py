"""The Kafka sink on the real stack (Kafka, Postgres, PySpark): every input record's output exactly once.

The oracle is a ``read_committed`` consumer of the output topic: each input value is unique, and its
output must be there once, with its key and headers, after the driver died between Kafka's commits and
the ledger's (twice), a re-run on the same checkpoint and an upgrade on a clean one. The ledger must say
what Kafka says: ``offset-ledger verify`` exits 0 and the sink's group stands at the ledger's positions.
The SIGKILL loop over a standalone cluster is ``test_sink_kafka_crashes.py`` (long).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from offset_ledger import start_from_ledger
from offset_ledger.errors import SinkInputRefused
from offset_ledger.sinks import KafkaSink
from tests.integration.kafka_sink_helper import (
    group_positions,
    ledger_positions,
    produce_keyed,
    read_topic,
    sink_outputs,
)
from tests.integration.test_adopt_replay import _cli
from tests.integration.test_restart import _values

#: The job's transform: the output keeps the input's key, tags the value, names its source in a header,
#: and keeps topic, partition, offset (the source record) for the sink.
TRANSFORM = ["topic", "partition", "offset", "key",
             "CAST(concat('out-', CAST(value AS STRING)) AS BINARY) AS value",
             "array(named_struct('key', 'src', 'value', CAST(concat(topic, ':', partition, ':', offset) AS BINARY)))"
             " AS headers"]


class _DiesBeforeTheLedger(KafkaSink):
    """The driver dies between Kafka's commits of its n-th batch and the ledger's record of it."""

    def __init__(self, die_at: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Lists, shared with the copy bind() makes (the copy is the one foreachBatch calls).
        self.die_at, self.records, self.verdicts, self.runs, self.paths = die_at, [0], [], [], []

    def _record(self, *args: Any, **kwargs: Any) -> None:
        self.records[0] += 1
        if self.records[0] == self.die_at:
            raise RuntimeError("driver lost between Kafka's commits and the ledger's")
        super()._record(*args, **kwargs)

    def write(self, df: Any, batch_id: int) -> Any:
        try:
            done = super().write(df, batch_id)
        finally:
            self.verdicts.append((batch_id, self.last.verdict if self.last else None))
            self.runs.append(list(self.last_runs))
            self.paths.append(self.last_path)
        return done


def _run(spark, bootstrap: str, topic: str, plan, sink,  # type: ignore[no-untyped-def]
         select: list[str] = TRANSFORM) -> bool:
    from pyspark.errors import StreamingQueryException

    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("startingOffsets", plan.starting_offsets_json).option("maxOffsetsPerTrigger", "12").load()
          .selectExpr(*select))
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", plan.checkpoint_location)
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except StreamingQueryException:
        return False
    return query.exception() is None


def test_kafka_sink_writes_each_output_once_across_a_lost_ledger_record_a_rerun_and_an_upgrade(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    source = kafka.create_topic(partitions=3)
    out = kafka.create_topic(partitions=4)
    bootstrap = kafka.bootstrap_servers
    produced = _values("a", 60)
    produce_keyed(bootstrap, source, produced, 3)
    root = str(tmp_path / "ck")

    def sink(die_at: int | None) -> _DiesBeforeTheLedger:
        return _DiesBeforeTheLedger(die_at, topic=out, bootstrap_servers=bootstrap, pipeline="orders", dsn=pg_dsn)

    def plan(version: str, s: KafkaSink):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [source], bootstrap_servers=bootstrap, checkpoint_root=root,
                                 app_version=version, dsn=pg_dsn, first_run="earliest", sinks=[s])

    first = sink(2)
    p1 = plan("1", first)
    assert not _run(spark, bootstrap, source, p1, first.bind(p1.checkpoint_location))
    # Kafka holds batches 0 and 1 (two of 12 records each), the ledger batch 0 only.
    assert len(read_topic(bootstrap, out)) == 24 and [r.batch_id for r in sink_outputs(pg_dsn, first.name)] == [0]

    # The same checkpoint: the restart records batch 1 from the group's marks; Spark's re-run of it is skipped.
    second = sink(2)
    p2 = plan("1", second)
    assert not p2.fresh_checkpoint and "sink_reconciled" in {f.kind for f in p2.findings}
    assert _run(spark, bootstrap, source, p2, second.bind(p2.checkpoint_location)) is False
    assert second.verdicts[0] == (1, "skip") and second.verdicts[1] == (2, "commit")
    # It died again before the ledger heard of batch 3; a re-run on the same checkpoint without a restart's
    # reconcile writes nothing twice: every row is below the group's position.
    third = sink(None)
    assert _run(spark, bootstrap, source, p2, third.bind(p2.checkpoint_location))
    assert third.verdicts[0] == (3, "commit")
    # The re-run of batch 3 skipped every row Kafka already held, and wrote none.
    assert third.runs[0] and all(r.written == 0 and r.skipped == 4 for r in third.runs[0]), third.runs[0]

    # An upgrade on a clean checkpoint, more records first.
    more = _values("b", 30)
    produce_keyed(bootstrap, source, more, 3)
    produced += more
    upgrade = sink(2)
    p3 = plan("2", upgrade)
    assert p3.fresh_checkpoint
    assert not _run(spark, bootstrap, source, p3, upgrade.bind(p3.checkpoint_location))
    last = sink(None)
    p4 = plan("3", last)  # an upgrade right after a batch the ledger lacks: recorded, planned past
    assert p4.fresh_checkpoint and "sink_reconciled" in {f.kind for f in p4.findings}
    assert _run(spark, bootstrap, source, p4, last.bind(p4.checkpoint_location))

    # Each Spark partition of these batches' Kafka scan is one source partition: no shuffle grouped the rows.
    # ("" for a batch skipped or fenced before any write.)
    assert set(first.paths + second.paths + third.paths + upgrade.paths + last.paths) - {""} == {"scan"}

    # The oracle: each input's output once, with its key and its source header.
    records = read_topic(bootstrap, out)
    values = Counter(r.value().decode() for r in records)
    assert values == Counter(f"out-{v}" for v in produced)
    keys = {r.value().decode(): r.key().decode() for r in records}
    assert keys == {f"out-{v}": f"k{i % 5}" for i, v in enumerate(produced)}
    assert all(r.headers()[0][0] == "src" and r.headers()[0][1].decode().startswith(f"{source}:") for r in records)
    outputs = sink_outputs(pg_dsn, last.name)
    assert [r.sequence for r in outputs] == list(range(1, len(outputs) + 1))
    assert sum(r.row_count or 0 for r in outputs) <= len(produced)
    # The ledger and Kafka say the same: the sink's group stands at the ledger's positions.
    assert group_positions(bootstrap, last.group_id) == ledger_positions(pg_dsn, "orders")
    assert sum(ledger_positions(pg_dsn, "orders").values()) == len(produced)
    verify = _cli("verify", "orders", "--dsn", pg_dsn)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_batch_without_its_source_columns_is_refused_before_anything_is_written(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    source = kafka.create_topic(partitions=1)
    out = kafka.create_topic(partitions=1)
    bootstrap = kafka.bootstrap_servers
    produce_keyed(bootstrap, source, _values("x", 5), 1)
    s = KafkaSink(topic=out, bootstrap_servers=bootstrap, pipeline="agg", dsn=pg_dsn)
    p = start_from_ledger("agg", [source], bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ck"),
                          app_version="1", dsn=pg_dsn, first_run="earliest", sinks=[s])
    seen: list[BaseException] = []
    bound = s.bind(p.checkpoint_location)

    def write(df, batch_id):  # type: ignore[no-untyped-def]
        try:
            bound.write(df, batch_id)
        except SinkInputRefused as exc:
            seen.append(exc)
            raise

    # A projection that drops the source columns (as an aggregation does): its rows name no source record.
    assert not _run(spark, bootstrap, source, p, write, ["CAST(value AS STRING) AS value"])
    assert seen and "no topic, partition, offset column(s)" in str(seen[0])
    assert read_topic(bootstrap, out) == []
    assert sink_outputs(pg_dsn, s.name) == []


def test_a_scan_that_splits_a_source_partition_is_grouped_by_the_shuffle_and_written_once(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    """``minPartitions`` splits each source partition's range over several Spark partitions: the sink must see it
    (the lineage check) and group the rows by a shuffle, else two tasks would commit one partition's position."""
    source = kafka.create_topic(partitions=2)
    out = kafka.create_topic(partitions=2)
    bootstrap = kafka.bootstrap_servers
    produced = _values("m", 40)
    produce_keyed(bootstrap, source, produced, 2)
    s = KafkaSink(topic=out, bootstrap_servers=bootstrap, pipeline="split", dsn=pg_dsn)
    p = start_from_ledger("split", [source], bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ck"),
                          app_version="1", dsn=pg_dsn, first_run="earliest", sinks=[s])
    bound = s.bind(p.checkpoint_location)
    paths: list[str] = []

    def write(df, batch_id):  # type: ignore[no-untyped-def]
        bound.write(df, batch_id)
        paths.append(bound.last_path)

    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
          .option("startingOffsets", p.starting_offsets_json).option("maxOffsetsPerTrigger", "20")
          .option("minPartitions", "6").load().selectExpr(*TRANSFORM))
    query = (df.writeStream.foreachBatch(write).option("checkpointLocation", p.checkpoint_location)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    assert paths and set(paths) == {"shuffle"}
    values = Counter(r.value().decode() for r in read_topic(bootstrap, out))
    assert values == Counter(f"out-{v}" for v in produced)
    assert group_positions(bootstrap, s.group_id) == ledger_positions(pg_dsn, "split")


class _Timed(KafkaSink):
    """Keeps each batch's timings (``last_timings`` holds the last batch's only)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timings: list[dict[str, float]] = []  # shared with the copy bind() makes

    def write(self, df: Any, batch_id: int) -> Any:
        done = super().write(df, batch_id)
        self.timings.append(dict(self.last_timings))
        return done


def test_a_source_partition_keeps_its_producer_in_the_executors_owner_whichever_worker_runs_its_task(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    """Spark hands a partition's task to whichever Python worker is free; the executor's one producer owner
    (``sinks/_kafka_owner.py``) keeps each partition's producer across batches all the same: after a partition's
    first batch no task makes a new producer (each would fence the kept one, and cost 55-505 ms)."""
    source = kafka.create_topic(partitions=3)
    out = kafka.create_topic(partitions=2)
    bootstrap = kafka.bootstrap_servers
    produced = _values("o", 72)
    produce_keyed(bootstrap, source, produced, 3)
    sink = _Timed(topic=out, bootstrap_servers=bootstrap, pipeline="owned", dsn=pg_dsn)
    plan = start_from_ledger("owned", [source], bootstrap_servers=bootstrap, checkpoint_root=str(tmp_path / "ck"),
                             dsn=pg_dsn, first_run="earliest", sinks=[sink])
    assert _run(spark, bootstrap, source, plan, sink.bind(plan.checkpoint_location))
    assert len(sink.timings) == 6  # 72 records, 12 a batch
    new = [t["tasks_new_producers"] for t in sink.timings]
    assert new[0] == 3 and new[1:] == [0] * 5, new
    assert all(t["tasks_connect_ms"] > 0 for t in sink.timings)  # every task went through the owner
    assert Counter(r.value().decode() for r in read_topic(bootstrap, out)) == Counter(
        f"out-{v}" for v in produced)
