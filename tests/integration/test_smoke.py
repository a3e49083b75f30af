"""The stack end to end: kafka-python produces, Spark's official Kafka connector reads."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path


def test_spark_reads_kafka_through_the_official_connector(spark, kafka, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    values = [f"v{i}" for i in range(300)]
    kafka.produce(topic, values)  # round-robin: 100 records per partition

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName("smoke_" + topic.replace("-", "_")[-8:])
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    try:
        rows = spark.sql(f"SELECT value FROM {query.name}").collect()
        assert Counter(r.value for r in rows) == Counter(values)

        progress = query.lastProgress
        kafka_sources = [s for s in progress["sources"] if s["description"].startswith("KafkaV2")]
        assert len(kafka_sources) == 1
        end = kafka_sources[0]["endOffset"]
        if isinstance(end, str):
            end = json.loads(end)
        assert end == {topic: {"0": 100, "1": 100, "2": 100}}
        if os.environ.get("OFFSET_LEDGER_CAPTURE_PROGRESS"):
            # How tests/fixtures/progress_kafka.json was captured.
            Path(os.environ["OFFSET_LEDGER_CAPTURE_PROGRESS"]).write_text(progress.prettyJson)
    finally:
        query.stop()
        spark.catalog.dropTempView(query.name)
