"""A reset asks the cluster before it takes the pipeline lock (real Postgres and Kafka).

The lock holds the pipeline's recorder and restarts while it is held, and a slow or unreachable
cluster answers in tens of seconds: the reset's Kafka reads must happen outside it. Each of the
adapter's reads is wrapped to try the pipeline's lock from another connection at that moment; the
plan under the lock is still made from the positions as they are then (a batch recorded between the
read and the lock is what the audit's "before" shows).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.locks import pipeline_lock_key
from offset_ledger.ledger.queries import current_positions
from offset_ledger.operate import reset_operations
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.resets import ResetRequest
from tests.ops_seed import seed_pipeline


def _lock_is_free(engine: Any, pipeline: str) -> bool:
    with engine.connect() as conn:
        free = conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"),
                            {"k": pipeline_lock_key(pipeline, pipeline)}).scalar_one()
        conn.rollback()
    return bool(free)


@pytest.mark.parametrize("request_", [ResetRequest("latest"), ResetRequest("timestamp", timestamp_ms=0),
                                      ResetRequest("shift", shift_by=-3)], ids=["latest", "timestamp", "shift"])
def test_the_cluster_is_read_outside_the_pipeline_lock_and_the_plan_from_the_locked_positions(
        pg_dsn: str, kafka, request_: ResetRequest) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(40)])  # 20 a partition
    engine = make_engine(pg_dsn)
    probe = make_engine(pg_dsn)
    try:
        upgrade(engine)
        seed_pipeline(engine, "etl", {topic: {0: 12, 1: 15}})
        ops = Operations(engine, bootstrap_servers=kafka.bootstrap_servers)
        reads: list[tuple[str, bool]] = []
        real_snapshot, real_times = ops.kafka.snapshot, ops.kafka.offsets_for_time

        def snapshot(topics):  # type: ignore[no-untyped-def]
            reads.append(("snapshot", _lock_is_free(probe, "etl")))
            if len(reads) == 1:
                # The pipeline moves between this read and the lock: partition 1 records on to 18.
                seed_pipeline(engine, "etl", {topic: {1: 18}}, n_batches=1)
            return real_snapshot(topics)

        def offsets_for_time(tps, ts):  # type: ignore[no-untyped-def]
            reads.append(("offsets_for_time", _lock_is_free(probe, "etl")))
            return real_times(tps, ts)

        ops.kafka.snapshot = snapshot  # type: ignore[method-assign]
        ops.kafka.offsets_for_time = offsets_for_time  # type: ignore[method-assign]
        outcome = reset_operations.reset(ops, "etl", request_, actor="oncall", reason="replay", dry_run=False,
                                         force=True)
        assert reads and all(free for _, free in reads), reads
        before = {(p.topic, p.partition): p.before_next_offset for p in outcome.plan.partitions}
        assert before == {(topic, 0): 12, (topic, 1): 18}  # the positions under the lock, not before it
        with engine.connect() as conn:
            now = {(p.topic, p.partition): p.next_offset for p in current_positions(conn, "etl")}
        assert now == {tp: p.target_next_offset for p in outcome.plan.partitions
                       for tp in [(p.topic, p.partition)]}
    finally:
        probe.dispose()
        engine.dispose()
