"""Property: a restart never starts behind what the authoritative checkpoint committed, nor ahead of it
unless a reset says so — whatever the listener delivered, whatever lands while the restart plans, and
whatever prune removed.

A simulated Spark job writes real checkpoint files (``offsets/N``, ``commits/N``, ``metadata``,
``sources/0/0`` in Spark's v1 format) under the locations the restart hands out; the listener's
events for it are delivered to the real ``Recorder`` or dropped, at random. Resets go through the
real ``Operations.reset``; restarts through the real ``restart`` verb on an SQLite ledger. The
cluster is an in-memory stand-in (pure logic under test here; tests/integration has the real one).
Interleavings are drawn by hypothesis, including a reset or a batch landing while a restart plans.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offset_ledger.operate import reset_operations
from offset_ledger.kafka.snapshot import ClusterSnapshot
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.prune import prune
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart import restart
from offset_ledger.rules.restart_request import RestartRequest
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions
from offset_ledger.rules.model import (
    EARLIEST,
    LATEST,
    BatchOffsets,
    PartitionRange,
    SourceProgress,
    TopicPartition,
    Watermarks,
)
from offset_ledger.rules.resets import ResetRequest

TOPIC = "t"
PARTS = (0, 1)


class Cluster:
    """Log-start 0, a growing log-end per partition; ``during_snapshot`` runs once inside the next look."""

    def __init__(self) -> None:
        self.log_end = {p: 0 for p in PARTS}
        self.during_snapshot: Callable[[], None] | None = None

    def snapshot(self, topics: Sequence[str]) -> ClusterSnapshot:
        hook, self.during_snapshot = self.during_snapshot, None
        if hook is not None:
            hook()  # something lands between the restart's read of the ledger and its decision
        marks = {TopicPartition(TOPIC, p): Watermarks(0, e) for p, e in self.log_end.items()}
        return ClusterSnapshot({TOPIC: list(PARTS)}, {TOPIC: "id-1"}, marks)

    def offsets_for_time(self, tps: Any, timestamp_ms: int) -> dict[Any, None]:
        return {tp: None for tp in tps}

    def topics_matching(self, pattern: str) -> list[str]:
        return [TOPIC]

    def close(self) -> None:
        pass


class Job:
    """A Spark query on one checkpoint: fresh (batch 0 from ``start``) or resumed from its commit log."""

    def __init__(self, location: str, start: dict[int, int] | None) -> None:
        self.root = Path(location)
        (self.root / "offsets").mkdir(parents=True, exist_ok=True)
        (self.root / "commits").mkdir(exist_ok=True)
        if start is not None:
            self.query_id = str(uuid.uuid4())
            (self.root / "metadata").write_text(json.dumps({"id": self.query_id}))
            (self.root / "sources" / "0").mkdir(parents=True)
            (self.root / "sources" / "0" / "0").write_bytes(b"\x00v1\n" + self._json(start).encode())
            self.ends, self.next_batch = dict(start), 0
        else:
            self.query_id = json.loads((self.root / "metadata").read_text())["id"]
            done = [int(n) for n in (p.name for p in (self.root / "commits").iterdir()) if n.isdigit()]
            if done:
                line = (self.root / "offsets" / str(max(done))).read_text().splitlines()[2]
            else:  # nothing committed: Spark starts batch 0 from the initial offsets again
                line = (self.root / "sources" / "0" / "0").read_bytes().decode().split("\n", 1)[1]
            self.ends = {int(p): o for p, o in json.loads(line)[TOPIC].items()}
            self.next_batch = max(done) + 1 if done else 0
        self.run_id = str(uuid.uuid4())
        self.started = datetime.now(timezone.utc)

    @staticmethod
    def _json(ends: dict[int, int]) -> str:
        return json.dumps({TOPIC: {str(p): o for p, o in sorted(ends.items())}})

    def start_event(self) -> RunStart:
        return RunStart("orders", "orders", self.query_id, self.run_id, "orders", self.started,
                        checkpoint_location=str(self.root))

    def batch(self, log_end: dict[int, int]) -> BatchRecord:
        """Read everything up to ``log_end`` and commit: offsets file first, then the commit file."""
        since, self.ends = dict(self.ends), {p: max(self.ends[p], log_end[p]) for p in PARTS}
        n = self.next_batch
        self.next_batch += 1
        at = datetime.now(timezone.utc)
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": int(at.timestamp() * 1000)})
        (self.root / "offsets" / str(n)).write_text(f"v1\n{meta}\n{self._json(self.ends)}\n")
        (self.root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        ranges = tuple(PartitionRange(TOPIC, p, since[p], self.ends[p]) for p in PARTS)
        return BatchRecord("orders", "orders", BatchOffsets(
            self.query_id, self.run_id, "orders", n, at, sum(r.until_offset - r.from_offset for r in ranges),
            (SourceProgress(0, f"KafkaV2[Subscribe[{TOPIC}]]", ranges,
                            sum(r.until_offset - r.from_offset for r in ranges)),)))


World = tuple[Any, Cluster, Recorder]


def _restart(world: World, tmp_path: Path, version: str) -> Any:
    engine, cluster, _ = world
    return restart(Operations(engine, kafka=cluster), RestartRequest(PipelineRef("orders"), RestartOptions(
        topics=(TOPIC,), checkpoint_root=str(tmp_path / "ck"), app_version=version)))


def _first_run(world: World, tmp_path: Path, log_end: dict[int, int]) -> tuple[Any, Job]:
    """Generation 1 from earliest, its job started and its first batch recorded by the listener."""
    engine, cluster, recorder = world
    cluster.log_end = dict(log_end)
    plan = _restart(world, tmp_path, "1")
    job = Job(plan.checkpoint_location or "", {p: 0 for p in PARTS})
    recorder.record([job.start_event(), job.batch(cluster.log_end)])
    return plan, job


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """An SQLite ledger at the newest schema, a stand-in cluster, and the real recorder."""
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(engine)
    recorder = Recorder(engine)
    yield engine, Cluster(), recorder
    recorder.close()
    engine.dispose()


OPS = st.lists(st.one_of(
    st.tuples(st.just("produce"), st.integers(1, 5), st.integers(0, 7)),
    st.tuples(st.just("batch"), st.booleans()),           # committed; delivered to the ledger or dropped
    st.tuples(st.just("reset"), st.sampled_from(["earliest", "latest", "offset"])),
    st.tuples(st.just("restart"), st.booleans(), st.sampled_from([None, "reset", "batch"])),
    st.tuples(st.just("prune")),                          # all history "old": only what is promised stays
), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, deliver_start=st.booleans())
def test_a_restart_starts_exactly_at_the_checkpoint_or_the_reset(tmp_path_factory: Any, ops: list[tuple[Any, ...]],
                                                                   deliver_start: bool) -> None:
    tmp = tmp_path_factory.mktemp("gt")
    engine = make_engine(f"sqlite:///{tmp / 'ledger.db'}")
    upgrade(engine)
    cluster = Cluster()
    recorder = Recorder(engine)
    ops_api = Operations(engine, kafka=cluster)  # type: ignore[arg-type]
    version = 1
    job: Job | None = None
    expected: dict[int, int] | None = None  # what the next restart must start from (None: first run)
    reset_pending = False

    def commit(deliver: bool) -> None:
        nonlocal expected
        assert job is not None
        rec = job.batch(cluster.log_end)
        if not reset_pending:
            expected = dict(job.ends)
        if deliver:
            recorder.record([rec])

    def reset(kind: str) -> None:
        nonlocal expected, reset_pending
        if kind == "earliest":
            request = ResetRequest("earliest")
        elif kind == "latest":
            request = ResetRequest("latest")
        else:
            request = ResetRequest("offsets", offsets={TopicPartition(TOPIC, p): cluster.log_end[p] // 2
                                                       for p in PARTS})
        try:
            out = reset_operations.reset(ops_api, "orders", request, actor="test", reason="property", dry_run=False, force=True)
        except Exception as exc:  # a pipeline with no positions yet cannot be reset: nothing changes
            assert "no positions" in str(exc) or "unknown pipeline" in str(exc), exc
            return
        expected = {c.partition: c.target_next_offset for c in out.plan.partitions}
        reset_pending = True

    try:
        for op in ops:
            if op[0] == "produce":
                cluster.log_end[op[2] % 2] += op[1]
            elif op[0] == "batch" and job is not None:
                commit(op[1])
            elif op[0] == "reset" and expected is not None:
                reset(op[1])
            elif op[0] == "prune":
                prune(engine, timedelta(seconds=1), execute=True, now=datetime.now(timezone.utc) + timedelta(days=1))
            elif op[0] == "restart":
                if op[1]:
                    version += 1
                if op[2] == "reset" and expected is not None:
                    cluster.during_snapshot = lambda: reset("latest")
                elif op[2] == "batch" and job is not None:
                    cluster.during_snapshot = lambda: commit(True)
                plan = restart(Operations(engine, kafka=cluster), RestartRequest(PipelineRef("orders"), RestartOptions(
                    topics=(TOPIC,), checkpoint_root=str(tmp / "ck"), app_version=str(version))))
                cluster.during_snapshot = None
                if plan.fresh_checkpoint:
                    start = {int(p): (0 if o == EARLIEST else cluster.log_end[int(p)] if o == LATEST else o)
                             for p, o in plan.starting_offsets[TOPIC].items()}
                    if expected is not None:
                        # The property: exactly the last commit of the authoritative checkpoint, or the reset.
                        assert start == expected, (start, expected, plan.findings)
                    job = Job(plan.checkpoint_location or "", start)
                else:
                    assert not reset_pending, "resumed a checkpoint that contradicts a pending reset"
                    job = Job(plan.checkpoint_location or "", None)
                    if expected is not None:
                        assert job.ends == expected
                expected, reset_pending = dict(job.ends), False
                if deliver_start:
                    recorder.record([job.start_event()])
                # The ledger caught up with the checkpoint it resumes from (reconciled if events were lost).
                with engine.connect() as conn:
                    from offset_ledger.ledger.queries import current_positions

                    ledger = {p.partition: p.next_offset for p in current_positions(conn, "orders", "orders")}
                assert ledger == expected, (ledger, expected)
    finally:
        recorder.close()
        engine.dispose()


def test_reconciliation_backfills_what_the_listener_dropped_once(tmp_path: Path, world: World) -> None:
    """Two batches committed without the listener: the upgrade starts after them, history has them once."""
    engine, cluster, recorder = world
    plan, job = _first_run(world, tmp_path, {0: 10, 1: 10})
    cluster.log_end = {0: 20, 1: 30}
    job.batch(cluster.log_end)  # dropped
    cluster.log_end = {0: 25, 1: 31}
    job.batch(cluster.log_end)  # dropped
    plan2 = _restart(world, tmp_path, "2")
    assert plan2.fresh_checkpoint and plan2.starting_offsets == {TOPIC: {"0": 25, "1": 31}}
    backfilled = [f for f in plan2.findings if f.kind == "backfilled"]
    assert len(backfilled) == 1 and backfilled[0].details["batch_ids"] == [1, 2]
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT batch_id, source FROM batches ORDER BY batch_id")).all()
        assert [tuple(r) for r in rows] == [(0, None), (1, "checkpoint"), (2, "checkpoint")]
        spans = conn.execute(text("SELECT batch_id, \"partition\", from_offset, until_offset FROM v_batch_offsets "
                                  "ORDER BY batch_id, \"partition\"")).all()
        assert [tuple(r) for r in spans] == [(0, 0, 0, 10), (0, 1, 0, 10), (1, 0, 10, 20), (1, 1, 10, 30),
                                             (2, 0, 20, 25), (2, 1, 30, 31)]
    # A third restart on the same version reuses generation 2 and backfills nothing twice.
    plan3 = _restart(world, tmp_path, "2")
    assert not plan3.fresh_checkpoint and not [f for f in plan3.findings if f.kind == "backfilled"]


def test_an_unreadable_checkpoint_is_a_stored_finding_not_silence(tmp_path: Path, world: World) -> None:
    engine, cluster, recorder = world
    plan, job = _first_run(world, tmp_path, {0: 5, 1: 5})
    (job.root / "metadata").write_text("not json")
    plan2 = _restart(world, tmp_path, "2")
    found = [f for f in plan2.findings if f.kind == "checkpoint_unreadable"]
    assert len(found) == 1 and str(job.root) in found[0].message
    from sqlalchemy import text

    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM findings WHERE kind = 'checkpoint_unreadable'")).scalar() == 1


def test_a_ledger_that_keeps_moving_is_a_retryable_refusal_and_writes_nothing(tmp_path: Path, world: World) -> None:
    from sqlalchemy import text

    from offset_ledger.errors import PlanConflict

    engine, cluster, recorder = world
    plan, job = _first_run(world, tmp_path, {0: 5, 1: 5})

    class Busy(Cluster):
        def snapshot(self, topics: Sequence[str]) -> ClusterSnapshot:
            self.log_end[0] += 1
            recorder.record([job.batch(self.log_end)])  # the old job commits during every plan
            return super().snapshot(topics)

    busy = Busy()
    busy.log_end = dict(cluster.log_end)
    try:
        restart(Operations(engine, kafka=busy), RestartRequest(PipelineRef("orders"), RestartOptions(
            topics=(TOPIC,), checkpoint_root=str(tmp_path / "ck"), app_version="2")))
    except PlanConflict as exc:
        assert exc.retriable and "3 times" in exc.message and "position" in exc.message
    else:
        raise AssertionError("a plan that kept going stale was accepted")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM checkpoint_generations")).scalar() == 1


def test_a_defaulted_group_yields_to_the_group_the_runs_report(tmp_path: Path, world: World) -> None:
    from sqlalchemy import text

    engine, cluster, recorder = world
    cluster.log_end = {0: 5, 1: 7}
    plan = _restart(world, tmp_path, "1")
    assert plan.consumer_group == "orders"
    job = Job(plan.checkpoint_location or "", {0: 0, 1: 0})
    start, batch = job.start_event(), job.batch(cluster.log_end)
    # The listener was created with consumer_group="orders-etl"; the restart never named one.
    recorder.record([RunStart("orders", "orders-etl", start.query_id, start.run_id, "orders", start.started_at,
                              checkpoint_location="file:" + str(job.root)),
                     BatchRecord("orders", "orders-etl", batch.batch)])
    plan2 = _restart(world, tmp_path, "2")
    assert plan2.consumer_group == "orders-etl"
    assert plan2.starting_offsets == {TOPIC: {"0": 5, "1": 7}}
    with engine.connect() as conn:
        groups = {r[0] for r in conn.execute(text("SELECT DISTINCT consumer_group FROM checkpoint_generations"))}
        assert groups == {"orders-etl"}
    # A group someone named is never taken over.
    plan3 = restart(Operations(engine, kafka=cluster), RestartRequest(PipelineRef("other", "named"), RestartOptions(
        topics=(TOPIC,), checkpoint_root=str(tmp_path / "ck2"), app_version="1")))
    job3 = Job(plan3.checkpoint_location or "", {0: 0, 1: 0})
    s3 = job3.start_event()
    recorder.record([RunStart("other", "theirs", s3.query_id, s3.run_id, None, s3.started_at,
                              checkpoint_location=str(job3.root))])
    with engine.connect() as conn:
        assert conn.execute(text("SELECT consumer_group FROM checkpoint_generations WHERE pipeline = 'other'"
                                 )).scalar() == "named"


def test_a_copy_that_records_a_batch_first_does_not_hold_the_real_run_back(tmp_path: Path, world: World) -> None:
    """A copied checkpoint keeps the query id: its batch N and the real run's batch N share a key."""
    import shutil

    from sqlalchemy import text

    engine, cluster, recorder = world
    plan, real = _first_run(world, tmp_path, {0: 5, 1: 5})
    shutil.copytree(real.root, tmp_path / "copy")
    copy = Job(str(tmp_path / "copy"), None)
    cluster.log_end = {0: 9, 1: 9}
    recorder.record([copy.start_event(), copy.batch(cluster.log_end)])  # foreign, and first
    recorder.record([real.batch(cluster.log_end)])                        # the same (query, batch 1)
    with engine.connect() as conn:
        moved = {r[0]: r[1] for r in conn.execute(text('SELECT "partition", next_offset FROM v_positions'))}
        kinds = [r[0] for r in conn.execute(text("SELECT kind FROM findings"))]
    assert moved == {0: 9, 1: 9}
    assert kinds.count("foreign_run") == 1


def test_pruned_history_is_not_backfilled_again(tmp_path: Path, world: World) -> None:
    from sqlalchemy import text

    engine, cluster, recorder = world
    plan, job = _first_run(world, tmp_path, {0: 2, 1: 2})
    for end in (4, 6, 8):
        cluster.log_end = {0: end, 1: end}
        recorder.record([job.batch(cluster.log_end)])
    cluster.log_end = {0: 9, 1: 9}
    job.batch(cluster.log_end)  # committed, never delivered: the one reconciliation must add
    report = prune(engine, timedelta(seconds=1), execute=True, now=datetime.now(timezone.utc) + timedelta(days=1))
    assert report.batches.deleted == 3  # batches 0-2 go; 3 placed the positions
    plan2 = _restart(world, tmp_path, "2")
    [backfilled] = [f for f in plan2.findings if f.kind == "backfilled"]
    assert backfilled.details["batch_ids"] == [4]
    assert plan2.starting_offsets == {TOPIC: {"0": 9, "1": 9}}
    with engine.connect() as conn:
        assert [r[0] for r in conn.execute(text("SELECT batch_id FROM batches ORDER BY batch_id"))] == [3, 4]
