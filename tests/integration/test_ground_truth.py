"""The ledger is never behind what Spark committed (issue 20), on real Spark, Kafka and Postgres.

Each test is an oracle test: the records every run processed, added up, must be every produced
record exactly once (or, for windows, the output of one uninterrupted query).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text

from offset_ledger.operate import reset_operations
from offset_ledger import OffsetLedgerListener
from offset_ledger.errors import StatefulRestartRefused
from offset_ledger.ledger.tables import batch_offsets, batches, positions, resets
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.resets import ResetRequest
from tests.integration.test_authority import _recorded_run
from tests.integration.test_restart import _rows, _run, _start, _values


def _sql(dsn: str, query: str) -> list[Any]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(query))]
    finally:
        engine.dispose()


def test_batches_the_listener_never_delivered_are_not_read_again(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 20))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    seen1, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path)
    # The same job runs on: two more batches, and the listener is not there (a dropped bus event,
    # a killed driver, a deploy without it). Only Spark's checkpoint knows.
    kafka.produce(topic, _values("b", 20))
    seen2, end2 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json, plan1.checkpoint_location,
                       max_offsets_per_trigger=10)
    kafka.produce(topic, _values("c", 20))
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert plan2.fresh_checkpoint
    assert plan2.starting_offsets == {topic: {p: o for p, o in end2[topic].items()}}  # type: ignore[index]
    backfilled = [f for f in plan2.findings if f.kind == "backfilled"]
    assert len(backfilled) == 1 and len(backfilled[0].details["batch_ids"]) == 2
    seen3, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path)
    assert seen1 + seen2 + seen3 == Counter(_values("a", 20) + _values("b", 20) + _values("c", 20))
    # History holds every batch of the first query once, the two read back from its commit log marked so.
    rows = _sql(pg_dsn, "SELECT batch_id, source FROM batches ORDER BY batch_time, batch_id")
    assert [s for _, s in rows].count("checkpoint") == 2
    # A third restart of the same version reconciles nothing again and resumes.
    plan3 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert not plan3.fresh_checkpoint and not [f for f in plan3.findings if f.kind == "backfilled"]


def test_a_reset_landing_while_a_restart_plans_is_applied_exactly_once(
        spark, kafka, pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import offset_ledger.operate.restart_plan as restart_module
    from offset_ledger.kafka.adapter import KafkaAdapter
    from offset_ledger.ledger.engine import make_engine

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    seen1, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path)
    assert seen1 == Counter(_values("a", 40))

    real_read_cluster = restart_module.read_cluster
    landed = threading.Event()

    def read_cluster_while_a_reset_lands(*args: Any, **kwargs: Any) -> Any:
        if not landed.is_set():
            landed.set()
            engine = make_engine(pg_dsn)
            try:
                with KafkaAdapter(kafka.bootstrap_servers) as adapter:
                    reset_operations.reset(Operations(engine, kafka=adapter), "orders", ResetRequest("earliest"), actor="oncall",
                                                            reason="replay everything", dry_run=False, force=True)
            finally:
                engine.dispose()
        return real_read_cluster(*args, **kwargs)

    monkeypatch.setattr(restart_module, "read_cluster", read_cluster_while_a_reset_lands)
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    monkeypatch.undo()
    assert landed.is_set()
    assert plan2.fresh_checkpoint and plan2.starting_offsets == {topic: {"0": 0, "1": 0}}
    consumed = [f for f in plan2.findings if f.kind == "reset_consumed"]
    assert len(consumed) == 1
    seen2, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path)
    assert seen2 == Counter(_values("a", 40))  # the reset's replay, once
    # The audit says which generation applied it; a later restart applies nothing again.
    [reset] = _rows(pg_dsn, resets)
    assert reset.status == "consumed" and reset.consumed_by_generation is not None
    kafka.produce(topic, _values("b", 6))
    plan3 = _start(kafka, pg_dsn, topic, tmp_path, app_version="3")
    assert not [f for f in plan3.findings if f.kind == "reset_consumed"]
    seen3, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan3, tmp_path)
    assert seen3 == Counter(_values("b", 6))


def test_the_group_only_the_listener_names_takes_over_the_helpers_default(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 30))
    # start_from_ledger is never given the group, the first start included; the listener is.
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    assert plan1.consumer_group == "orders"
    seen1, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path, group="orders-etl")
    kafka.produce(topic, _values("b", 10))
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert plan2.consumer_group == "orders-etl" and plan2.fresh_checkpoint
    seen2, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path, group="orders-etl")
    assert seen1 + seen2 == Counter(_values("a", 30) + _values("b", 10))
    assert {r.consumer_group for r in _rows(pg_dsn, positions)} == {"orders-etl"}
    assert [r for r in _sql(pg_dsn, "SELECT kind FROM findings WHERE kind = 'group_adopted'")] == [("group_adopted",)]


def test_watch_records_what_the_listener_records(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    from offset_ledger.cli.main import main

    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("a", 90))
    plan = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _recorded_run(spark, kafka, pg_dsn, topic, plan, tmp_path, max_per_trigger=20)
    watched = f"sqlite:///{tmp_path / 'watched.db'}"
    main(["watch", "orders", plan.checkpoint_location or "", "--once", "--dsn", watched])

    def history(dsn: str) -> list[tuple[Any, ...]]:
        return sorted(_sql(dsn, 'SELECT batch_id, topic, "partition", from_offset, until_offset FROM v_batch_offsets'))

    listener_rows, watched_rows = history(pg_dsn), history(watched)
    assert len(listener_rows) >= 5 * 3 and watched_rows == listener_rows
    assert sorted(_sql(watched, 'SELECT topic, "partition", next_offset FROM v_positions')) == \
        sorted(_sql(pg_dsn, 'SELECT topic, "partition", next_offset FROM v_positions'))
    # The listener and a watcher on one ledger: each batch once, and no finding about it.
    found_before = _sql(pg_dsn, "SELECT kind, message FROM findings ORDER BY id")
    main(["watch", plan.checkpoint_location or "", "--pipeline", "orders", "--once", "--dsn", pg_dsn])
    assert history(pg_dsn) == listener_rows
    assert _sql(pg_dsn, "SELECT kind, message FROM findings ORDER BY id") == found_before


def test_watch_alone_records_a_job_without_the_listener_and_the_upgrade_resumes_after_it(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    from offset_ledger.capture.reconcile import watch
    from offset_ledger.ledger.engine import make_engine

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 50))
    plan1 = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    engine = make_engine(pg_dsn)
    stop = threading.Event()
    passes: list[Any] = []
    watcher = threading.Thread(target=watch, args=(engine, plan1.checkpoint_location),
                               kwargs={"pipeline": "orders", "consumer_group": "orders", "interval_s": 0.2,
                                       "stop": stop, "on_pass": passes.append}, daemon=True)
    watcher.start()
    try:
        seen1, end1 = _run(spark, kafka.bootstrap_servers, topic, plan1.starting_offsets_json,
                           plan1.checkpoint_location, max_offsets_per_trigger=20)
        deadline = datetime.now(timezone.utc) + timedelta(seconds=30)
        while datetime.now(timezone.utc) < deadline:
            got = {(r.topic, r.partition): r.next_offset for r in _rows(pg_dsn, positions)}
            if got == {(topic, int(p)): o for p, o in end1[topic].items()}:  # type: ignore[index]
                break
            threading.Event().wait(0.2)
    finally:
        stop.set()
        watcher.join(30)
        engine.dispose()
    assert not watcher.is_alive() and passes
    assert {r.source for r in _rows(pg_dsn, batches)} == {"checkpoint"}
    kafka.produce(topic, _values("b", 10))
    plan2 = _start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    seen2, _ = _run(spark, kafka.bootstrap_servers, topic, plan2.starting_offsets_json, plan2.checkpoint_location)
    assert seen1 + seen2 == Counter(_values("a", 50) + _values("b", 10))
    assert not [f for f in plan2.findings if f.kind == "backfilled"]  # the watcher had it all


# -- stateful: prune and the second restart ------------------------------------------------------


def _stateful_start(kafka, pg_dsn: str, topic: str, tmp_path: Path, **kw: Any):  # type: ignore[no-untyped-def]
    from offset_ledger import start_from_ledger

    return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "ckpt"), dsn=pg_dsn, **kw)


def _listener(pg_dsn: str, tmp_path: Path) -> OffsetLedgerListener:
    return OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", spool_dir=tmp_path / "spool")


def test_prune_keeps_what_a_stateful_restart_needs(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    from offset_ledger.kafka.adapter import KafkaAdapter
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.ledger.prune import prune
    from offset_ledger.operate.restart_plan import plan_restart
    from offset_ledger.rules.policies import Policies
    from offset_ledger.rules.restart_options import GroupRef, RestartOptions
    from offset_ledger.rules.stateful import WindowSpec
    from tests.integration.test_stateful import DELAY, FLUSH, _records
    from tests.integration.test_stateful import _run as _srun

    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _records(0, 90))
    plan1 = _stateful_start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _srun(spark, kafka, topic, plan1.starting_offsets_json, plan1.checkpoint_location or "", tmp_path / "v1",
          window="10 seconds", slide=None, listener=_listener(pg_dsn, tmp_path))
    kafka.produce(topic, _records(90, 150))
    kafka.produce(topic, [FLUSH], partition=0)

    engine = make_engine(pg_dsn)
    try:
        def rewind_plan() -> Any:
            with KafkaAdapter(kafka.bootstrap_servers) as adapter:
                plan, _, _ = plan_restart(Operations(engine, kafka=adapter), GroupRef("orders", "orders", named=False),
                                          RestartOptions(topics=(topic,)), Policies(),
                                          WindowSpec.parse("10 seconds", watermark_delay=DELAY))
            return plan

        before = rewind_plan()
        # Everything is "old" to this prune: only what the ledger promises to keep stays.
        report = prune(engine, timedelta(seconds=1), execute=True, now=datetime.now(timezone.utc) + timedelta(days=1))
        assert report.protected_queries and report.batches.deleted == 0
        after = rewind_plan()
        assert after.starting_offsets == before.starting_offsets
        assert after.event_time_floor == before.event_time_floor

        # History a prune of an earlier version took is a loud refusal, never a later start.
        with engine.begin() as conn:
            first = conn.execute(select(batches.c.query_id, batches.c.batch_id)
                                 .order_by(batches.c.batch_id).limit(1)).one()
            conn.execute(batch_offsets.delete().where(batch_offsets.c.batch_id == first.batch_id))
            conn.execute(batches.delete().where(batches.c.batch_id == first.batch_id))
        with pytest.raises(StatefulRestartRefused, match="not in the ledger"):
            rewind_plan()
    finally:
        engine.dispose()


def test_a_second_stateful_restart_after_a_crash_matches_the_uninterrupted_run(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from tests.integration.test_stateful import DELAY, FLUSH, _expected, _output, _records
    from tests.integration.test_stateful import _run as _srun

    topic = kafka.create_topic(partitions=3)
    phase1, phase2 = _records(0, 90), _records(90, 150)
    kafka.produce(topic, phase1)
    plan1 = _stateful_start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _srun(spark, kafka, topic, plan1.starting_offsets_json, plan1.checkpoint_location or "", tmp_path / "v1",
          window="10 seconds", slide=None, listener=_listener(pg_dsn, tmp_path))
    plan2 = _stateful_start(kafka, pg_dsn, topic, tmp_path, app_version="2", window="10 seconds",
                            watermark_delay=DELAY)
    assert plan2.event_time_floor is not None

    # Version 2 commits one small batch and its driver dies on the next one.
    listener = _listener(pg_dsn, tmp_path)
    spark.streams.addListener(listener)
    out2 = tmp_path / "v2"

    def sink(df: Any, batch_id: int) -> None:
        if batch_id >= 1:
            raise RuntimeError("driver lost")
        df.write.mode("append").parquet(str(out2))

    parts = F.split(F.col("value").cast("string"), r"\|")
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
           .option("subscribe", topic).option("startingOffsets", plan2.starting_offsets_json)
           .option("maxOffsetsPerTrigger", "3").load())
    events = raw.select(parts[0].alias("id"), (parts[1].cast("long") / 1000).cast("timestamp").alias("event_time"))
    counts = (events.where(F.col("event_time") >= F.lit(plan2.event_time_floor))
              .withWatermark("event_time", DELAY).groupBy(F.window("event_time", "10 seconds").alias("w")).count()
              .select(F.col("w.start").cast("long").alias("start_s"), F.col("count")))
    query = (counts.writeStream.foreachBatch(sink).option("checkpointLocation", plan2.checkpoint_location)
             .outputMode("append").trigger(availableNow=True).start())
    try:
        with pytest.raises(Exception, match="driver lost"):  # it crashes on batch 1, after committing batch 0
            query.awaitTermination(180)
    finally:
        query.stop()
        assert listener.flush(60), listener.health()
        spark.streams.removeListener(listener)
        listener.close()

    kafka.produce(topic, phase2)
    kafka.produce(topic, [FLUSH], partition=0)
    # Reusing generation 2 without window= keeps the floor.
    again = _stateful_start(kafka, pg_dsn, topic, tmp_path, app_version="2")
    assert not again.fresh_checkpoint and again.event_time_floor == plan2.event_time_floor
    # The second stateful restart: the same call as before.
    plan3 = _stateful_start(kafka, pg_dsn, topic, tmp_path, app_version="3", window="10 seconds")
    assert plan3.event_time_floor is not None and plan3.event_time_floor >= plan2.event_time_floor
    _srun(spark, kafka, topic, plan3.starting_offsets_json, plan3.checkpoint_location or "", tmp_path / "v3",
          window="10 seconds", slide=None, floor=plan3.event_time_floor, listener=_listener(pg_dsn, tmp_path))

    _srun(spark, kafka, topic, "earliest", str(tmp_path / "oracle-ckpt"), tmp_path / "oracle",
          window="10 seconds", slide=None)
    oracle = _output(spark, tmp_path / "oracle")
    assert oracle == Counter(_expected(phase1 + phase2, 10, 10).items())
    upgraded = _output(spark, tmp_path / "v1") + _output(spark, out2) + _output(spark, tmp_path / "v3")
    assert upgraded == oracle, (sorted(upgraded - oracle), sorted(oracle - upgraded))
