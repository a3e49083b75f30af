"""Lost and re-created checkpoints on the real stack (issue 33, cases 1 and 2): Spark, Kafka, Postgres.

The oracle is the topic: every value produced is unique. Case 1: a PostgresSink pipeline loses its
checkpoint and restarts through ``start_from_ledger`` with the same app version; the target must
hold every record exactly once (Spark's new query begins its batch ids at 0 again: reusing the old
generation made the sink skip them as "already committed"). Case 2: the checkpoint is lost and the
job is started by hand at ``startingOffsets=latest`` while records wait; those records are never
read, and ``verify`` must report exactly them as a gap (not the overlaps a first batch recorded as
starting where the history stood made of it).
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import create_engine, text

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.sinks import PostgresSink
from tests.integration.sink_helper import create_target, target_values
from tests.integration.test_adopt_replay import _cli
from tests.integration.test_restart import _run as _run_to_end
from tests.integration.test_verify import _capture
from tests.integration.test_restart import _values
from tests.integration.test_sink_postgres import _run


def _sql(dsn: str, statement: str) -> list:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(statement)))
    finally:
        engine.dispose()


def _listener(spark, pg_dsn: str, tmp_path: Path) -> OffsetLedgerListener:  # type: ignore[no-untyped-def]
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    return listener


def test_a_lost_checkpoint_restarted_with_the_same_version_writes_every_record_once(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    produced = _values("a", 60)
    kafka.produce(topic, produced)
    create_target(pg_dsn, "orders_out")
    root = str(tmp_path / "ck")
    listener = _listener(spark, pg_dsn, tmp_path)
    try:
        def restart(sink: PostgresSink):  # type: ignore[no-untyped-def]
            return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                                     checkpoint_root=root, app_version="1", dsn=pg_dsn, first_run="earliest",
                                     sinks=[sink])

        sink = PostgresSink(table="orders_out", pipeline="orders", dsn=pg_dsn)
        p1 = restart(sink)
        assert _run(spark, kafka, topic, p1, sink.bind(p1.checkpoint_location))  # 6 batches of 10
        assert listener.flush(60), listener.health()

        # The checkpoint is lost; more records arrive; the same version restarts from the ledger.
        shutil.rmtree(p1.checkpoint_location)
        more = _values("b", 90)
        kafka.produce(topic, more)
        p2 = restart(sink)
        assert _run(spark, kafka, topic, p2, sink.bind(p2.checkpoint_location))
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()

    assert target_values(pg_dsn, "orders_out") == Counter(produced + more)  # each of the 150 exactly once
    # How: a fresh generation from the ledger's positions, and a finding that says why.
    assert p2.fresh_checkpoint and p2.generation == 2 and p2.checkpoint_location != p1.checkpoint_location
    (lost,) = [f for f in p2.findings if f.kind == "checkpoint_lost"]
    assert f"checkpoint of generation 1 at {p1.checkpoint_location} is gone" in lost.message
    assert p2.starting_offsets == {topic: {"0": 30, "1": 30}}
    _capture("lost-restart.txt", f"checkpoint: {p2.checkpoint_location} (fresh)\n" + "".join(
        f"finding: {f.kind} {f.message}\n" for f in p2.findings))
    gens = _sql(pg_dsn, "SELECT generation, reason FROM checkpoint_generations ORDER BY generation")
    assert [(g.generation, g.reason) for g in gens] == [(1, "first"), (2, "checkpoint_lost")]
    done = _cli("verify", "orders", "--dsn", pg_dsn, "-f", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["summary"]["unexplained"] == 0


def _run_by_hand(spark, kafka, topic: str, checkpoint: str, then_produce: list[str]) -> Counter:  # type: ignore[no-untyped-def]
    """The job started without the ledger at ``latest`` on ``checkpoint``; ``then_produce`` arrives
    once it runs. The values it read."""
    seen: list[str] = []

    def collect(df, _batch_id):  # type: ignore[no-untyped-def]
        seen.extend(r.value for r in df.selectExpr("CAST(value AS STRING) AS value").collect())

    query = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
             .option("subscribe", topic).option("startingOffsets", "latest").load()
             .writeStream.foreachBatch(collect).option("checkpointLocation", checkpoint)
             .trigger(processingTime="500 milliseconds").start())
    try:
        deadline = time.monotonic() + 60
        while not query.recentProgress and time.monotonic() < deadline:  # batch 0: latest resolved
            time.sleep(0.2)
        assert query.recentProgress, "the hand-started query ran no batch"
        kafka.produce(topic, then_produce)
        query.processAllAvailable()
    finally:
        query.stop()
    return Counter(seen)


def test_a_job_started_by_hand_at_latest_on_a_lost_checkpoint_shows_the_skipped_records_as_a_gap(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 60))
    plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "ck"), app_version="1", dsn=pg_dsn, first_run="earliest")
    listener = _listener(spark, pg_dsn, tmp_path)
    try:
        first, _ = _run_to_end(spark, kafka.bootstrap_servers, topic, plan.starting_offsets_json,
                               plan.checkpoint_location, max_offsets_per_trigger=10)
        assert first == Counter(_values("a", 60))
        assert listener.flush(60), listener.health()
        before = kafka.end_offsets(topic)  # {0: 30, 1: 30}: the ledger's positions

        # The checkpoint is lost; 40 records wait; the job is started by hand at latest.
        shutil.rmtree(plan.checkpoint_location)
        kafka.produce(topic, _values("b", 40))
        waiting = kafka.end_offsets(topic)
        read = _run_by_hand(spark, kafka, topic, plan.checkpoint_location, _values("c", 10))
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    assert read == Counter(_values("c", 10))  # the 40 waiting records were never read

    table = _cli("verify", "orders", "--dsn", pg_dsn)
    _capture("by-hand-verify.txt", table.stdout + table.stderr)
    report = _cli("verify", "orders", "--dsn", pg_dsn, "-f", "json")
    assert report.returncode == 6, report.stdout + report.stderr
    doc = json.loads(report.stdout)
    unexplained = [(s["partition"], s["fromOffset"], s["untilOffset"], s["kind"])
                   for s in doc["stretches"] if not s["explained"]]
    assert unexplained == [(p, before[p], waiting[p], "gap") for p in sorted(before)]  # 20 + 20 skipped
    (found,) = _sql(pg_dsn, "SELECT message FROM findings WHERE kind = 'checkpoint_recreated'")
    assert "re-created the checkpoint of generation 1" in found.message
    gens = _sql(pg_dsn, "SELECT generation, reason, location FROM checkpoint_generations ORDER BY generation")
    assert [(g.generation, g.reason, g.location) for g in gens] == [
        (1, "first", plan.checkpoint_location), (2, "checkpoint_recreated", plan.checkpoint_location)]
