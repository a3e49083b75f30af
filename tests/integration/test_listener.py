"""OffsetLedgerListener against real Spark reading real Kafka, writing to real Postgres."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine

from offset_ledger import OffsetLedgerListener
from offset_ledger.devstack.postgres import Postgres
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets, batches, findings, listener_health, positions, runs
from offset_ledger.rules.progress import is_kafka_source

Rows = list[tuple[int, int, str, int, int | None, int]]


@pytest.fixture
def listeners(spark, tmp_path: Path) -> Iterator[list[OffsetLedgerListener]]:  # type: ignore[no-untyped-def]
    """Listeners a test registers; removed from the session and closed afterwards."""
    made: list[OffsetLedgerListener] = []
    yield made
    for listener in made:
        spark.streams.removeListener(listener)
        listener.close(10)


def register(spark, listeners: list, tmp_path: Path, **kw: Any) -> OffsetLedgerListener:  # type: ignore[no-untyped-def]
    listener = OffsetLedgerListener(spool_dir=tmp_path / f"spool-{len(listeners)}", **kw)
    spark.streams.addListener(listener)
    listeners.append(listener)
    return listener


def kafka_stream(spark, kafka, topic: str, max_per_trigger: int | None = None):  # type: ignore[no-untyped-def]
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", topic)
              .option("startingOffsets", "earliest"))
    if max_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_per_trigger))
    return reader.load().selectExpr("CAST(value AS STRING) AS value")


_CHECKPOINTS: dict[str, Path] = {}  # query id -> its checkpoint, for the oracle's batch-0 starts


def start(df, checkpoint: Path, name: str | None = None, trigger: str | None = None):  # type: ignore[no-untyped-def]
    writer = df.writeStream.format("noop").option("checkpointLocation", str(checkpoint))
    if name:
        writer = writer.queryName(name)
    if trigger:
        writer = writer.trigger(processingTime=trigger)
    query = writer.start()
    _CHECKPOINTS[str(query.id)] = checkpoint
    return query


def _initial_offsets(query, index: int) -> dict[str, dict[str, int]]:  # type: ignore[no-untyped-def]
    """Where Spark began source ``index`` of a new query: the JSON line of ``sources/<index>/0``, which
    Spark writes before batch 0 (its progress event reports that batch's start as null)."""
    text = (_CHECKPOINTS[str(query.id)] / "sources" / str(index) / "0").read_text(encoding="utf-8")
    return json.loads(next(line for line in text.splitlines() if line.lstrip().startswith("{")))


def spark_rows(query) -> Rows:  # type: ignore[no-untyped-def]
    """(batch id, source index, topic, partition, from, until) of every data batch Spark ran.

    The starts are Spark's own: the progress event's ``startOffset``, or for batch 0 of a new query
    (reported as null) the initial offsets Spark wrote in the checkpoint.
    """
    rows: dict[tuple[int, int, str, int], tuple[int | None, int]] = {}
    for progress in query.recentProgress:
        doc = json.loads(progress.json)
        batch: dict[tuple[int, int, str, int], tuple[int | None, int]] = {}
        for index, source in enumerate(doc["sources"]):
            if not is_kafka_source(source["description"]) or source.get("endOffset") is None:
                continue
            start_offsets = _as_map(source.get("startOffset"))
            if start_offsets is None and doc["batchId"] == 0:
                start_offsets = _initial_offsets(query, index)
            start_offsets = start_offsets or {}
            for topic, parts in _as_map(source["endOffset"]).items():
                for partition, until in parts.items():
                    since = start_offsets.get(topic, {}).get(partition)
                    batch[(doc["batchId"], index, topic, int(partition))] = (since, until)
        if doc["numInputRows"] == 0 and all(since == until for since, until in batch.values()):
            continue  # a report of a trigger that read nothing
        rows.update(batch)
    return sorted((*k, *v) for k, v in rows.items())


def _as_map(value: Any) -> dict | None:
    return json.loads(value) if isinstance(value, str) else value


def ledger_rows(engine: Engine, query_id: str) -> Rows:
    with engine.connect() as conn:
        result = conn.execute(select(batch_offsets).where(batch_offsets.c.query_id == query_id))
        return sorted((r.batch_id, r.source_index, r.topic, r.partition, r.from_offset, r.until_offset)
                      for r in result)


def position_map(engine: Engine, pipeline: str) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        return {(r.topic, r.partition): r.next_offset
                for r in conn.execute(select(positions).where(positions.c.pipeline == pipeline))}


def finding_kinds(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return [r.kind for r in conn.execute(select(findings).order_by(findings.c.id))]


def produce_rounds(kafka, query, topic: str, rounds: int, per_round: int) -> None:  # type: ignore[no-untyped-def]
    for r in range(rounds):
        kafka.produce(topic, [f"r{r}-{i}" for i in range(per_round)])
        query.processAllAvailable()


# ----------------------------------------------------------------------------- tests


def test_ledger_holds_exactly_the_batches_spark_reported(spark, kafka, ledger, pg_dsn, listeners,  # type: ignore[no-untyped-def]
                                                         tmp_path: Path) -> None:
    listener = register(spark, listeners, tmp_path, dsn=pg_dsn, app_version="1.0")
    topic = kafka.create_topic(partitions=3)
    name = "orders_" + uuid.uuid4().hex[:6]
    query = start(kafka_stream(spark, kafka, topic, max_per_trigger=40), tmp_path / "cp", name)
    try:
        produce_rounds(kafka, query, topic, rounds=2, per_round=60)
        assert listener.flush(60)
        expected = spark_rows(query)
    finally:
        query.stop()
    assert listener.flush(60)
    assert len({r[0] for r in expected}) >= 4  # several micro-batches
    assert ledger_rows(ledger, str(query.id)) == expected
    assert position_map(ledger, name) == {(topic, p): o for p, o in kafka.end_offsets(topic).items()}
    assert finding_kinds(ledger) == []
    with ledger.connect() as conn:
        run = conn.execute(select(runs)).one()
        assert (run.query_id, run.pipeline, run.consumer_group, run.app_version) == (
            str(query.id), name, name, "1.0")
        assert run.terminated_at is not None and run.exception is None
        assert run.last_batch_id == max(r[0] for r in expected)
    health = listener.health()
    assert health.failed == 0 and health.spilled == 0 and health.written >= len({r[0] for r in expected})
    assert health.callback_p99_ms is not None  # measured on Spark's listener thread, JSON fetch included
    print(f"callback p99 on Spark's listener thread: {health.callback_p99_ms} ms")


def test_two_queries_one_of_them_reading_two_kafka_sources(spark, kafka, ledger, pg_dsn, listeners,  # type: ignore[no-untyped-def]
                                                           tmp_path: Path) -> None:
    listener = register(spark, listeners, tmp_path, dsn=pg_dsn)
    a, b, c = kafka.create_topic(partitions=2), kafka.create_topic(partitions=1), kafka.create_topic(partitions=2)
    for topic, n in ((a, 20), (b, 7), (c, 12)):
        kafka.produce(topic, [f"v{i}" for i in range(n)])
    suffix = uuid.uuid4().hex[:6]
    single = start(kafka_stream(spark, kafka, a), tmp_path / "cp-single", "single_" + suffix)
    union = start(kafka_stream(spark, kafka, b).union(kafka_stream(spark, kafka, c)),
                  tmp_path / "cp-union", "union_" + suffix)
    try:
        for query in (single, union):
            query.processAllAvailable()
        kafka.produce(c, ["late"] * 4)
        union.processAllAvailable()
        assert listener.flush(60)
        expected = {q.name: spark_rows(q) for q in (single, union)}
    finally:
        single.stop()
        union.stop()
    assert listener.flush(60)
    assert ledger_rows(ledger, str(single.id)) == expected[single.name]
    assert ledger_rows(ledger, str(union.id)) == expected[union.name]
    assert {r[1] for r in expected[union.name]} == {0, 1}  # two distinct Kafka sources
    assert position_map(ledger, single.name) == {(a, 0): 10, (a, 1): 10}
    assert position_map(ledger, union.name) == {(b, 0): 7, (c, 0): 8, (c, 1): 8}
    assert finding_kinds(ledger) == []


def test_query_without_a_name(spark, kafka, ledger, pg_dsn, listeners, tmp_path: Path,  # type: ignore[no-untyped-def]
                              caplog: pytest.LogCaptureFixture) -> None:
    by_name = register(spark, listeners, tmp_path, dsn=pg_dsn)
    explicit = register(spark, listeners, tmp_path, dsn=pg_dsn, pipeline="payments",
                        consumer_group="payments-etl")
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, ["x"] * 5)
    with caplog.at_level(logging.WARNING, logger="offset_ledger"):
        query = start(kafka_stream(spark, kafka, topic), tmp_path / "cp")
        try:
            produce_rounds(kafka, query, topic, rounds=2, per_round=3)
        finally:
            query.stop()
        assert by_name.flush(60) and explicit.flush(60)
    assert query.isActive is False and query.exception() is None
    assert sum("has no name" in r.getMessage() and str(query.id) in r.getMessage() for r in caplog.records) == 1
    assert by_name.health().skipped > 0 and by_name.health().written == 0
    with ledger.connect() as conn:
        assert {(r.pipeline, r.consumer_group) for r in conn.execute(select(batches))} == {
            ("payments", "payments-etl")}
    assert position_map(ledger, "payments") == {(topic, 0): 11}


def test_restart_on_the_same_checkpoint_continues_the_same_query_id(spark, kafka, ledger, pg_dsn,  # type: ignore[no-untyped-def]
                                                                    listeners, tmp_path: Path) -> None:
    listener = register(spark, listeners, tmp_path, dsn=pg_dsn, pipeline="restarting")
    topic = kafka.create_topic(partitions=2)
    checkpoint = tmp_path / "cp"
    first = start(kafka_stream(spark, kafka, topic), checkpoint, "restarting_" + uuid.uuid4().hex[:6])
    try:
        produce_rounds(kafka, first, topic, rounds=2, per_round=10)
        before = spark_rows(first)
    finally:
        first.stop()
    kafka.produce(topic, ["after"] * 6)
    second = start(kafka_stream(spark, kafka, topic), checkpoint, first.name)
    try:
        second.processAllAvailable()
        assert listener.flush(60)  # compares with the new run, not the stopped one
        after = spark_rows(second)
        assert ledger_rows(ledger, str(first.id)) == sorted(before + after)
    finally:
        second.stop()
    assert listener.flush(60)
    assert second.id == first.id and second.runId != first.runId
    assert min(r[0] for r in after) > max(r[0] for r in before)
    assert ledger_rows(ledger, str(first.id)) == sorted(before + after)
    assert position_map(ledger, "restarting") == {(topic, 0): 13, (topic, 1): 13}
    assert finding_kinds(ledger) == []
    with ledger.connect() as conn:
        recorded = list(conn.execute(select(runs)))
    assert {r.run_id for r in recorded} == {str(first.runId), str(second.runId)}
    assert {r.checkpoint_location for r in recorded} == {f"file:{checkpoint.resolve()}"}  # as Spark resolved it


def test_duplicate_event_is_idempotent_and_stale_event_is_a_finding(spark, kafka, ledger, pg_dsn,  # type: ignore[no-untyped-def]
                                                                     listeners, tmp_path: Path) -> None:
    listener = register(spark, listeners, tmp_path, dsn=pg_dsn, pipeline="dupes")
    topic = kafka.create_topic(partitions=1)
    query = start(kafka_stream(spark, kafka, topic), tmp_path / "cp", "dupes_" + uuid.uuid4().hex[:6])
    try:
        produce_rounds(kafka, query, topic, rounds=3, per_round=5)
        progresses = [json.loads(p.json) for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert listener.flush(60)
    recorded = ledger_rows(ledger, str(query.id))
    # Spark's own events delivered again: nothing changes.
    for doc in progresses:
        listener.accept_json("progress", json.dumps(doc))
    assert listener.flush(30)
    assert ledger_rows(ledger, str(query.id)) == recorded
    assert finding_kinds(ledger) == []
    # A zombie instance (another query id) reports the first batch's end as a new batch: stale.
    zombie = dict(progresses[0], id=str(uuid.uuid4()), runId=str(uuid.uuid4()), batchId=99)
    listener.accept_json("progress", json.dumps(zombie))
    assert listener.flush(30)
    assert finding_kinds(ledger) == ["regression"]
    assert position_map(ledger, "dupes") == {(topic, 0): 15}


def test_postgres_down_while_the_query_runs(spark, kafka, listeners, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A dedicated Postgres (never the shared one) is stopped mid-run and started on the same port."""
    pg = Postgres(tmp_path / "pg")
    dsn, _pid = pg.start()
    port = int(dsn.rsplit(":", 1)[1].split("/")[0])
    try:
        engine = make_engine(dsn)
        ensure_schema(engine)
        listener = register(spark, listeners, tmp_path, dsn=dsn, pipeline="outage", max_backoff=0.5,
                            queue_size=3, health_interval=0.5)
        topic = kafka.create_topic(partitions=2)
        query = start(kafka_stream(spark, kafka, topic, max_per_trigger=10), tmp_path / "cp",
                      "outage_" + uuid.uuid4().hex[:6], trigger="100 milliseconds")
        try:
            produce_rounds(kafka, query, topic, rounds=2, per_round=10)
            assert listener.flush(60)
            pg.stop()
            produce_rounds(kafka, query, topic, rounds=4, per_round=20)  # 8+ batches while down
            deadline = time.monotonic() + 30
            while listener.health().retried == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert query.isActive and query.exception() is None
            down = listener.health()
            assert down.retried > 0 and down.pending > 0 and down.spilled > 0
            pg.start(port=port)
            produce_rounds(kafka, query, topic, rounds=1, per_round=10)
            assert listener.flush(120)
            expected = spark_rows(query)
        finally:
            query.stop()
        assert listener.flush(60)
        engine.dispose()
        engine = create_engine(dsn)
        got = ledger_rows(engine, str(query.id))
        assert got == expected
        batch_ids = sorted({r[0] for r in got})
        assert batch_ids == list(range(batch_ids[0], batch_ids[-1] + 1))  # every batch, no hole
        assert finding_kinds(engine) == []  # every batch starts where the previous one ended
        assert position_map(engine, "outage") == {(topic, p): o for p, o in kafka.end_offsets(topic).items()}
        listener.close(10)
        with engine.connect() as conn:
            health = conn.execute(select(listener_health)).one()
        assert health.retried > 0 and health.spilled > 0 and health.failed == 0
        engine.dispose()
    finally:
        pg.stop()


def test_a_failing_query_records_its_exception(spark, kafka, ledger, pg_dsn, listeners,  # type: ignore[no-untyped-def]
                                               tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    listener = register(spark, listeners, tmp_path, dsn=pg_dsn, pipeline="failing")
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, ["x"] * 3)

    def explode(df, batch_id):  # type: ignore[no-untyped-def]
        raise ValueError(f"sink exploded in batch {batch_id}")

    query = (kafka_stream(spark, kafka, topic).writeStream.foreachBatch(explode)
             .option("checkpointLocation", str(tmp_path / "cp")).start())
    with pytest.raises(StreamingQueryException):
        query.awaitTermination(120)
    assert listener.flush(60)
    with ledger.connect() as conn:
        run = conn.execute(select(runs)).one()
        assert run.query_id == str(query.id) and run.terminated_at is not None
        assert "sink exploded in batch 0" in (run.exception or "")
        # The batch never committed, so nothing was recorded as read.
        assert conn.execute(select(batches)).all() == []
