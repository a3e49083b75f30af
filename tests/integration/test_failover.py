"""Issue 26 on the real stack: a mirrored Spark pipeline fails over to a MirrorMaker 2 backup cluster.

Two brokers of our own (the primary is stopped mid-test, so it cannot be the shared one) and
Apache Kafka's MirrorMaker 2 in dedicated mode. The oracle is the topic itself: every value
produced on the primary is read by the run on the primary or the run on the backup (nothing
skipped), and what the backup run reads again is no more than the gap the plan reported.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from offset_ledger import failover, start_from_ledger
from offset_ledger.devstack.mirror_maker import (
    Broker,
    MirrorMaker,
    start_broker,
    start_mirror_maker,
)
from offset_ledger.devstack.processes import StackError
from offset_ledger.kafka.mm2_checkpoints import read_checkpoints
from offset_ledger.rules.failover import checkpoints_topic
from tests.integration.kafka_helper import KafkaHelper
from tests.integration.test_listener import listeners, position_map, register  # noqa: F401 - fixtures
from offset_ledger.operate.action_answers import failover_answer

pytestmark = pytest.mark.long


@pytest.fixture
def clusters(stack, tmp_path: Path) -> Iterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    """A primary and a backup broker (this test's own), stopped by pid afterwards."""
    started: list[Broker | MirrorMaker] = []
    try:
        primary = start_broker(tmp_path / "primary")
        started.append(primary)
        backup = start_broker(tmp_path / "backup")
        started.append(backup)
    except StackError as exc:
        for s in started:
            s.stop()
        pytest.fail(f"could not start the two clusters: {exc}", pytrace=False)
    info: dict[str, Any] = {"primary": primary, "backup": backup, "started": started}
    try:
        yield info
    finally:
        for s in reversed(started):
            s.stop(20)


def _run(spark, bootstrap: str, topic: str, plan: Any, out: Path) -> list[str]:  # type: ignore[no-untyped-def]
    """One availableNow run of the pipeline; the values it wrote (a file sink: it resumes a checkpoint)."""
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("startingOffsets", plan.starting_offsets_json).option("maxOffsetsPerTrigger", "9").load()
          .selectExpr("CAST(value AS STRING) AS value"))
    query = (df.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", plan.checkpoint_location).trigger(availableNow=True).start())
    query.awaitTermination()
    return [r.value for r in spark.read.parquet(str(out)).collect()]


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [KTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: int(o) for tp, o in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


def _wait(check, timeout: float, what: str, mm2: MirrorMaker) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not mm2.alive():
            raise AssertionError(f"MirrorMaker 2 exited:\n{mm2.log_tail()}")
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - topics appear while MM2 starts; keep asking
            last = exc
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r}); MM2 log:\n{mm2.log_tail()}")


@dataclass
class FirstLeg:
    topic: str
    pipeline: str
    mm2: MirrorMaker
    first: list[str]
    root: str
    read_on_primary: list[str]


def first_leg_on_the_primary(spark, clusters, dsn: str, listeners, tmp_path: Path,  # type: ignore[no-untyped-def]  # noqa: F811
                             prefix: str) -> FirstLeg:
    """A 2-partition topic with 40 records on the primary, MM2 primary -> backup, and the pipeline's first
    run on the primary with its positions mirrored into the consumer group MM2 checkpoints."""
    primary, backup = clusters["primary"], clusters["backup"]
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        topic = on_primary.create_topic(2, name=f"orders_{uuid.uuid4().hex[:6]}")
        first = [f"a{i}" for i in range(40)]
        on_primary.produce(topic, first)
    finally:
        on_primary.close()
    pipeline = f"{prefix}_{uuid.uuid4().hex[:6]}"
    mm2 = start_mirror_maker(tmp_path / "mm2", source=primary.bootstrap_servers, target=backup.bootstrap_servers,
                             topics=topic, groups=pipeline)
    clusters["started"].append(mm2)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=primary.bootstrap_servers)
    root = str(tmp_path / "checkpoints")
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=primary.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1", first_run="earliest")
    read_on_primary = _run(spark, primary.bootstrap_servers, topic, plan, tmp_path / "out-primary")
    assert sorted(read_on_primary) == sorted(first)
    assert listeners[0].flush(30) and listeners[0].flush_mirror(60)
    return FirstLeg(topic, pipeline, mm2, first, root, read_on_primary)


def test_a_mirrored_pipeline_fails_over_to_the_backup_without_skipping(
        spark, clusters, ledger: Engine, listeners, tmp_path: Path) -> None:  # noqa: F811
    primary, backup = clusters["primary"], clusters["backup"]
    dsn = ledger.url.render_as_string(hide_password=False)
    leg = first_leg_on_the_primary(spark, clusters, dsn, listeners, tmp_path, "fo")
    topic, pipeline, mm2, first, root, read_on_primary = (leg.topic, leg.pipeline, leg.mm2, leg.first, leg.root,
                                                          leg.read_on_primary)
    ledger_before = position_map(ledger, pipeline)
    assert sum(ledger_before.values()) == 40

    remote = f"primary.{topic}"

    def replicated(total: int) -> bool:
        return sum(_end_offsets(backup.bootstrap_servers, remote).values()) == total

    def checkpointed() -> bool:
        # MM2 checkpoints an offset only once it can translate it (an offset sync at or below it).
        cps = read_checkpoints(backup.bootstrap_servers, checkpoints_topic("primary"), pipeline)
        return {(remote, tp.partition): cp.upstream_next_offset for tp, cp in cps.items()} == {
            (remote, p): o for (_t, p), o in ledger_before.items()}

    _wait(lambda: replicated(40), 120, "MM2 to replicate the topic", mm2)
    _wait(checkpointed, 120, "MM2 to checkpoint the pipeline's group", mm2)
    # Records the pipeline never read before the primary died: the backup run must read them.
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        tail = [f"b{i}" for i in range(11)]
        on_primary.produce(topic, tail)
    finally:
        on_primary.close()
    _wait(lambda: replicated(51), 120, "MM2 to replicate the tail", mm2)
    # MM2 goes first; the pipeline reads the tail on the primary and its mirror commits, but no
    # checkpoint translates that commit any more: the backup must read those records again.
    mm2.stop()
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=primary.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    read_on_primary = _run(spark, primary.bootstrap_servers, topic, plan, tmp_path / "out-primary")
    assert sorted(read_on_primary) == sorted(first + tail)
    assert listeners[0].flush(30) and listeners[0].flush_mirror(60)
    ledger_before = position_map(ledger, pipeline)
    assert sum(ledger_before.values()) == 51
    primary.stop()  # "the primary cluster is gone"

    # The plan first, as an operator would look at it.
    runner = CliRunner()
    from offset_ledger.cli.main import app

    dry = runner.invoke(app, ["failover", pipeline, "--to-bootstrap", backup.bootstrap_servers,
                              "--source-alias", "primary", "--dry-run", "--dsn", dsn])
    print(dry.output)
    assert dry.exit_code == 0, dry.output
    assert "startingOffsets" in dry.output and "dry run: nothing written" in dry.output
    assert position_map(ledger, pipeline) == ledger_before  # nothing written

    result = failover(pipeline, to_bootstrap=backup.bootstrap_servers, source_alias="primary", dsn=dsn)
    print(failover_answer(result))
    assert result.topics == [remote]
    assert {p.status for p in result.plan.partitions} == {"translated"}
    assert result.generation == 2 and result.checkpoint_location
    # The ledger now holds the backup's positions, keyed by the backup's topic names.
    assert position_map(ledger, pipeline) == {(remote, int(p)): o for p, o in result.starting_offsets[remote].items()}

    # The pipeline on the backup: start_from_ledger resumes the failover generation.
    spark.streams.removeListener(listeners[0])
    listeners[0].close(10)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=backup.bootstrap_servers)
    plan2 = start_from_ledger(pipeline, [remote], bootstrap_servers=backup.bootstrap_servers, dsn=dsn,
                              checkpoint_root=root, app_version="1")
    assert plan2.checkpoint_location == result.checkpoint_location
    assert plan2.starting_offsets == result.starting_offsets
    # A record produced on the backup after the failover is new, not a re-read.
    on_backup = KafkaHelper(backup.bootstrap_servers)
    try:
        on_backup.produce(remote, ["c0", "c1"])
    finally:
        on_backup.close()
    read_on_backup = _run(spark, backup.bootstrap_servers, remote, plan2, tmp_path / "out-backup")

    # The oracle: nothing skipped, re-reads within the reported gap.
    assert set(read_on_primary) | set(read_on_backup) == set(first) | set(tail) | {"c0", "c1"}
    reread = [v for v in read_on_backup if v in set(read_on_primary)]
    assert len(reread) == len(read_on_backup) - 2
    assert len(reread) <= result.reread_max
    # The tail the primary read after MM2's last checkpoint is certainly read again.
    behind = sum(p.behind_checkpoint for p in result.plan.partitions)
    assert behind == len(tail) and set(tail) <= set(reread)
    print(f"re-read {len(reread)} record(s); the plan said at most {result.reread_max}, {behind} of them certain")

    # Later restarts, the mirror and verify work on the backup.
    assert listeners[1].flush(30) and listeners[1].flush_mirror(60)
    assert position_map(ledger, pipeline) == {(remote, p): o for p, o in
                                              _end_offsets(backup.bootstrap_servers, remote).items()}
    verify = runner.invoke(app, ["verify", pipeline, "--dsn", dsn])
    print(verify.output)
    assert verify.exit_code == 0, verify.output
