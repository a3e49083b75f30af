"""Issue 47, case 3 on the real stack: a Kafka source's loss is not hidden by a ``rate`` source unioned in.

Real Spark, Kafka and Postgres with the real listener. One query unions a 1-partition Kafka topic of
large records (read 50 per batch, ``failOnDataLoss=false``) with a ``rate-micro-batch`` source (200
rows in every batch: the plain ``rate`` source counts whole seconds, so two batches in one second gave
the second none and the case did not happen). While batch 1 runs, ``DeleteRecords`` removes what the job has not read
yet, up to 250: batch 3 reads none of the 50 Kafka offsets it spans while the rate source reads 200
rows, more than the Kafka span, which the old rule (the batch total when every Kafka count is 0)
took as the batch having read everything. Oracle: the Kafka offsets the job's output holds against
the offsets produced. ``long``: 15-45 s of Spark on a busy machine (the rate source never runs dry, so
the query runs until the Kafka source planned to the topic's end).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from offset_ledger import OffsetLedgerListener
from tests.integration.test_retention_loss import VALUE, _shortfall_findings, _verify


@pytest.mark.long
def test_records_deleted_beside_a_rate_source_are_a_loss_of_the_kafka_source(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    topic = kafka.create_topic(partitions=1)
    for _ in range(300):
        kafka.producer.send(topic, value=VALUE, partition=0)
    kafka.producer.flush()
    read: list[int] = []
    rate_rows: dict[int, int] = {}

    def sink(df, batch_id):  # type: ignore[no-untyped-def]
        rows = df.groupBy("src").agg(F.collect_list("n").alias("ns")).collect()
        for r in rows:
            if r.src == "k":
                read.extend(r.ns)
            else:
                rate_rows[batch_id] = len(r.ns)
        if batch_id == 1:  # the job stands at 100 (after this batch): retention removes up to 250
            kafka.delete_records(topic, {0: 250})

    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    try:
        from_kafka = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                      .option("subscribe", topic).option("startingOffsets", "earliest")
                      .option("maxOffsetsPerTrigger", "50").option("failOnDataLoss", "false").load()
                      .select(F.col("offset").alias("n"), F.lit("k").alias("src")))
        from_rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", "200").load()
                     .select(F.col("value").alias("n"), F.lit("r").alias("src")))
        query = (from_kafka.unionByName(from_rate).writeStream.foreachBatch(sink)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(processingTime="500 milliseconds")
                 .start())
        try:
            deadline = time.monotonic() + 120
            done = False
            # A rate source never runs dry (no processAllAvailable): run until the Kafka source planned to its end.
            while not done and time.monotonic() < deadline:
                assert query.exception() is None, query.exception()
                for p in query.recentProgress:
                    for s in json.loads(p.json)["sources"] if hasattr(p, "json") else p["sources"]:
                        end = s.get("endOffset")
                        end = json.loads(end) if isinstance(end, str) else end
                        if isinstance(end, dict) and int(end.get(topic, {}).get("0", -1)) >= 300:
                            done = True
                time.sleep(0.5)
            assert done, "the query did not reach the topic's end"
        finally:
            query.stop()
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()

    lost = 300 - len(set(read))
    assert len(read) == len(set(read)) and 0 < lost <= 150  # the oracle: what the output lacks
    found = _shortfall_findings(pg_dsn)
    said = [(f.batch_id, f.details, rate_rows.get(f.batch_id)) for f in found]
    assert found and sum(f.details["missing"] for f in found) == lost, said
    assert {(f.topic, f.partition, f.details["kind"]) for f in found} == {(topic, 0, "read_shortfall")}
    # The case itself: a batch whose Kafka source read none of its 50 offsets (the consumer's buffer
    # from batch 1 may still serve batch 2 a few) while the rate source read more rows than that.
    assert any(f.details["rows_read"] == 0 and rate_rows.get(f.batch_id, 0) >= f.details["offsets_spanned"]
               for f in found), said
    code, doc, shown = _verify(pg_dsn, kafka, "beside-rate")
    assert code == 6, shown
    losses = [s for s in doc["stretches"] if s["kind"] == "loss"]
    assert sum(s["records"] for s in losses) == lost and doc["summary"]["unexplainedGaps"] == 0, shown
