"""Restart from the ledger end to end: real Kafka, real Postgres, real Spark reading with format("kafka").

Every scenario asserts the exact multiset of values the restarted query processed. The upgrade
scenario records through the real ``OffsetLedgerListener``; the others write the last batch's
positions directly (``_record_last_batch``, the rows the listener leaves) to keep Spark time low.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, select, update

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.errors import DataLossError
from offset_ledger.ledger import position_store
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.tables import (
    batch_offsets,
    checkpoint_generations,
    positions,
    reset_partitions,
    resets,
)


def _values(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}{i}" for i in range(start, start + n)]


def _run(spark, bootstrap: str, topic: str, starting_offsets: str, checkpoint: str,  # type: ignore[no-untyped-def]
         *, max_offsets_per_trigger: int | None = None) -> tuple[Counter, dict[str, dict[str, int]] | None]:
    """Run a Kafka-reading query to the end of what is available; return the values it processed
    and the last batch's end offsets (None when it processed no batch)."""
    seen: list[str] = []

    def sink(df, _batch_id):  # type: ignore[no-untyped-def]
        seen.extend(r.value for r in df.selectExpr("CAST(value AS STRING) AS value").collect())

    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
    )
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(180), "the query did not finish"
        assert query.exception() is None, query.exception()
        progress = query.lastProgress
    finally:
        query.stop()
    end = None
    if progress is not None:
        sources = [s for s in progress["sources"] if s["description"].startswith("KafkaV2")]
        end = sources[0]["endOffset"]
        end = json.loads(end) if isinstance(end, str) else end
    return Counter(seen), end


def _record_last_batch(dsn: str, pipeline: str, end_offsets: dict[str, dict[str, int]]) -> None:
    """Write the positions a committed batch leaves in the ledger (what the listener records)."""
    engine = create_engine(dsn)
    now = datetime.now(timezone.utc)
    try:
        with engine.begin() as conn:
            position_store.write(conn, pipeline, pipeline, {
                (topic, int(p)): Placed(next_offset, now, "q", 0) for topic, parts in end_offsets.items()
                for p, next_offset in parts.items()}, keep_generation=True)
    finally:
        engine.dispose()


def _rows(dsn: str, table) -> list[Any]:  # type: ignore[no-untyped-def]
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(table)))
    finally:
        engine.dispose()


def _start(kafka, pg_dsn: str, topic: str, root: Path, **kw: Any):  # type: ignore[no-untyped-def]
    return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(root), dsn=pg_dsn, **kw)


def _per_partition(values: list[str], partitions: int) -> dict[int, list[str]]:
    """Which values KafkaHelper.produce put on each partition (round-robin)."""
    return {p: values[p::partitions] for p in range(partitions)}


def test_upgrade_restart_processes_every_record_after_the_last_committed_batch_exactly_once(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("a", 30))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1.0")
    assert plan1.fresh_checkpoint and plan1.checkpoint_location.startswith(str(tmp_path) + "/gen-1-")
    listener = OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", app_version="1.0", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    try:
        # Several micro-batches, so the restart must start after the *last* committed one.
        seen1, end1 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json,
                           plan1.checkpoint_location, max_offsets_per_trigger=9)
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close()
    assert seen1 == Counter(_values("a", 30))
    assert end1 == {topic: {"0": 10, "1": 10, "2": 10}}
    assert sorted((r.topic, r.partition, r.next_offset) for r in _rows(pg_dsn, positions)) == [
        (topic, 0, 10), (topic, 1, 10), (topic, 2, 10)]
    assert len({r.batch_id for r in _rows(pg_dsn, batch_offsets)}) >= 3

    kafka.produce(topic, _values("b", 30))
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2.0")
    assert plan2.fresh_checkpoint
    assert plan2.checkpoint_location.startswith(str(tmp_path) + "/gen-2-")
    assert not Path(plan2.checkpoint_location).exists()
    assert plan2.starting_offsets == {topic: {"0": 10, "1": 10, "2": 10}}
    assert plan2.findings == ()
    seen2, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    assert seen2 == Counter(_values("b", 30))  # every new record once, none of the first run's

    gens = sorted(_rows(pg_dsn, checkpoint_generations), key=lambda r: r.generation)
    assert [(g.generation, g.app_version, g.reason) for g in gens] == [(1, "1.0", "first"), (2, "2.0", "app_version")]
    assert gens[1].starting_offsets == plan2.starting_offsets
    assert gens[1].location == plan2.checkpoint_location


def test_same_app_version_and_nothing_pending_resumes_the_existing_checkpoint(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 20))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1.0")
    seen1, _ = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json, plan1.checkpoint_location)
    assert seen1 == Counter(_values("a", 20))
    # Deliberately no listener: the restart reads generation 1's checkpoint, records its batch
    # (reconciliation) and reports where Spark will resume; Spark ignores startingOffsets here.
    kafka.produce(topic, _values("b", 10))
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1.0")
    assert not plan2.fresh_checkpoint
    assert plan2.checkpoint_location == plan1.checkpoint_location
    assert plan2.starting_offsets == {topic: {"0": 10, "1": 10}}
    assert [f.kind for f in plan2.findings] == ["backfilled"]
    seen2, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    assert seen2 == Counter(_values("b", 10))
    assert len(_rows(pg_dsn, checkpoint_generations)) == 1

    plan3 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1.0", new_checkpoint=True)
    assert plan3.fresh_checkpoint and plan3.checkpoint_location != plan1.checkpoint_location
    assert plan3.starting_offsets == {topic: {"0": 15, "1": 15}}  # never behind the old checkpoint
    assert [r.reason for r in sorted(_rows(pg_dsn, checkpoint_generations), key=lambda r: r.generation)] == [
        "first", "requested"]


def test_partitions_added_while_stopped_are_read_from_earliest(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 20))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _, end1 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json, plan1.checkpoint_location)
    _record_last_batch(pg_dsn, "orders", end1)

    kafka.add_partitions(topic, 4)
    new_values = _values("b", 40)
    kafka.produce(topic, new_values)  # 10 to each of the 4 partitions
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert plan2.starting_offsets == {topic: {"0": 10, "1": 10, "2": -2, "3": -2}}
    assert sorted((f.kind, f.partition) for f in plan2.findings if f.kind != "backfilled") == [
        ("new_partition", 2), ("new_partition", 3)]
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    assert seen == Counter(new_values)


def test_retention_below_the_ledger_position_fails_or_resumes_at_log_start(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 20))  # 10 per partition
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _, end1 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json, plan1.checkpoint_location)
    _record_last_batch(pg_dsn, "orders", end1)

    later = _values("b", 20)  # offsets 10..19 on each partition
    kafka.produce(topic, later)
    kafka.delete_records(topic, {0: 14})  # retention removed 4 records the pipeline never read

    with pytest.raises(DataLossError) as info:
        _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert info.value.lost == [{
        "topic": topic, "partition": 0, "kind": "below_log_start", "next_offset": 10,
        "log_start_offset": 14, "log_end_offset": 20, "source": "ledger", "records_lost": 4}]
    assert f"{topic}/0" in info.value.message and "4 records lost" in info.value.message
    assert len(_rows(pg_dsn, checkpoint_generations)) == 1  # a failed restart writes nothing

    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2", on_data_loss="earliest")
    assert plan2.starting_offsets == {topic: {"0": 14, "1": 10}}
    (loss,) = plan2.findings
    assert (loss.kind, loss.partition, loss.details["records_lost"]) == ("data_loss", 0, 4)
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    by_partition = _per_partition(later, 2)
    assert seen == Counter(by_partition[0][4:] + by_partition[1])


def test_topic_recreated_with_fewer_records_than_the_ledger_position(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("old", 40))  # 20 per partition
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _, end1 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json, plan1.checkpoint_location)
    _record_last_batch(pg_dsn, "orders", end1)

    kafka.recreate_topic(topic, 2)
    fresh = _values("new", 10)  # 5 per partition in the new log
    kafka.produce(topic, fresh)

    with pytest.raises(DataLossError) as info:
        _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    # The topic id changed: the old offsets belong to a dead topic, whatever the new log's size.
    assert sorted((x["partition"], x["kind"], x["records_never_read_at_least"]) for x in info.value.lost) == [
        (0, "topic_recreated", 0), (1, "topic_recreated", 0)]
    assert "re-created" in info.value.message

    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2", on_data_loss="earliest")
    assert plan2.starting_offsets == {topic: {"0": 0, "1": 0}}
    assert sorted(f.kind for f in plan2.findings) == ["data_loss", "data_loss"]
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    assert seen == Counter(fresh)


def test_first_run_earliest_and_explicit_offsets(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    values = _values("a", 30)
    kafka.produce(topic, values)
    by_partition = _per_partition(values, 3)

    plan = start_from_ledger("p_earliest", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "e"), dsn=pg_dsn)
    assert plan.starting_offsets == {topic: {"0": -2, "1": -2, "2": -2}}
    assert [f.kind for f in plan.findings] == ["first_run"]
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan.starting_offsets_json, plan.checkpoint_location)
    assert seen == Counter(values)

    plan = start_from_ledger("p_explicit", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "x"), dsn=pg_dsn,
                             first_run=json.dumps({topic: {"0": 3, "1": 10}}))
    assert plan.starting_offsets == {topic: {"0": 3, "1": 10, "2": -2}}  # unnamed partition: earliest
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan.starting_offsets_json, plan.checkpoint_location)
    assert seen == Counter(by_partition[0][3:] + by_partition[2])


def test_first_run_from_a_timestamp_and_from_latest(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("old", 30))
    time.sleep(0.05)
    cut = datetime.now(timezone.utc)
    time.sleep(0.05)
    newer = _values("new", 10)
    kafka.produce(topic, newer[:5], partition=0)
    kafka.produce(topic, newer[5:], partition=1)  # partition 2 has no record that new

    plan = start_from_ledger("p_time", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "t"), dsn=pg_dsn, first_run=cut)
    # No record that new in partition 2: its log-end seen when planning (what the baseline records).
    assert plan.starting_offsets == {topic: {"0": 10, "1": 10, "2": 10}}
    assert plan.findings[0].details["latest_partitions"] == [f"{topic}/2"]
    # Produced after planning, before Spark starts: read, since the plan and the ledger say 10.
    between = _values("between", 3)
    kafka.produce(topic, between, partition=2)
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan.starting_offsets_json, plan.checkpoint_location)
    assert seen == Counter(newer + between)

    plan = start_from_ledger("p_latest", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "l"), dsn=pg_dsn, first_run="latest")
    assert plan.starting_offsets == {topic: {"0": 15, "1": 15, "2": 13}}  # the log-end offsets seen now
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan.starting_offsets_json, plan.checkpoint_location)
    assert seen == Counter()  # the checkpoint now holds "latest" as of planning
    after = _values("after", 6)
    kafka.produce(topic, after)
    again = start_from_ledger("p_latest", [topic], bootstrap_servers=kafka.bootstrap_servers,
                              checkpoint_root=str(tmp_path / "l"), dsn=pg_dsn, first_run="latest")
    assert not again.fresh_checkpoint and again.checkpoint_location == plan.checkpoint_location
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, again.starting_offsets_json, again.checkpoint_location)
    assert seen == Counter(after)


def test_a_pending_reset_written_to_the_ledger_wins_through_a_fresh_checkpoint(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    values = _values("a", 20)
    kafka.produce(topic, values)
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _, end1 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json, plan1.checkpoint_location)
    _record_last_batch(pg_dsn, "orders", end1)

    # An operator rewinds partition 0 to offset 6 (what an executed reset writes).
    engine = create_engine(pg_dsn)
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        rid = conn.execute(insert(resets).values(
            pipeline="orders", consumer_group="orders", mode="offsets", parameters={}, actor="ops",
            reason="replay", dry_run=False, forced=False, created_at=now, status="pending",
        ).returning(resets.c.id)).scalar_one()
        conn.execute(insert(reset_partitions).values(reset_id=rid, topic=topic, partition=0,
                                                     before_next_offset=10, after_next_offset=6))
        conn.execute(update(positions).where(positions.c.topic == topic, positions.c.partition == 0)
                     .values(next_offset=6, reset_id=rid, updated_at=now))
    engine.dispose()

    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")  # same version: only the reset forces it
    assert plan2.fresh_checkpoint and plan2.checkpoint_location != plan1.checkpoint_location
    assert plan2.starting_offsets == {topic: {"0": 6, "1": 10}}
    # (The checkpoint's batch, recorded by reconciliation, left the reset's position alone.)
    assert [(f.kind, f.details["reset_id"]) for f in plan2.findings if f.kind != "backfilled"] == [
        ("reset_consumed", rid)]
    seen, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    assert seen == Counter(_per_partition(values, 2)[0][6:])

    gens = sorted(_rows(pg_dsn, checkpoint_generations), key=lambda r: r.generation)
    assert [g.reason for g in gens] == ["first", "reset"]
    (reset_row,) = _rows(pg_dsn, resets)
    assert reset_row.status == "consumed" and reset_row.consumed_by_generation == gens[1].id
    plan3 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    assert not plan3.fresh_checkpoint and plan3.checkpoint_location == plan2.checkpoint_location


def test_topic_pattern_and_kafka_options_reach_the_cluster(kafka, pg_dsn: str, tmp_path: Path) -> None:
    a = kafka.create_topic(partitions=1)
    b = kafka.create_topic(partitions=2)
    prefix = os.path.commonprefix([a, b])
    plan = start_from_ledger("pat", topic_pattern=prefix + ".*", checkpoint_root=str(tmp_path), dsn=pg_dsn,
                             kafka_options={"kafka.bootstrap.servers": kafka.bootstrap_servers,
                                            "kafka.security.protocol": "PLAINTEXT"})
    assert plan.starting_offsets == {a: {"0": -2}, b: {"0": -2, "1": -2}}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "offset-ledger"
    return subprocess.run([str(exe), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_cli_resolve_prints_offsets_and_findings_and_writes_nothing(kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("a", 30))
    _start(kafka, pg_dsn, topic, tmp_path, app_version="1")  # creates the schema and generation 1 (positions 0)
    _record_last_batch(pg_dsn, "orders", {topic: {"0": 4, "1": 10}})
    kafka.delete_records(topic, {1: 10})
    kafka.add_partitions(topic, 4)

    env = {"OFFSET_LEDGER_BOOTSTRAP_SERVERS": kafka.bootstrap_servers}
    out = _cli("resolve", "orders", "--topic", topic, "--dsn", pg_dsn, "--on-data-loss", "earliest", env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {topic: {"0": 4, "1": 10, "2": 0, "3": -2}}
    assert f"new_partition {topic}/3:" in out.stderr

    kafka.delete_records(topic, {0: 7})
    out = _cli("resolve", "orders", "--topic", topic, "--dsn", pg_dsn, env=env)
    assert out.returncode == 4 and out.stdout == ""  # data loss
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("offset-ledger: error:") and f"{topic}/0" in out.stderr and "3 records lost" in out.stderr

    out = _cli("resolve", "orders", "--topic", topic, "--dsn", pg_dsn, "--first-run", "{bad", env=env)
    assert out.returncode == 2 and "first_run is not valid JSON" in out.stderr
    assert len(_rows(pg_dsn, checkpoint_generations)) == 1  # resolve never creates generations


def test_unreachable_brokers_and_bad_options_fail_clearly_and_write_nothing(pg_dsn: str, tmp_path: Path) -> None:
    import socket

    from offset_ledger.errors import InvalidRestartOptions, KafkaUnavailable

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(KafkaUnavailable):
        start_from_ledger("orders", ["t"], bootstrap_servers=dead, checkpoint_root=str(tmp_path), dsn=pg_dsn,
                          kafka_options={"kafka.request.timeout.ms": "3000"})
    with pytest.raises(InvalidRestartOptions):
        start_from_ledger("orders", ["t"], topic_pattern="t.*", bootstrap_servers=dead,
                          checkpoint_root=str(tmp_path), dsn=pg_dsn)
    with pytest.raises(InvalidRestartOptions):
        start_from_ledger("orders", ["t"], bootstrap_servers=dead, checkpoint_root=str(tmp_path), dsn=pg_dsn,
                          on_data_loss="skip")
    assert _rows(pg_dsn, checkpoint_generations) == []


def test_cli_resolve_with_a_pattern_reports_a_deleted_topic(kafka, pg_dsn: str, tmp_path: Path) -> None:
    kept = kafka.create_topic(partitions=2)
    gone = kafka.create_topic(partitions=1)
    _start(kafka, pg_dsn, kept, tmp_path)  # schema
    _record_last_batch(pg_dsn, "orders", {kept: {"0": 0, "1": 0}, gone: {"0": 0}})
    kafka.delete_topics([gone])
    deadline = time.monotonic() + 30
    while gone in kafka.admin.list_topics() and time.monotonic() < deadline:
        time.sleep(0.2)
    prefix = os.path.commonprefix([kept, gone])
    out = _cli("resolve", "orders", "--pattern", prefix + ".*", "--dsn", pg_dsn,
               "--bootstrap-servers", kafka.bootstrap_servers)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {kept: {"0": 0, "1": 0}}
    assert f"removed_partition {gone}/0:" in out.stderr and "topic no longer exists" in out.stderr
