"""``operate/failover.py`` over the embedded SQLite ledger, with an in-memory fake of the Kafka side.

The fake stands for the target cluster (partitions, watermarks, topic ids, record timestamps, MM2's
checkpoints, the cluster id); the ledger, the plan, the lock and the generation are the real code.
The real-stack tests (test_failover.py, test_failback.py, test_failover_short.py) check the fake's
answers against Kafka and MirrorMaker 2 themselves.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self

import pytest
from sqlalchemy import insert, select
from sqlalchemy.engine import Engine

from offset_ledger.errors import ActiveRunConflict, FailoverRefused, InvalidInput
from offset_ledger.kafka.snapshot import ClusterSnapshot
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import (
    checkpoint_generations,
    findings,
    positions,
    resets,
    runs,
)
from offset_ledger.operate import failover as fo
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart import restart
from offset_ledger.rules.restart_request import RestartRequest
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions
from offset_ledger.rules.failover import Mm2Checkpoint
from offset_ledger.rules.model import TopicPartition, Watermarks

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
BACKUP = "backup:9092"


class FakeCluster:
    """One Kafka cluster: topics with watermarks and ids, MM2 checkpoints (by source alias), a cluster id."""

    def __init__(self, cluster_id: str) -> None:
        self.marks: dict[TopicPartition, Watermarks] = {}
        self.ids: dict[str, str] = {}
        self.checkpoints: dict[str, list[Mm2Checkpoint]] = {}
        self.cluster_id = cluster_id

    def add_topic(self, topic: str, ends: dict[int, tuple[int, int]], topic_id: str) -> None:
        for p, (start, end) in ends.items():
            self.marks[TopicPartition(topic, p)] = Watermarks(start, end)
        self.ids[topic] = topic_id

    # -- what operate/failover.py asks of a KafkaAdapter
    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def partitions(self, topics: Sequence[str]) -> dict[str, list[int]]:
        return {t: sorted(tp.partition for tp in self.marks if tp.topic == t)
                for t in topics if any(tp.topic == t for tp in self.marks)}

    def watermarks(self, topics: Sequence[str]) -> dict[TopicPartition, Watermarks]:
        return {tp: wm for tp, wm in self.marks.items() if tp.topic in topics}

    def topic_ids(self, topics: Sequence[str]) -> dict[str, str]:
        return {t: i for t, i in self.ids.items() if t in topics}

    def record_timestamps(self, wanted: Any, **_: Any) -> dict[tuple[TopicPartition, int], int]:
        return {(tp, o): 1_000 * (o + 1) for tp, o in wanted}  # record time: one second per offset

    # -- what the restart asks
    def snapshot(self, topics: Sequence[str]) -> ClusterSnapshot:
        return ClusterSnapshot(self.partitions(topics), self.topic_ids(topics), self.watermarks(topics))

    def offsets_for_time(self, tps: Any, timestamp_ms: int) -> dict[Any, None]:
        return {tp: None for tp in tps}

    def topics_matching(self, pattern: str) -> list[str]:
        return sorted(self.ids)

    def close(self) -> None:
        pass


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, str, FakeCluster]]:
    """A ledger where pipeline ``orders`` read ``orders`` on the primary to 6/5; a backup MM2 fills."""
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(dsn)
    ensure_schema(engine)
    with engine.begin() as conn:
        gens.create_generation(conn, gens.NewGeneration(
                               pipeline="orders", consumer_group="orders", checkpoint_root=str(tmp_path / "ck"),
                               app_version="1", reason="first", starting_offsets={"orders": {"0": 6, "1": 5}},
                               resolved_offsets={"orders": {"0": 6, "1": 5}}, topic_ids={"orders": "id-primary"}))
    backup = FakeCluster("backup-cluster")
    backup.add_topic("primary.orders", {0: (0, 8), 1: (0, 7)}, "id-backup")
    backup.checkpoints["primary"] = [Mm2Checkpoint("orders", "primary.orders", 0, 4, 4),
                                     Mm2Checkpoint("orders", "primary.orders", 1, 5, 5),
                                     Mm2Checkpoint("someone-else", "primary.orders", 1, 7, 7)]
    clusters = {BACKUP: backup}

    def read_checkpoints(bootstrap: str, topic: str, group: str, **_: Any) -> dict[TopicPartition, Mm2Checkpoint]:
        alias = topic.removesuffix(".checkpoints.internal")
        if alias not in clusters[bootstrap].checkpoints:
            raise FailoverRefused(f"no MirrorMaker 2 checkpoints topic {topic!r}", reason="no_checkpoints_topic")
        return {cp.tp: cp for cp in clusters[bootstrap].checkpoints[alias] if cp.consumer_group == group}

    # The target's client is made from the request's address (KafkaAdapter.open), as in the package.
    monkeypatch.setattr(fo, "KafkaAdapter", SimpleNamespace(open=lambda address: clusters[address.require()]))
    monkeypatch.setattr(fo, "read_checkpoints", read_checkpoints)
    monkeypatch.setattr(fo, "cluster_id", lambda bootstrap, options=None: clusters[bootstrap].cluster_id)
    world = (engine, dsn, backup)
    world[2].clusters = clusters  # type: ignore[attr-defined] - a second cluster for failing back
    yield world
    engine.dispose()


def _positions(engine: Engine) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        return {(r.topic, r.partition): r.next_offset for r in conn.execute(select(positions))}


def _generations(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(checkpoint_generations).order_by(checkpoint_generations.c.generation)))


def _findings(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(findings).order_by(findings.c.id)))


def test_a_failover_records_a_generation_with_the_backups_topic_ids_and_the_gap(world: Any) -> None:
    engine, dsn, _backup = world
    result = fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    assert result.topics == ["primary.orders"] and result.generation == 2
    assert result.starting_offsets == {"primary.orders": {"0": 4, "1": 5}}
    assert json.loads(result.starting_offsets_json) == {"primary.orders": {"0": 4, "1": 5}}
    # partition 0: the ledger read 2 records past MM2's checkpoint (certain), the backup holds 4 from 4 on
    by_part = {p.partition: p for p in result.plan.partitions}
    assert (by_part[0].behind_checkpoint, by_part[0].reread_max) == (2, 4)
    assert (by_part[1].behind_checkpoint, by_part[1].reread_max) == (0, 2)
    assert (by_part[0].reread_from_ms, by_part[0].reread_until_ms) == (5_000, 8_000)
    assert result.target_cluster_id == "backup-cluster"

    gen = _generations(engine)[-1]
    assert gen.reason == "failover" and gen.location == result.checkpoint_location
    assert gen.topic_ids == {"primary.orders": "id-backup"}  # the backup's, never the primary's id
    # The primary's positions are gone (another cluster's offsets); the backup's are the positions.
    assert _positions(engine) == {("primary.orders", 0): 4, ("primary.orders", 1): 5}
    stored = [f for f in _findings(engine) if f.kind == "failover"]
    assert len(stored) == 1 and stored[0].generation_id == gen.id
    assert stored[0].details["reread_max"] == 6 and stored[0].details["target_cluster_id"] == "backup-cluster"
    assert stored[0].details["topic_map"] == {"orders": "primary.orders"}


def test_a_dry_run_writes_nothing(world: Any) -> None:
    engine, dsn, _backup = world
    before = (_positions(engine), len(_generations(engine)), len(_findings(engine)))
    result = fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn, dry_run=True)
    assert result.dry_run and result.generation is None and result.checkpoint_location is None
    assert result.starting_offsets == {"primary.orders": {"0": 4, "1": 5}}
    assert (_positions(engine), len(_generations(engine)), len(_findings(engine))) == before


def test_a_pending_reset_refuses_and_writes_nothing(world: Any) -> None:
    engine, dsn, _backup = world
    with engine.begin() as conn:
        conn.execute(insert(resets).values(pipeline="orders", consumer_group="orders", mode="earliest", parameters={},
                                           actor="t", reason=None, dry_run=False, forced=False, created_at=T0,
                                           status="pending"))
    with pytest.raises(FailoverRefused) as exc:
        fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    assert exc.value.details["reason"] == "reset_pending"
    assert len(_generations(engine)) == 1 and _positions(engine) == {("orders", 0): 6, ("orders", 1): 5}


def test_an_active_run_refuses_unless_forced(world: Any) -> None:
    engine, dsn, _backup = world
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(insert(runs).values(run_id="r1", query_id="q1", pipeline="orders", consumer_group="orders",
                                         started_at=now, last_heartbeat_at=now))
    with pytest.raises(ActiveRunConflict):
        fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    assert len(_generations(engine)) == 1
    forced = fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn, force=True)
    assert forced.generation == 2


def test_an_uncheckpointed_partition_is_refused_or_starts_at_the_log_start(world: Any) -> None:
    engine, dsn, backup = world
    backup.checkpoints["primary"] = [cp for cp in backup.checkpoints["primary"] if cp.partition == 0]
    with pytest.raises(FailoverRefused) as exc:
        fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    assert "primary.orders:1 (no_checkpoint)" in exc.value.message and len(_generations(engine)) == 1
    result = fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn, uncheckpointed="earliest")
    assert result.starting_offsets == {"primary.orders": {"0": 4, "1": 0}}
    assert [f.kind for f in _findings(engine)][-2:] == ["failover", "failover"]


def test_a_restart_after_the_failover_resumes_its_generation(world: Any, tmp_path: Path) -> None:
    engine, dsn, backup = world
    result = fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    plan = restart(Operations(engine, kafka=backup), RestartRequest(PipelineRef("orders"), RestartOptions(
        topics=("primary.orders",), checkpoint_root=str(tmp_path / "ck"), app_version="1")))
    assert plan.checkpoint_location == result.checkpoint_location and plan.generation == 2
    assert plan.starting_offsets == {"primary.orders": {"0": 4, "1": 5}}
    assert len(_generations(engine)) == 2


def test_a_second_failover_in_a_row_plans_from_the_backups_positions(world: Any) -> None:
    """Failing over twice without a run between: the second reads the positions the first wrote."""
    engine, dsn, backup = world
    fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    # A third cluster "dr" that MM2 fills from the backup: backup.primary.orders there.
    dr = FakeCluster("dr-cluster")
    dr.add_topic("backup.primary.orders", {0: (0, 8), 1: (0, 7)}, "id-dr")
    dr.checkpoints["backup"] = [Mm2Checkpoint("orders", "backup.primary.orders", 0, 4, 3),
                                Mm2Checkpoint("orders", "backup.primary.orders", 1, 5, 5)]
    backup.clusters["dr:9092"] = dr  # type: ignore[attr-defined]
    second = fo.failover("orders", to_bootstrap="dr:9092", source_alias="backup", dsn=dsn)
    assert second.generation == 3 and second.topics == ["backup.primary.orders"]
    assert _positions(engine) == {("backup.primary.orders", 0): 3, ("backup.primary.orders", 1): 5}
    assert _generations(engine)[-1].topic_ids == {"backup.primary.orders": "id-dr"}


def test_failing_back_is_refused_specifically_and_earliest_reads_the_original_topic(world: Any) -> None:
    """MM2 never checkpoints primary.orders back to the primary (see docs/failover.md, Failing back)."""
    engine, dsn, backup = world
    fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    primary = FakeCluster("primary-cluster")
    primary.add_topic("orders", {0: (0, 9), 1: (0, 6)}, "id-primary")
    backup.clusters["primary:9092"] = primary  # type: ignore[attr-defined] - no backup.checkpoints.internal
    before = (_positions(engine), len(_generations(engine)))
    with pytest.raises(FailoverRefused) as exc:
        fo.failover("orders", to_bootstrap="primary:9092", source_alias="backup", target_alias="primary", dsn=dsn)
    assert "does not translate offsets on primary.orders:0, primary.orders:1" in exc.value.message
    assert "waiting does not help" in exc.value.message
    assert {p["reason"] for p in exc.value.details["problems"]} == {"not_translated_back"}
    assert (_positions(engine), len(_generations(engine))) == before
    # The same with a reverse flow that checkpointed other groups only: still the specific refusal.
    primary.checkpoints["backup"] = [Mm2Checkpoint("someone-else", "orders", 0, 1, 1)]
    with pytest.raises(FailoverRefused, match="does not translate"):
        fo.failover("orders", to_bootstrap="primary:9092", source_alias="backup", target_alias="primary", dsn=dsn)

    back = fo.failover("orders", to_bootstrap="primary:9092", source_alias="backup", target_alias="primary",
                       uncheckpointed="earliest", dsn=dsn)
    assert back.topics == ["orders"] and back.generation == 3
    assert back.starting_offsets == {"orders": {"0": 0, "1": 0}} and back.reread_max == 15
    assert _positions(engine) == {("orders", 0): 0, ("orders", 1): 0}
    assert _generations(engine)[-1].topic_ids == {"orders": "id-primary"}


def test_without_the_target_alias_a_failback_is_an_ordinary_missing_topic(world: Any) -> None:
    """Without --target-alias, primary.orders maps to backup.primary.orders, which MM2 never creates."""
    _engine, dsn, backup = world
    fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn)
    primary = FakeCluster("primary-cluster")
    primary.add_topic("orders", {0: (0, 9), 1: (0, 6)}, "id-primary")
    primary.checkpoints["backup"] = []
    backup.clusters["primary:9092"] = primary  # type: ignore[attr-defined]
    with pytest.raises(FailoverRefused) as exc:
        fo.failover("orders", to_bootstrap="primary:9092", source_alias="backup", dsn=dsn)
    assert exc.value.details["reason"] == "topic_missing" and "backup.primary.orders" in exc.value.message


def test_an_identity_policy_failback_never_trusts_mm2s_translation_onto_the_original_topic(world: Any) -> None:
    """Identity names carry no origin: the target topic's Kafka id (read in generation 1) says it is home."""
    engine, dsn, backup = world
    backup.add_topic("orders", {0: (0, 8), 1: (0, 7)}, "id-backup-orders")  # the identity policy's replica
    backup.checkpoints["primary"] = [Mm2Checkpoint("orders", "orders", 0, 6, 6), Mm2Checkpoint("orders", "orders", 1, 5, 5)]
    over = fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", replication_policy="identity", dsn=dsn)
    assert over.topics == ["orders"] and {p.status for p in over.plan.partitions} == {"translated"}
    assert _generations(engine)[-1].topic_ids == {"orders": "id-backup-orders"}  # another cluster's topic
    primary = FakeCluster("primary-cluster")
    primary.add_topic("orders", {0: (0, 17), 1: (0, 14)}, "id-primary")  # the backup's copy appended
    # The reverse flow translated the group into the appended copy, past the primary's own records.
    primary.checkpoints["backup"] = [Mm2Checkpoint("orders", "orders", 0, 6, 15), Mm2Checkpoint("orders", "orders", 1, 5, 12)]
    backup.clusters["primary:9092"] = primary  # type: ignore[attr-defined]
    with pytest.raises(FailoverRefused) as exc:
        fo.failover("orders", to_bootstrap="primary:9092", source_alias="backup", replication_policy="identity",
                    dsn=dsn)
    assert "failing back" in exc.value.message and "orders:0, orders:1" in exc.value.message
    assert [p["reason"] for p in exc.value.details["problems"]] == ["not_translated_back"] * 2
    assert len(_generations(engine)) == 2
    back = fo.failover("orders", to_bootstrap="primary:9092", source_alias="backup", replication_policy="identity",
                       uncheckpointed="earliest", dsn=dsn)
    assert back.starting_offsets == {"orders": {"0": 0, "1": 0}} and back.reread_max == 31


@pytest.mark.parametrize("topics", [[], "orders"])
def test_no_topics_or_a_bare_topic_name_is_refused_before_anything_is_written(world: Any, topics: Any) -> None:
    # An empty list carried nothing over and dropped every position of the pipeline; a string was
    # read as its letters. Both are refused by the request value, before the ledger is opened.
    engine, dsn, _backup = world
    before = (_positions(engine), len(_generations(engine)), len(_findings(engine)))
    with pytest.raises(InvalidInput) as exc:
        fo.failover("orders", to_bootstrap=BACKUP, source_alias="primary", dsn=dsn, topics=topics)
    assert exc.value.details["option"] == "topics"
    assert (_positions(engine), len(_generations(engine)), len(_findings(engine))) == before
