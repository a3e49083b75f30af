"""Compatibility: what every supported PySpark, Spark Connect and Kafka broker must do with the ledger.

``scripts/test --matrix`` runs the ``compat`` tests once per PySpark version (classic sessions on
3.5 and 4.x, a Spark Connect session on the main version) and the ``kafka_broker`` tests once per
extra broker version; the default run runs them all on the main versions. Everything is real:
Spark reads with the official connector, the broker is Apache Kafka, the ledger is Postgres.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets, positions, runs

pytestmark = pytest.mark.compat
# Spark Connect has one listener path (events over gRPC); classic sessions have two to prove.
BRIDGES = [True] if os.environ.get("OFFSET_LEDGER_TEST_SPARK_CONNECT") else [True, False]


def _is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


@pytest.fixture
def ledger(pg_dsn: str) -> Iterator[Engine]:
    engine = make_engine(pg_dsn)
    ensure_schema(engine)
    yield engine
    engine.dispose()


def _end_offsets(progress: Any) -> dict[str, dict[str, int]]:
    """Spark's own end offsets of the Kafka source in a progress report (a dict or a JSON string)."""
    doc = json.loads(progress.json) if hasattr(progress, "json") else progress
    (source,) = [s for s in doc["sources"] if s["description"].startswith("KafkaV2")]
    end = source["endOffset"]
    return json.loads(end) if isinstance(end, str) else end


def _input_rows(progress: Any) -> int:
    # Summed over the sources: a Connect client's progress objects may leave the total unset.
    return sum(int(source["numInputRows"] or 0) for source in progress["sources"])


def _run(spark: Any, kafka: Any, topic: str, starting: str, checkpoint: str, table: str,
         *, per_trigger: int | None = None) -> tuple[list[str], dict[str, dict[str, int]], int]:
    """Read to the end of what is there into a memory table; (values read, Spark's last endOffset, batches)."""
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", topic)
              .option("startingOffsets", starting))
    if per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
    query = (reader.load().selectExpr("CAST(value AS STRING) AS value")
             .writeStream.format("memory").queryName(table)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the query did not finish"
        assert query.exception() is None, query.exception()
        last = query.lastProgress
        batches = len([p for p in query.recentProgress if _input_rows(p) > 0])
    finally:
        query.stop()
    values = [r.value for r in spark.sql(f"SELECT value FROM {table}").collect()]
    spark.catalog.dropTempView(table)
    assert last is not None, "Spark reported no batch"
    return values, _end_offsets(last), batches


def _positions(engine: Engine, pipeline: str) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    with engine.connect() as conn:
        for r in conn.execute(select(positions).where(positions.c.pipeline == pipeline)):
            found.setdefault(r.topic, {})[str(r.partition)] = r.next_offset
    return found


def _register(spark: Any, listener: OffsetLedgerListener) -> None:
    spark.streams.addListener(listener)


def _expected_bridge(spark: Any, fast: bool) -> str | None:
    if _is_connect(spark):
        return None  # Spark Connect never asks for the py4j bridge: events come over gRPC
    return "json" if fast else "pyspark"


@pytest.mark.parametrize("fast_bridge", BRIDGES, ids=lambda fast: "fast-bridge" if fast else "pyspark-bridge")
def test_recorded_positions_equal_sparks_end_offsets(spark, kafka, ledger, pg_dsn: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                     fast_bridge: bool) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, [f"v{i}" for i in range(60)])
    pipeline = f"compat_{uuid.uuid4().hex[:8]}"
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline=pipeline, spool_dir=tmp_path / "spool")
    listener.fast_bridge = fast_bridge
    _register(spark, listener)
    try:
        values, end, batches = _run(spark, kafka, topic, "earliest", str(tmp_path / "cp"), pipeline, per_trigger=25)
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    assert listener.bridge == _expected_bridge(spark, fast_bridge)
    assert Counter(values) == Counter(f"v{i}" for i in range(60))
    assert end == {topic: {"0": 20, "1": 20, "2": 20}}
    assert batches >= 3  # several micro-batches: the position is the *last* one's end
    assert _positions(ledger, pipeline) == end
    health = listener.health()
    assert health.failed == 0 and health.spilled == 0, health
    with ledger.connect() as conn:
        recorded = {r.batch_id for r in conn.execute(select(batch_offsets.c.batch_id))}
        checkpoints = [r.checkpoint_location for r in conn.execute(select(runs.c.checkpoint_location))]
    assert len(recorded) == batches
    if _is_connect(spark):
        # A Connect client cannot look the run's checkpoint up: recorded as unknown.
        assert checkpoints and all(c is None for c in checkpoints)
    else:
        assert checkpoints and all(c and c.endswith(str(tmp_path / "cp")) for c in checkpoints), checkpoints


@pytest.mark.kafka_broker
def test_upgrade_restart_through_start_from_ledger_reads_each_record_exactly_once(  # type: ignore[no-untyped-def]
        spark, kafka, ledger, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    produced = [f"a{i}" for i in range(45)]
    kafka.produce(topic, produced)
    pipeline = f"upgrade_{uuid.uuid4().hex[:8]}"
    root = tmp_path / "checkpoints"

    def plan(version: str):  # type: ignore[no-untyped-def]
        return start_from_ledger(pipeline, [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=pg_dsn,
                                 checkpoint_root=str(root), app_version=version, first_run="earliest")

    plan1 = plan("1.0")
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline=pipeline, app_version="1.0", spool_dir=tmp_path / "spool")
    _register(spark, listener)
    try:
        seen1, end1, _ = _run(spark, kafka, topic, plan1.starting_offsets_json, plan1.checkpoint_location,
                              f"{pipeline}_v1", per_trigger=20)
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    assert end1 == {topic: {"0": 15, "1": 15, "2": 15}}
    assert _positions(ledger, pipeline) == end1

    more = [f"b{i}" for i in range(30)]
    kafka.produce(topic, more)
    produced += more
    plan2 = plan("2.0")  # a new application version: a fresh checkpoint, offsets from the ledger
    assert plan2.fresh_checkpoint and plan2.checkpoint_location != plan1.checkpoint_location
    assert plan2.starting_offsets == end1
    seen2, end2, _ = _run(spark, kafka, topic, plan2.starting_offsets_json, plan2.checkpoint_location,
                          f"{pipeline}_v2")
    assert end2 == {topic: {"0": 25, "1": 25, "2": 25}}
    everything = Counter(seen1 + seen2)
    assert set(everything) == set(produced)          # nothing lost across the upgrade
    assert everything == Counter(produced)           # nothing read twice
    assert Counter(seen2) == Counter(more)


@pytest.mark.kafka_broker
def test_legacy_get_topic_details_reads_the_broker(kafka, pg_dsn: str) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"x{i}" for i in range(7)], partition=0)
    kafka.delete_records(topic, {0: 2})
    with TestClient(create_app(dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers), base_url="http://localhost") as client:
        response = client.get(f"/v1/getTopicDetails/?topicName={topic}")
    assert response.status_code == 200, response.text
    assert response.json() == {"name": topic, "partitions": {
        "0": {"firstOffset": 2, "lastOffset": 7}, "1": {"firstOffset": 0, "lastOffset": 0}}}
