"""``offset_ledger.Pipeline`` end to end: real Kafka, real Postgres, real Spark reading with format("kafka").

The query is built only from what ``Pipeline.start`` hands back (the configured reader and the
checkpoint); the oracle is the topic itself: across every run, each produced record is processed
exactly once (none lost, none read twice), through a resumed checkpoint, a deleted one and an upgrade.
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

from offset_ledger import Pipeline
from offset_ledger.ledger.tables import checkpoint_generations
from offset_ledger.operate.pipeline import PipelineStart
from tests.integration.test_authority import _positions
from tests.integration.test_restart import _rows, _values
from tests.integration.test_sink_remote_target import target_dsn  # noqa: F401 - fixture


def _run(spark, pipeline: Pipeline, root: Path, spool: Path, *,  # type: ignore[no-untyped-def]
         max_per_trigger: int | None = None) -> tuple[PipelineStart, dict[int, Counter]]:
    """One deploy: the pipeline's listener, ``start``, a foreachBatch sink, to the end of what is available."""
    seen: dict[int, Counter] = {}

    def sink(df, batch_id):  # type: ignore[no-untyped-def]
        seen[batch_id] = Counter(r.value for r in df.collect())

    listener = pipeline.listener(spool_dir=spool)
    spark.streams.addListener(listener)
    try:
        reader = spark.readStream
        if max_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(max_per_trigger))
        started = pipeline.start(reader, checkpoint_root=str(root))
        df = started.load().selectExpr("CAST(value AS STRING) AS value")
        query = started.write_stream(df).foreachBatch(sink).trigger(availableNow=True).start()
        try:
            assert query.awaitTermination(180), "the query did not finish"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    return started, seen


def _total(batches: dict[int, Counter]) -> Counter:
    out: Counter = Counter()
    for c in batches.values():
        out += c
    return out


def test_pipeline_start_reads_every_record_once_across_resume_deleted_checkpoint_and_upgrade(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    root, spool = tmp_path / "checkpoints", tmp_path / "spool"

    def deploy(version: str) -> Pipeline:
        return Pipeline("orders", topics=[topic], dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers,
                        app_version=version)

    produced: Counter = Counter()
    processed: Counter = Counter()

    # 1: first run, several micro-batches (the restart must follow the last committed one).
    kafka.produce(topic, _values("a", 30))
    produced += Counter(_values("a", 30))
    first, batches = _run(spark, deploy("1.0"), root, spool, max_per_trigger=9)
    assert first.plan.fresh_checkpoint and first.plan.generation == 1 and len(batches) >= 3
    assert first.reader is not None and first.checkpoint_location.startswith(str(root) + "/gen-1-")
    processed += _total(batches)
    assert processed == produced
    assert _positions(pg_dsn) == kafka.end_offsets(topic)

    # 2: same version, nothing pending: Spark resumes generation 1's checkpoint.
    kafka.produce(topic, _values("b", 30))
    produced += Counter(_values("b", 30))
    second, batches = _run(spark, deploy("1.0"), root, spool)
    assert not second.plan.fresh_checkpoint and second.checkpoint_location == first.checkpoint_location
    processed += _total(batches)
    assert processed == produced and max(processed.values()) == 1
    assert _positions(pg_dsn) == kafka.end_offsets(topic)

    # 3: the checkpoint is gone (lost volume, cleaned by hand): the plan says so and opens a fresh
    # generation (Spark's new query begins its batch ids at 0 again; they must not be generation
    # 1's) at the ledger's positions, which start() set as startingOffsets.
    shutil.rmtree(first.checkpoint_location)
    before = _positions(pg_dsn)
    kafka.produce(topic, _values("c", 30))
    produced += Counter(_values("c", 30))
    third, batches = _run(spark, deploy("1.0"), root, spool)
    assert third.plan.fresh_checkpoint and third.checkpoint_location.startswith(str(root) + "/gen-2-")
    assert third.plan.starting_offsets == {topic: {str(p): o for p, o in before.items()}}
    assert [f.kind for f in third.plan.findings] == ["checkpoint_lost"]
    processed += _total(batches)
    assert processed == produced and max(processed.values()) == 1
    assert _positions(pg_dsn) == kafka.end_offsets(topic)

    # 4: an upgrade: a fresh generation starting exactly after the last committed batch.
    kafka.produce(topic, _values("d", 30))
    produced += Counter(_values("d", 30))
    fourth, batches = _run(spark, deploy("2.0"), root, spool)
    assert fourth.plan.fresh_checkpoint and fourth.checkpoint_location.startswith(str(root) + "/gen-3-")
    assert [f.kind for f in fourth.plan.findings] == []  # generation 2's checkpoint is its own query's
    processed += _total(batches)
    assert processed == produced and max(processed.values()) == 1  # no record lost or read twice
    assert _positions(pg_dsn) == kafka.end_offsets(topic)

    gens = sorted(_rows(pg_dsn, checkpoint_generations), key=lambda r: r.generation)
    assert [(g.generation, g.app_version, g.reason) for g in gens] == [
        (1, "1.0", "first"), (2, "1.0", "checkpoint_lost"), (3, "2.0", "app_version")]


def test_a_pipeline_with_a_remote_sink_target_restarts_through_plan_with_its_sinks(
        spark, kafka, pg_dsn: str, target_dsn: str, tmp_path: Path) -> None:
    """``Pipeline.start(..., sinks=[sink])`` (a TypeError before issue 36): the target committed a batch the
    ledger never heard of; the upgrade reconciles it before planning. Oracle: the topic's records, each
    exactly once in the target."""
    from dataclasses import replace

    from offset_ledger.sinks import PostgresSink
    from tests.integration.sink_helper import create_target, target_values
    from tests.integration.test_sink_remote_target import _LostBeforeTheLedger, _target_sequences

    topic = kafka.create_topic(partitions=2)
    produced = _values("s", 50)
    kafka.produce(topic, produced)
    create_target(target_dsn, "orders_out")
    orders = Pipeline("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=pg_dsn, app_version="1")
    root = str(tmp_path / "ck")

    def deploy(pipeline: Pipeline, sink: PostgresSink, **overrides: object) -> tuple[PipelineStart, bool]:
        started = pipeline.start(spark.readStream.option("maxOffsetsPerTrigger", "10"), checkpoint_root=root,
                                 sinks=[sink], **overrides)
        df = started.load().selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset")
        query = (started.write_stream(df).foreachBatch(sink.bind(started.checkpoint_location))
                 .trigger(availableNow=True).start())
        from pyspark.errors import StreamingQueryException

        try:
            query.awaitTermination(180)
        except StreamingQueryException:  # the injected crash, as Spark reports it
            return started, False
        return started, query.exception() is None

    lost = _LostBeforeTheLedger(3, table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    _, finished = deploy(orders, lost, first_run="earliest")
    assert not finished and _target_sequences(target_dsn) == [1, 2, 3]
    assert sum(_positions(pg_dsn).values()) == 20  # the ledger heard of two batches

    sink = PostgresSink(table="orders_out", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    started, finished = deploy(replace(orders, app_version="2"), sink)
    assert finished and started.plan.fresh_checkpoint
    assert [f.kind for f in started.plan.findings if f.kind == "sink_reconciled"] == ["sink_reconciled"]
    assert sum(started.plan.starting_offsets[topic].values()) == 30  # after the batch only the target had
    assert target_values(target_dsn, "orders_out") == Counter(produced)
    assert sum(_positions(pg_dsn).values()) == 50
