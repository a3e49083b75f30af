"""Issue 11 on the real stack: Spark pipelines as Kafka consumer groups, drift, time lag and status."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.operate import reads, reset_operations
from offset_ledger import devstack, start_from_ledger
from offset_ledger.devstack.broker import start_kafka
from offset_ledger.devstack.processes import stop_pid
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.ledger.tables import findings
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.resets import ResetRequest
from tests.integration.test_listener import (  # noqa: F401 - fixtures
    kafka_stream,
    listeners,
    position_map,
    register,
)


def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        got = admin.list_group_offsets(group)[group]
        return {(tp.topic, tp.partition): om.offset for tp, om in got.items()}
    finally:
        admin.close()


def group_metadata(bootstrap: str, group: str) -> list[dict[str, Any]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        return [json.loads(om.metadata) for om in admin.list_group_offsets(group)[group].values()]
    finally:
        admin.close()


def describe(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """What the broker distribution's own kafka-consumer-groups --describe says: CURRENT-OFFSET per partition."""
    out = devstack.consumer_groups_command(bootstrap, "--describe", "--group", group)
    print(out)  # shown with -s: what operators see
    found = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) >= 4 and cols[0] == group and cols[2].isdigit():
            found[(cols[1], int(cols[2]))] = int(cols[3])
    return found


def wait_for(check: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def run_available(df, checkpoint: str, name: str):  # type: ignore[no-untyped-def]
    query = (df.writeStream.format("noop").option("checkpointLocation", checkpoint).queryName(name)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return query


def test_listener_mirrors_ledger_positions_into_the_consumer_group(
        spark, kafka, ledger: Engine, listeners, tmp_path: Path) -> None:  # noqa: F811
    topic = kafka.create_topic(3)
    pipeline = f"mirror_{uuid.uuid4().hex[:6]}"
    listener = register(spark, listeners, tmp_path, dsn=str(ledger.url.render_as_string(hide_password=False)),
                        pipeline=pipeline, commit_to_kafka=True, bootstrap_servers=kafka.bootstrap_servers)
    kafka.produce(topic, [f"v{i}" for i in range(30)])
    query = (kafka_stream(spark, kafka, topic, max_per_trigger=10).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    kafka.produce(topic, [f"w{i}" for i in range(9)])
    query.processAllAvailable()
    query.stop()
    assert listener.flush_mirror(60)
    ledger_positions = position_map(ledger, pipeline)
    assert sum(ledger_positions.values()) == 39
    assert group_offsets(kafka.bootstrap_servers, pipeline) == ledger_positions
    assert describe(kafka.bootstrap_servers, pipeline) == ledger_positions
    meta = group_metadata(kafka.bootstrap_servers, pipeline)
    assert {m["pipeline"] for m in meta} == {pipeline} and all(m["batchId"] is not None for m in meta)
    assert listener.health().mirror["commits"] >= 3  # type: ignore[index]
    # drift: 0 everywhere while the group follows the ledger
    ops = Operations(ledger, bootstrap_servers=kafka.bootstrap_servers)
    _group, parts = reads.lag(ops, pipeline)
    assert [p.drift for p in parts] == [0, 0, 0]


def test_reset_and_restart_through_start_from_ledger_are_mirrored(
        spark, kafka, ledger: Engine, listeners, tmp_path: Path) -> None:  # noqa: F811
    topic = kafka.create_topic(2)
    dsn = ledger.url.render_as_string(hide_password=False)
    pipeline = f"reset_{uuid.uuid4().hex[:6]}"
    listener = register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
                        bootstrap_servers=kafka.bootstrap_servers)
    kafka.produce(topic, [f"v{i}" for i in range(20)])
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=dsn,
                             checkpoint_root=str(tmp_path / "root"), app_version="1", first_run="earliest")
    run_available(kafka_stream(spark, kafka, topic), plan.checkpoint_location, pipeline)
    assert listener.flush_mirror(60)
    assert group_offsets(kafka.bootstrap_servers, pipeline) == {(topic, 0): 10, (topic, 1): 10}
    # a second group member must not exist for the reset; the pipeline is stopped
    ops = Operations(ledger, bootstrap_servers=kafka.bootstrap_servers)
    reset_operations.reset(ops, pipeline, ResetRequest("shift", shift_by=-4), actor="test", reason="test", dry_run=False)
    # pending: the group still shows where the pipeline would resume without the reset
    assert group_offsets(kafka.bootstrap_servers, pipeline) == {(topic, 0): 10, (topic, 1): 10}
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=dsn,
                             checkpoint_root=str(tmp_path / "root"), app_version="1", commit_to_kafka=True)
    assert plan.fresh_checkpoint
    assert not [f for f in plan.findings if f.kind.startswith("mirror")]
    assert group_offsets(kafka.bootstrap_servers, pipeline) == {(topic, 0): 6, (topic, 1): 6}
    assert describe(kafka.bootstrap_servers, pipeline) == {(topic, 0): 6, (topic, 1): 6}
    kafka.produce(topic, [f"w{i}" for i in range(4)])
    run_available(kafka_stream(spark, kafka, topic), plan.checkpoint_location, pipeline)
    assert listener.flush_mirror(60)
    assert group_offsets(kafka.bootstrap_servers, pipeline) == {(topic, 0): 12, (topic, 1): 12}
    assert position_map(ledger, pipeline) == {(topic, 0): 12, (topic, 1): 12}


@pytest.fixture
def second_broker() -> Iterator[tuple[str, int]]:
    """A second real broker, started (and stopped) here, that only the mirror talks to."""
    root = Path(tempfile.mkdtemp(prefix="offset-ledger-broker2-"))
    bootstrap, _sasl, pid = start_kafka(root)
    try:
        yield bootstrap, pid
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        stop_pid(pid)
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_kafka_unreachable_loses_nothing_and_the_group_catches_up(
        spark, kafka, ledger: Engine, listeners, tmp_path: Path, second_broker: tuple[str, int]) -> None:  # noqa: F811
    mirror_bootstrap, mirror_pid = second_broker
    topic = kafka.create_topic(2)
    admin = KafkaAdminClient(bootstrap_servers=mirror_bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])  # same name on the mirror's cluster
    admin.close()
    pipeline = f"down_{uuid.uuid4().hex[:6]}"
    listener = register(spark, listeners, tmp_path, dsn=ledger.url.render_as_string(hide_password=False),
                        pipeline=pipeline, commit_to_kafka=True, bootstrap_servers=mirror_bootstrap,
                        kafka_options={"kafka.request.timeout.ms": "3000"})
    os.kill(mirror_pid, signal.SIGSTOP)  # the mirror's Kafka hangs (only the pid this test started)
    kafka.produce(topic, [f"v{i}" for i in range(24)])
    query = (kafka_stream(spark, kafka, topic, max_per_trigger=6).writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    query.processAllAvailable()
    query.stop()
    started = time.monotonic()
    assert listener.flush(60)  # the ledger does not wait for Kafka
    assert time.monotonic() - started < 10
    assert position_map(ledger, pipeline) == {(topic, 0): 12, (topic, 1): 12}
    assert listener.health().written >= 4
    assert not listener.flush_mirror(5)
    os.kill(mirror_pid, signal.SIGCONT)
    assert listener.flush_mirror(120)
    assert group_offsets(mirror_bootstrap, pipeline) == {(topic, 0): 12, (topic, 1): 12}
    assert listener.health().mirror["retried"] >= 1  # type: ignore[index]


def test_a_group_with_active_members_is_left_alone(
        spark, kafka, ledger: Engine, listeners, tmp_path: Path) -> None:  # noqa: F811
    topic = kafka.create_topic(1)
    pipeline = f"busy_{uuid.uuid4().hex[:6]}"
    kafka.produce(topic, [f"v{i}" for i in range(5)])
    member = KafkaConsumer(topic, bootstrap_servers=kafka.bootstrap_servers, group_id=pipeline,
                           enable_auto_commit=False, auto_offset_reset="earliest")
    admin = KafkaAdapter(kafka.bootstrap_servers)

    def joined() -> bool:
        # The consumer joins only while it polls; the broker's view of the group is what the mirror
        # asks (this same call), so that is what to wait for: a join on a loaded machine can take
        # tens of seconds.
        member.poll(1000)
        return admin.group_members([pipeline]).get(pipeline, 0) > 0

    try:
        wait_for(joined, timeout=180, what="the consumer is an active member of the group")
        listener = register(spark, listeners, tmp_path, dsn=ledger.url.render_as_string(hide_password=False),
                            pipeline=pipeline, commit_to_kafka=True, bootstrap_servers=kafka.bootstrap_servers)
        query = (kafka_stream(spark, kafka, topic).writeStream.format("noop")
                 .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        query.processAllAvailable()
        query.stop()
        assert listener.flush_mirror(60)
        assert position_map(ledger, pipeline) == {(topic, 0): 5}
        assert group_offsets(kafka.bootstrap_servers, pipeline) == {}  # untouched
        health = listener.health()
        assert health.mirror["refused"] == 1  # type: ignore[index]
        assert "active member" in (health.last_error or "")
        with ledger.connect() as conn:
            kinds = [r.kind for r in conn.execute(select(findings).where(findings.c.pipeline == pipeline))]
        assert kinds == ["mirror_refused"]
    finally:
        member.close(autocommit=False)
        admin.close()


def test_time_lag_and_every_status(spark, kafka, ledger: Engine, listeners, tmp_path: Path,  # noqa: F811
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFSET_LEDGER_STATUS_WINDOW", "3s")
    topic = kafka.create_topic(1)
    dsn = ledger.url.render_as_string(hide_password=False)
    pipeline = f"status_{uuid.uuid4().hex[:6]}"
    listener = register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    now_ms = int(time.time() * 1000)

    def produce(n: int, age_s: float) -> None:
        for i in range(n):
            producer.send(topic, value=b"x", partition=0, timestamp_ms=now_ms - int(age_s * 1000) + i)
        producer.flush()

    ops = Operations(ledger, bootstrap_servers=kafka.bootstrap_servers)

    def status() -> tuple[str | None, float | None, int | None]:
        _group, parts = reads.lag(ops, pipeline)
        return parts[0].status, parts[0].lag_seconds, parts[0].lag

    root = str(tmp_path / "root")
    produce(5, 600)
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1", first_run="earliest")

    def start(max_per_trigger: int | None, trigger: str):  # type: ignore[no-untyped-def]
        return (kafka_stream(spark, kafka, topic, max_per_trigger=max_per_trigger).writeStream.format("noop")
                .option("checkpointLocation", plan.checkpoint_location).queryName(pipeline)
                .trigger(processingTime=trigger).start())

    # OK: caught up, time lag 0
    query = start(None, "1 hour")  # one batch at start, then nothing for an hour
    wait_for(lambda: position_map(ledger, pipeline) == {(topic, 0): 5}, what="first batch")
    assert status() == ("OK", 0.0, 0)
    # STALLED: the run is active, records arrive, the position does not move within the window
    produce(4, 30)
    time.sleep(3.5)
    state, seconds, lag = status()
    assert (state, lag) == ("STALLED", 4)
    assert seconds is not None and 29 <= seconds < 60  # the record at the position was written 30 s ago
    # STOPPED: no active run, lag > 0
    query.stop()
    assert listener.flush(30)
    assert status()[0] == "STOPPED"
    # LAGGING: moving, but the backlog exceeds what a window's batches read
    produce(600, 20)
    query = start(3, "200 milliseconds")
    try:
        wait_for(lambda: 12 < position_map(ledger, pipeline)[(topic, 0)] < 400, what="a few batches")
        assert status()[0] == "LAGGING"
    finally:
        query.stop()
    assert listener.flush(30)
    # REWOUND: reset to earliest, restart on the fresh generation, a run re-reading old records
    monkeypatch.setenv("OFFSET_LEDGER_STATUS_WINDOW", "10m")
    reset_operations.reset(ops, pipeline, ResetRequest("earliest"), actor="test", reason="test", dry_run=False)
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    assert plan.fresh_checkpoint and plan.starting_offsets == {topic: {"0": 0}}
    query = start(2, "1 hour")
    try:
        wait_for(lambda: position_map(ledger, pipeline) == {(topic, 0): 2}, what="first re-read batch")
        assert status()[0] == "REWOUND"
        summary = {p.pipeline: p for p in reads.list_pipelines(ops)}[pipeline]
        assert summary.status == "REWOUND"
    finally:
        query.stop()
    producer.close()
    assert listener.flush(30)
