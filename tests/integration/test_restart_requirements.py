"""A restart's requirements on real Postgres and Kafka: a reset that lands between the plan and the write.

The plan is read outside the pipeline lock (the cluster is slow); the write step takes the lock and
checks what the plan rests on (``rules.restart_requirements``). A real executed reset
(``ledger.reset_store.record_reset``, the path ``offset-ledger reset --execute`` takes) is made to
land while the restart asks the cluster: the first attempt's requirements fail and nothing is
written; the restart plans again and its generation consumes the reset. A reset landing on every
attempt ends in PlanConflict with nothing written.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from offset_ledger import start_from_ledger
from offset_ledger.errors import PlanConflict
from offset_ledger.ledger import position_store, reset_store
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.tables import checkpoint_generations, resets
from offset_ledger.operate import restart_plan
from offset_ledger.rules.resets import PartitionReset, ResetPlan


def _reset(dsn: str, topic: str, partition: int, target: int) -> int:
    """An executed reset of one partition, under the pipeline lock, exactly as an operator's."""
    engine = create_engine(dsn)

    def planner(positions: list[Any]) -> ResetPlan:
        now = {(p.topic, p.partition): p.next_offset for p in positions}
        return ResetPlan("offsets", "refuse", (PartitionReset(topic, partition, now.get((topic, partition)), target,
                                                              target, 0, 10**9),))

    try:
        _, stored = reset_store.record_reset(engine, planner, pipeline="orders", consumer_group="orders",
                                             actor="test", reason="between plan and write", dry_run=False,
                                             force=True)
    finally:
        engine.dispose()
    return int(stored.reset_id)


def _rows(dsn: str, table: Any) -> list[Any]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(table).order_by(table.c.id)))
    finally:
        engine.dispose()


def _pipeline_at(kafka: Any, dsn: str, root: Path) -> str:
    """A pipeline with generation 1 and a batch recorded on it: partitions 0 and 1 at 5."""
    topic = kafka.create_topic(2)
    kafka.produce(topic, [f"v{i}" for i in range(20)])
    start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=str(root),
                      dsn=dsn, app_version="1")
    engine = create_engine(dsn)
    try:
        with engine.begin() as conn:
            position_store.write(conn, "orders", "orders", {(topic, p): Placed(5, datetime.now(timezone.utc), "q", 0)
                                                            for p in (0, 1)}, keep_generation=True)
    finally:
        engine.dispose()
    return topic


def test_a_reset_between_plan_and_write_fails_the_requirements_and_the_next_plan_consumes_it(
    kafka, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    topic = _pipeline_at(kafka, pg_dsn, tmp_path)
    real_read_cluster = restart_plan.read_cluster
    landed: list[int] = []

    def read_cluster(adapter: Any, topics: Any, **kw: Any) -> Any:
        if not landed:  # the first plan has read the ledger; the reset commits before it takes the lock
            landed.append(_reset(pg_dsn, topic, 0, 2))
        return real_read_cluster(adapter, topics, **kw)

    monkeypatch.setattr(restart_plan, "read_cluster", read_cluster)
    with caplog.at_level(logging.INFO, logger="offset_ledger.operate.restart"):
        plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                                 checkpoint_root=str(tmp_path), dsn=pg_dsn, app_version="1")
    (rid,) = landed
    # The first attempt wrote nothing and said what moved; the second planned with the reset.
    (replanned,) = [r.getMessage() for r in caplog.records if "planning again" in r.getMessage()]
    assert f"pending resets [] -> [{rid}]" in replanned and "2 position row(s) moved" in replanned
    assert "(1/3)" in replanned
    assert plan.fresh_checkpoint and plan.generation == 2
    assert plan.starting_offsets == {topic: {"0": 2, "1": 5}}
    assert [(f.kind, f.details["reset_id"]) for f in plan.findings if f.kind == "reset_consumed"] == [
        ("reset_consumed", rid)]
    gens = _rows(pg_dsn, checkpoint_generations)
    assert [g.reason for g in gens] == ["first", "reset"]
    (reset_row,) = _rows(pg_dsn, resets)
    assert reset_row.status == "consumed" and reset_row.consumed_by_generation == gens[1].id


def test_a_reset_landing_on_every_attempt_ends_in_plan_conflict_and_writes_nothing(
    kafka, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = _pipeline_at(kafka, pg_dsn, tmp_path)
    real_read_cluster = restart_plan.read_cluster
    landed: list[int] = []

    def read_cluster(adapter: Any, topics: Any, **kw: Any) -> Any:
        landed.append(_reset(pg_dsn, topic, 0, 4 - len(landed)))  # another target each time: positions move
        return real_read_cluster(adapter, topics, **kw)

    monkeypatch.setattr(restart_plan, "read_cluster", read_cluster)
    before = _rows(pg_dsn, checkpoint_generations)
    with pytest.raises(PlanConflict) as caught:
        start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                          checkpoint_root=str(tmp_path), dsn=pg_dsn, app_version="1")
    assert len(landed) == 3 and caught.value.retriable
    assert caught.value.details["attempts"] == 3
    # The last attempt planned with the first two resets and saw the third land.
    assert caught.value.details["changed"] == [f"pending resets {landed[:2]} -> {landed}",
                                               "2 position row(s) moved (a batch or a reset committed)"]
    assert _rows(pg_dsn, checkpoint_generations) == before  # nothing written
    assert [r.status for r in _rows(pg_dsn, resets)] == ["pending"] * 3
