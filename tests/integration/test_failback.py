"""Issue 26, second part, on the real stack: failing BACK to the primary after a MirrorMaker 2 failover.

The forward leg is test_failover.py's: a mirrored pipeline on the primary, MM2 primary -> backup,
the primary stopped, ``failover`` to the backup and a run there. Then the primary comes back (the
same broker directory: its log is intact), MirrorMaker 2 runs the other way (backup -> primary,
default replication policy), and the test records what MM2 really does with the pipeline's group
on ``primary.<topic>``, and what ``failover`` back to the primary does with that.

The oracle is the primary's topic itself: every record on it is read by one of the runs (nothing
skipped), and the run on the primary after failing back reads again no more than the plan said.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from offset_ledger import failover, start_from_ledger
from offset_ledger.devstack.mirror_maker import start_broker, start_mirror_maker
from offset_ledger.errors import FailoverRefused
from offset_ledger.kafka.mm2_checkpoints import read_checkpoints
from offset_ledger.rules.failover import checkpoints_topic
from tests.integration.kafka_helper import KafkaHelper
from tests.integration.test_failover import (  # noqa: F401 - clusters: the fixture
    _end_offsets,
    _run,
    _wait,
    clusters,
    first_leg_on_the_primary,
)
from tests.integration.test_failover_short import _cli
from tests.integration.test_listener import listeners, position_map, register  # noqa: F401 - fixtures
from offset_ledger.operate.action_answers import failover_answer

pytestmark = pytest.mark.long


def _topics(bootstrap: str) -> set[str]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


def test_failing_back_to_the_primary_after_a_failover(
        spark, clusters, ledger: Engine, listeners, tmp_path: Path) -> None:  # noqa: F811
    primary, backup = clusters["primary"], clusters["backup"]
    dsn = ledger.url.render_as_string(hide_password=False)
    runner = CliRunner()
    from offset_ledger.cli.main import app

    # -- the forward leg: read on the primary, MM2 checkpoints the group, fail over ------------------
    leg = first_leg_on_the_primary(spark, clusters, dsn, listeners, tmp_path, "fb")
    topic, pipeline, mm2, first, root, read_on_primary = (leg.topic, leg.pipeline, leg.mm2, leg.first, leg.root,
                                                          leg.read_on_primary)
    remote = f"primary.{topic}"
    ledger_primary = position_map(ledger, pipeline)

    def checkpointed() -> bool:
        cps = read_checkpoints(backup.bootstrap_servers, checkpoints_topic("primary"), pipeline)
        return {tp.partition: cp.upstream_next_offset for tp, cp in cps.items()} == {
            p: o for (_t, p), o in ledger_primary.items()}

    _wait(lambda: sum(_end_offsets(backup.bootstrap_servers, remote).values()) == 40, 120, "replication", mm2)
    _wait(checkpointed, 120, "MM2 to checkpoint the pipeline's group", mm2)
    # Records MM2 replicates that the pipeline has not read yet: the backup run reads them.
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        second = [f"b{i}" for i in range(10)]
        on_primary.produce(topic, second)
    finally:
        on_primary.close()
    _wait(lambda: sum(_end_offsets(backup.bootstrap_servers, remote).values()) == 50, 120, "the tail", mm2)
    mm2.stop()
    # Records that reach the primary but never the backup before it goes down: only failing back
    # can read them.
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        stranded = [f"s{i}" for i in range(4)]
        on_primary.produce(topic, stranded)
    finally:
        on_primary.close()
    primary.stop()

    over = failover(pipeline, to_bootstrap=backup.bootstrap_servers, source_alias="primary", dsn=dsn)
    assert over.topics == [remote] and over.generation == 2
    spark.streams.removeListener(listeners[0])
    listeners[0].close(10)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=backup.bootstrap_servers)
    plan = start_from_ledger(pipeline, [remote], bootstrap_servers=backup.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    read_on_backup = _run(spark, backup.bootstrap_servers, remote, plan, tmp_path / "out-backup")
    assert set(second) <= set(read_on_backup)
    assert listeners[1].flush(30) and listeners[1].flush_mirror(60)
    ledger_backup = position_map(ledger, pipeline)
    assert ledger_backup == {(remote, p): o for p, o in _end_offsets(backup.bootstrap_servers, remote).items()}

    # -- the primary comes back; MM2 runs backup -> primary -----------------------------------------
    primary = start_broker(primary.root)  # the same log directory: the same cluster, new ports
    clusters["started"].append(primary)
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        # Records the primary takes after it is back (producers failed back first).
        after = [f"c{i}" for i in range(3)]
        on_primary.produce(topic, after)
    finally:
        on_primary.close()
    back = start_mirror_maker(tmp_path / "mm2-back", source=backup.bootstrap_servers,
                              target=primary.bootstrap_servers, source_alias="backup", target_alias="primary",
                              topics=f"{topic}|{remote.replace('.', '[.]')}", groups=pipeline)
    clusters["started"].append(back)
    back_cps = checkpoints_topic("backup")
    _wait(lambda: back_cps in _topics(primary.bootstrap_servers), 120, "MM2's checkpoints topic on the primary",
          back)
    # MM2 emits checkpoints every second here; give it well over that to translate the group.
    time.sleep(20)
    seen = read_checkpoints(primary.bootstrap_servers, back_cps, pipeline)
    on_primary_topics = sorted(t for t in _topics(primary.bootstrap_servers) if topic in t)
    print(f"MM2 backup->primary: checkpoints of {pipeline}: {seen}; topics on the primary: {on_primary_topics}")
    print(back.log_tail(6000))
    # What MM2 does (Apache Kafka 4.1.1): it does not replicate primary.<topic> back (its source is
    # the target cluster: a cycle), so it has no offset syncs for it and never checkpoints the
    # group's offsets on it.
    assert seen == {}
    assert f"backup.{remote}" not in on_primary_topics
    back.stop()

    # -- failing back: refused loudly, then the documented way --------------------------------------
    with pytest.raises(FailoverRefused) as refused:
        failover(pipeline, to_bootstrap=primary.bootstrap_servers, source_alias="backup", target_alias="primary",
                 dsn=dsn)
    print(refused.value.message)
    assert refused.value.details.get("reason") == "uncheckpointed"
    assert "does not translate" in refused.value.message and f"{remote}:0" in refused.value.message
    assert position_map(ledger, pipeline) == ledger_backup  # nothing written

    cli = _cli("failover", pipeline, "--to-bootstrap", primary.bootstrap_servers, "--source-alias", "backup",
               "--target-alias", "primary", "--dsn", dsn)
    print(cli.stderr)
    assert cli.returncode == 3 and len(cli.stderr.strip().splitlines()) == 1, cli.stderr
    assert "not_translated_back" not in cli.stderr and "does not translate" in cli.stderr

    dry = runner.invoke(app, ["failover", pipeline, "--to-bootstrap", primary.bootstrap_servers,
                              "--source-alias", "backup", "--target-alias", "primary",
                              "--uncheckpointed", "earliest", "--dry-run", "--dsn", dsn])
    print(dry.output)
    assert dry.exit_code == 0, dry.output
    result = failover(pipeline, to_bootstrap=primary.bootstrap_servers, source_alias="backup",
                      target_alias="primary", uncheckpointed="earliest", dsn=dsn)
    print(failover_answer(result))
    assert result.topics == [topic] and result.generation == 3
    assert {p.status for p in result.plan.partitions} == {"earliest"}
    assert position_map(ledger, pipeline) == {(topic, int(p)): o for p, o in result.starting_offsets[topic].items()}

    # -- the run on the primary ----------------------------------------------------------------------
    spark.streams.removeListener(listeners[1])
    listeners[1].close(10)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=primary.bootstrap_servers)
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=primary.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    assert plan.checkpoint_location == result.checkpoint_location
    read_back = _run(spark, primary.bootstrap_servers, topic, plan, tmp_path / "out-failback")

    # The oracle: every record on the primary's topic is read after failing back (nothing skipped,
    # the stranded and the new ones included), and what is read again is within the plan's bound.
    on_topic = first + second + stranded + after
    assert sorted(read_back) == sorted(on_topic)
    reread = [v for v in read_back if v in set(read_on_primary) | set(read_on_backup)]
    assert len(reread) <= result.reread_max
    print(f"failback read {len(read_back)} record(s), {len(reread)} again; the plan said at most "
          f"{result.reread_max}")
    assert listeners[2].flush(30) and listeners[2].flush_mirror(60)
    assert position_map(ledger, pipeline) == {(topic, p): o for p, o in
                                              _end_offsets(primary.bootstrap_servers, topic).items()}
    verify = runner.invoke(app, ["verify", pipeline, "--dsn", dsn])
    print(verify.output)
    assert verify.exit_code == 0, verify.output


IDENTITY = {"replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"}


def _values(bootstrap: str, topic: str) -> list[str]:
    """Every value on the topic now (the oracle: what the pipeline must read from the log start)."""
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        parts = [KTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out: list[str] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in parts) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                out.extend(r.value.decode() for r in batch)
        return out
    finally:
        consumer.close()


def test_an_identity_policy_failback_is_refused_and_reads_the_copy_mm2_appended(
        spark, clusters, ledger: Engine, listeners, tmp_path: Path) -> None:  # noqa: F811
    """IdentityReplicationPolicy both ways: what the reverse flow does to the original topic, and the refusal."""
    primary, backup = clusters["primary"], clusters["backup"]
    dsn = ledger.url.render_as_string(hide_password=False)
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        topic = on_primary.create_topic(2, name=f"orders_{uuid.uuid4().hex[:6]}")
        first = [f"a{i}" for i in range(20)]
        on_primary.produce(topic, first)
    finally:
        on_primary.close()
    pipeline = f"fbi_{uuid.uuid4().hex[:6]}"
    mm2 = start_mirror_maker(tmp_path / "mm2", source=primary.bootstrap_servers, target=backup.bootstrap_servers,
                             topics=topic, groups=pipeline, extra=IDENTITY)
    clusters["started"].append(mm2)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=primary.bootstrap_servers)
    root = str(tmp_path / "checkpoints")
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=primary.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1", first_run="earliest")
    read_on_primary = _run(spark, primary.bootstrap_servers, topic, plan, tmp_path / "out-primary")
    assert sorted(read_on_primary) == sorted(first)
    assert listeners[0].flush(30) and listeners[0].flush_mirror(60)
    ledger_primary = position_map(ledger, pipeline)

    def checkpointed() -> bool:
        cps = read_checkpoints(backup.bootstrap_servers, checkpoints_topic("primary"), pipeline)
        return {tp.partition: cp.upstream_next_offset for tp, cp in cps.items()} == {
            p: o for (_t, p), o in ledger_primary.items()}

    _wait(lambda: sum(_end_offsets(backup.bootstrap_servers, topic).values()) == 20, 120, "replication", mm2)
    _wait(checkpointed, 120, "MM2 to checkpoint the pipeline's group", mm2)
    mm2.stop()
    on_primary = KafkaHelper(primary.bootstrap_servers)
    try:
        stranded = [f"s{i}" for i in range(4)]  # never reach the backup
        on_primary.produce(topic, stranded)
    finally:
        on_primary.close()
    primary_ends = _end_offsets(primary.bootstrap_servers, topic)
    primary.stop()

    over = failover(pipeline, to_bootstrap=backup.bootstrap_servers, source_alias="primary",
                    replication_policy="identity", dsn=dsn)
    assert over.topics == [topic] and {p.status for p in over.plan.partitions} == {"translated"}
    spark.streams.removeListener(listeners[0])
    listeners[0].close(10)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=backup.bootstrap_servers)
    on_backup = KafkaHelper(backup.bootstrap_servers)
    try:
        during = [f"d{i}" for i in range(6)]  # produced on the backup during the outage
        on_backup.produce(topic, during)
    finally:
        on_backup.close()
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=backup.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    read_on_backup = _run(spark, backup.bootstrap_servers, topic, plan, tmp_path / "out-backup")
    assert set(during) <= set(read_on_backup)
    assert listeners[1].flush(30) and listeners[1].flush_mirror(60)
    backup_total = sum(_end_offsets(backup.bootstrap_servers, topic).values())

    primary = start_broker(primary.root)
    clusters["started"].append(primary)
    back = start_mirror_maker(tmp_path / "mm2-back", source=backup.bootstrap_servers,
                              target=primary.bootstrap_servers, source_alias="backup", target_alias="primary",
                              topics=topic, groups=pipeline, extra=IDENTITY)
    clusters["started"].append(back)
    # What MM2 does with the identity policy: no cycle detection, the backup's whole copy (the
    # primary's own records replicated, plus what the backup took) is appended to the original topic.
    _wait(lambda: sum(_end_offsets(primary.bootstrap_servers, topic).values())
          == sum(primary_ends.values()) + backup_total, 120, "the reverse flow to append the backup's copy", back)

    def translated() -> bool:
        cps = read_checkpoints(primary.bootstrap_servers, checkpoints_topic("backup"), pipeline)
        return len(cps) == 2

    _wait(translated, 120, "MM2 to checkpoint the group backup->primary", back)
    cps = read_checkpoints(primary.bootstrap_servers, checkpoints_topic("backup"), pipeline)
    print(f"identity backup->primary checkpoints: {cps}; primary ends before: {primary_ends}")
    # The translation lands in the appended copy: past the stranded records of the original log.
    assert all(cp.downstream_next_offset >= primary_ends[tp.partition] for tp, cp in cps.items())
    back.stop()

    with pytest.raises(FailoverRefused) as refused:
        failover(pipeline, to_bootstrap=primary.bootstrap_servers, source_alias="backup", target_alias="primary",
                 replication_policy="identity", dsn=dsn)
    print(refused.value.message)
    assert {p["reason"] for p in refused.value.details["problems"]} == {"not_translated_back"}
    result = failover(pipeline, to_bootstrap=primary.bootstrap_servers, source_alias="backup", target_alias="primary",
                      replication_policy="identity", uncheckpointed="earliest", dsn=dsn)
    print(failover_answer(result)["findings"][0]["message"])
    spark.streams.removeListener(listeners[1])
    listeners[1].close(10)
    register(spark, listeners, tmp_path, dsn=dsn, pipeline=pipeline, commit_to_kafka=True,
             bootstrap_servers=primary.bootstrap_servers)
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=primary.bootstrap_servers, dsn=dsn,
                             checkpoint_root=root, app_version="1")
    assert plan.checkpoint_location == result.checkpoint_location
    read_back = _run(spark, primary.bootstrap_servers, topic, plan, tmp_path / "out-failback")
    on_topic = _values(primary.bootstrap_servers, topic)
    assert sorted(read_back) == sorted(on_topic)  # nothing skipped, the appended duplicates included
    assert set(stranded) <= set(read_back) and len(read_back) <= result.reread_max
    print(f"identity failback read {len(read_back)} record(s) (plan: at most {result.reread_max}); "
          f"{len(read_back) - len(set(read_back))} duplicate(s) MM2 appended")
    assert listeners[2].flush(30) and listeners[2].flush_mirror(60)
    from offset_ledger.cli.main import app

    verify = CliRunner().invoke(app, ["verify", pipeline, "--dsn", dsn])
    print(verify.output)
    assert verify.exit_code == 0, verify.output
