"""Issue 41: records retention deletes while a job runs with ``failOnDataLoss=false`` are reported as lost.

Real Spark, Kafka and Postgres with the real listener. A 1-partition topic of large records (60 KB:
the executor's consumer buffers a few, never a whole batch, so the deletion is not hidden), read 50
per batch; while batch 1 runs, ``DeleteRecords`` removes what the job has not read yet. Spark skips
the deleted offsets and the recorded (planned) ranges still tile; the batches' row counts tell.
Oracle: the offsets the job's output holds against the offsets produced. A compacted topic and a
transactional topic read with ``read_committed`` (where rows < offsets by design) give no false loss.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from sqlalchemy import create_engine, text

from offset_ledger.operate import operations_metrics, reads
from offset_ledger import OffsetLedgerListener
from offset_ledger.api.metrics import render_metrics
from offset_ledger.ledger.engine import make_engine
from offset_ledger.operate.operations import Operations
from tests.integration.test_adopt_replay import _cli

VALUE = b"x" * 60_000


def _run(spark, pg_dsn: str, kafka, topic: str, tmp_path: Path, *, per_trigger: int,  # type: ignore[no-untyped-def]
         during=None, options: dict[str, str] | None = None) -> list[int]:
    """Run the query to the end of the topic with the listener; the offsets its output holds."""
    read: list[int] = []

    def sink(df, batch_id):  # type: ignore[no-untyped-def]
        read.extend(r.offset for r in df.select("offset").collect())
        if during is not None:
            during(batch_id)

    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    try:
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                  .option("subscribe", topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", str(per_trigger)).option("failOnDataLoss", "false"))
        for k, v in (options or {}).items():
            reader = reader.option(k, v)
        query = (reader.load().writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180), "the query did not finish"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    return read


def _verify(pg_dsn: str, kafka, name: str) -> tuple[int, dict, str]:  # type: ignore[no-untyped-def]
    """verify's exit code, JSON report and stderr; the table too (kept for the docs) when capturing."""
    args = ("verify", "orders", "--dsn", pg_dsn, "--bootstrap-server", kafka.bootstrap_servers)
    doc = _cli(*args, "--format", "json")
    where = os.environ.get("OFFSET_LEDGER_VERIFY_CAPTURE")
    if where:
        table = _cli(*args)
        assert table.returncode == doc.returncode, (table.stderr, doc.stderr)
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"loss-{name}.txt").write_text(f"{table.stdout}{table.stderr}exit {table.returncode}\n")
    return doc.returncode, json.loads(doc.stdout), doc.stderr


def _lost_as_served(pg_dsn: str, kafka) -> tuple[str | None, int, str]:  # type: ignore[no-untyped-def]
    """(the pipeline's status, records lost) as the pipelines list, the console and /metrics get them; /metrics' text."""
    ops = Operations(make_engine(pg_dsn), bootstrap_servers=kafka.bootstrap_servers)
    try:
        (summary,) = reads.list_pipelines(ops)
        return summary.status, summary.records_lost, render_metrics(operations_metrics.metrics(ops))
    finally:
        ops.close()


def _shortfall_findings(pg_dsn: str) -> list:
    engine = create_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(
                "SELECT batch_id, topic, \"partition\", details FROM findings WHERE kind = 'data_loss' "
                "ORDER BY batch_id")))
    finally:
        engine.dispose()


def test_records_deleted_while_the_job_runs_are_a_loss_with_the_exact_count(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=1)
    for _ in range(300):
        kafka.producer.send(topic, value=VALUE, partition=0)
    kafka.producer.flush()

    def retention(batch_id: int) -> None:
        if batch_id == 1:  # the job stands at 100 (after this batch): retention removes up to 200
            kafka.delete_records(topic, {0: 200})

    read = _run(spark, pg_dsn, kafka, topic, tmp_path, per_trigger=50, during=retention)
    lost = 300 - len(set(read))
    assert len(read) == len(set(read)) and 0 < lost <= 100  # the oracle: what the output lacks

    code, doc, shown = _verify(pg_dsn, kafka, "retention")
    assert code == 6, shown
    losses = [s for s in doc["stretches"] if s["kind"] == "loss"]
    assert all(not s["explained"] for s in losses) and sum(s["records"] for s in losses) == lost, shown
    assert doc["summary"]["recordsLost"] == lost and doc["summary"]["unexplainedGaps"] == 0
    assert f"{lost} record(s) never read" in shown  # the one line on stderr
    found = _shortfall_findings(pg_dsn)
    assert found and sum(f.details["missing"] for f in found) == lost
    assert {(f.topic, f.partition, f.details["per_partition"]) for f in found} == {(topic, 0, True)}

    status, records_lost, metrics = _lost_as_served(pg_dsn, kafka)
    assert (status, records_lost) == ("ERR", lost)
    assert (f'offset_ledger_records_lost_total{{pipeline="orders",consumer_group="orders",topic="{topic}",'
            f'partition="0"}} {lost}') in metrics
    assert 'offset_ledger_status{pipeline="orders",consumer_group="orders",state="ERR"} 1' in metrics


def _compacted_topic(kafka, keys: int, rounds: int) -> str:  # type: ignore[no-untyped-def]
    """A topic whose cleaner has removed superseded keys: fewer records than offsets before the job reads it."""
    topic = f"compact_{os.urandom(3).hex()}"
    kafka.admin.create_topics([NewTopic(topic, 1, 1, topic_configs={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "100"})])
    kafka.created.append(topic)
    kafka.wait_partitions(topic, 1)
    for r in range(rounds):
        for k in range(keys):
            kafka.producer.send(topic, key=f"k{k}".encode(), value=f"v{r}".encode(), partition=0)
        kafka.producer.flush()
        time.sleep(0.3)  # the next append rolls the segment: the older one becomes cleanable
    deadline = time.monotonic() + 90
    end = keys * rounds
    while time.monotonic() < deadline:
        consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, auto_offset_reset="earliest",
                                 consumer_timeout_ms=1000)
        consumer.subscribe([topic])
        got = sum(1 for _ in consumer)
        consumer.close()
        if got < end:
            return topic
        time.sleep(2)
    raise AssertionError("the log cleaner did not compact the topic in time")


@pytest.mark.long
def test_a_compacted_topic_gives_no_false_loss(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = _compacted_topic(kafka, keys=20, rounds=5)
    read = _run(spark, pg_dsn, kafka, topic, tmp_path, per_trigger=40)
    assert len(read) < 100  # compaction removed records under their offsets: rows < offsets
    assert _shortfall_findings(pg_dsn)  # seen at record time ...
    code, doc, shown = _verify(pg_dsn, kafka, "compacted")
    assert code == 0, shown  # ... and explained by the topic's cleanup policy
    losses = [s for s in doc["stretches"] if s["kind"] == "loss"]
    assert losses and all(s["explained"] and s["reasons"][0]["kind"] == "compacted" for s in losses), shown
    status, records_lost, metrics = _lost_as_served(pg_dsn, kafka)
    assert status != "ERR" and records_lost == 0 and "offset_ledger_records_lost_total{" not in metrics


def test_a_transactional_topic_read_committed_gives_no_false_loss(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, transactional_id=f"tx-{topic}")
    producer.init_transactions()
    committed = 0
    for n in range(12):
        producer.begin_transaction()
        for i in range(7):
            producer.send(topic, value=f"{n}-{i}".encode(), partition=0)
        if n % 4 == 3:
            producer.flush()  # in the log, then aborted: records read_committed skips (and a marker)
            producer.abort_transaction()
        else:
            producer.commit_transaction()
            committed += 7
    producer.close()
    read = _run(spark, pg_dsn, kafka, topic, tmp_path, per_trigger=20,
                options={"kafka.isolation.level": "read_committed"})
    assert len(read) == len(set(read)) == committed  # the oracle: every committed record, once
    assert _shortfall_findings(pg_dsn)  # markers and aborted records: rows < offsets at record time
    code, doc, shown = _verify(pg_dsn, kafka, "transactional")
    assert code == 0, shown
    losses = [s for s in doc["stretches"] if s["kind"] == "loss"]
    assert losses and all(s["explained"] for s in losses), shown
    assert {s["reasons"][0]["kind"] for s in losses} == {"transaction_markers"}
    status, records_lost, metrics = _lost_as_served(pg_dsn, kafka)
    assert status != "ERR" and records_lost == 0 and "offset_ledger_records_lost_total{" not in metrics
