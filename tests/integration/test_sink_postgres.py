"""The Postgres sink on the real stack: every input record lands in the target exactly once.

The oracle is the topic itself: every value produced is unique, and the target must hold each
exactly once after crashes at the two points that matter (between the executors' staging write and
the commit transaction; after the commit and before Spark's commit file), with restarts on the same
checkpoint and on a clean one (a new checkpoint generation: Spark's batch ids start again at 0).
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from offset_ledger import start_from_ledger
from offset_ledger.sinks import PostgresSink
from tests.integration.sink_helper import (
    create_target,
    jdbc_jar,
    run_driver,
    target_values,
)
from tests.integration.test_adopt_replay import _cli
from tests.integration.test_restart import _values


def _sink_rows(dsn: str) -> list[Any]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(
                "SELECT sequence, generation, batch_id, row_count, batch_input_rows FROM v_batch_outputs "
                "ORDER BY sequence")))
    finally:
        engine.dispose()


def _positions(dsn: str) -> dict[int, int]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(text('SELECT "partition", next_offset FROM v_positions')).all())
    finally:
        engine.dispose()


class _CrashAfterCommit(PostgresSink):
    """Raises after the sink committed its n-th batch: the batch fails, Spark writes no commit file."""

    def __init__(self, crash_at: int | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at, self.calls, self.verdicts = crash_at, 0, []

    def write(self, df, batch_id):  # type: ignore[no-untyped-def]
        self.calls += 1
        done = super().write(df, batch_id)
        self.verdicts.append((batch_id, done.verdict))
        if self.calls == self.crash_at:
            raise RuntimeError(f"crash after committing batch {batch_id}")
        return done


def _run(spark, kafka, topic: str, plan, sink) -> bool:  # type: ignore[no-untyped-def]
    """Run to the end of the topic (availableNow); False when the query failed."""
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
          .option("subscribe", topic).option("startingOffsets", plan.starting_offsets_json)
          .option("maxOffsetsPerTrigger", "10").load()
          .selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset"))
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", plan.checkpoint_location)
             .trigger(availableNow=True).start())
    from pyspark.errors import StreamingQueryException

    try:
        query.awaitTermination()
    except StreamingQueryException:  # the injected crash, as Spark reports it
        return False
    return query.exception() is None


def test_a_batch_rerun_after_its_commit_is_skipped_and_a_clean_checkpoint_starts_after_it(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    produced = _values("a", 60)
    kafka.produce(topic, produced)
    create_target(pg_dsn, "orders_out")
    root = str(tmp_path / "ck")

    def plan(version: str):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version=version, dsn=pg_dsn, first_run="earliest")

    def sink(p, crash_at: int | None) -> _CrashAfterCommit:  # type: ignore[no-untyped-def]
        return _CrashAfterCommit(crash_at, table="orders_out", checkpoint_location=p.checkpoint_location,
                                 pipeline="orders", dsn=pg_dsn)

    p1 = plan("1")
    first = sink(p1, 2)
    assert not _run(spark, kafka, topic, p1, first)
    assert first.verdicts == [(0, "commit"), (1, "commit")]
    # The same checkpoint: Spark re-runs batch 1 (offsets/1, no commits/1); the sink skips it.
    p2 = plan("1")
    assert not p2.fresh_checkpoint and p2.checkpoint_location == p1.checkpoint_location
    second = sink(p2, 3)
    assert not _run(spark, kafka, topic, p2, second)
    assert second.verdicts == [(1, "skip"), (2, "commit"), (3, "commit")]
    # An upgrade on a clean checkpoint right after a batch whose commit file Spark never wrote:
    # batch ids start at 0 again, and the plan starts where the sink's commit left the positions.
    kafka.produce(topic, _values("b", 20))
    produced += _values("b", 20)
    p3 = plan("2")
    assert p3.fresh_checkpoint
    assert sum(p3.starting_offsets[topic].values()) == 40  # four batches of 10 committed by the sink
    third = sink(p3, None)
    assert _run(spark, kafka, topic, p3, third)
    assert third.verdicts[0] == (0, "commit")
    # The oracle: every record of the topic exactly once.
    assert target_values(pg_dsn, "orders_out") == Counter(produced)
    rows = _sink_rows(pg_dsn)
    assert [r.sequence for r in rows] == list(range(1, len(rows) + 1))
    assert sum(r.row_count for r in rows) == 80
    assert [r.generation for r in rows] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert all(r.batch_input_rows == r.row_count for r in rows)
    assert sum(_positions(pg_dsn).values()) == 80
    # The audit names what each batch wrote: history (JSON and the table) and a replay of a batch.
    history = json.loads(_cli("history", "orders", "--dsn", pg_dsn, "--format", "json").stdout)
    newest = history["batches"][0]
    assert newest["outputs"] == [{"sink": "orders:orders_out", "kind": "postgres", "target": "orders_out",
                                  "sequence": 8, "rowCount": 10, "tableVersion": None}]
    table = _cli("history", "orders", "--dsn", pg_dsn, "--format", "csv").stdout
    assert "sink" in table.splitlines()[0] and "orders:orders_out" in table
    replay = _cli("replay", "orders", "--batch", "0", "--dsn", pg_dsn, "--format", "json")
    assert replay.returncode == 0, replay.stderr
    assert [o["sequence"] for o in json.loads(replay.stdout)["outputs"]] == [5]  # the current generation's batch 0
    assert "wrote 10 rows to orders_out (sequence 5)" in replay.stderr


def test_sigkill_between_staging_and_commit_and_after_commit_loses_and_duplicates_nothing(
        kafka, pg_dsn: str, stack, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    produced = _values("k", 60)
    kafka.produce(topic, produced)
    create_target(pg_dsn, "orders_out")
    cfg = {"pipeline": "orders", "topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn,
           "checkpoint_root": str(tmp_path / "ck"), "jars": stack.spark_jars, "table": "orders_out",
           "app_version": "1"}
    # 1. Killed after the sink committed its 2nd batch, before Spark's commit file.
    code, out = run_driver({**cfg, "kill_at": ["commit", 2]})
    assert code == -signal.SIGKILL and "KILL commit 1" in out, out[-3000:]
    # 2. An upgrade on a clean checkpoint; killed between staging its 2nd batch and committing it
    #    (staged by Spark's JDBC writer this time, the JVM path).
    code, out = run_driver({**cfg, "app_version": "2", "kill_at": ["stage", 2], "stage": "jdbc",
                            "jars": f"{stack.spark_jars},{jdbc_jar()}"})
    assert code == -signal.SIGKILL and "fresh=True" in out and "KILL stage" in out, out[-3000:]
    assert sum(target_values(pg_dsn, "orders_out").values()) == 30  # 20 + the new generation's first 10
    # 3. The same checkpoint again, to the end of the topic.
    code, out = run_driver({**cfg, "app_version": "2"})
    assert code == 0 and "fresh=False" in out, out[-3000:]
    assert target_values(pg_dsn, "orders_out") == Counter(produced)
    assert sum(_positions(pg_dsn).values()) == 60


@pytest.mark.long
def test_random_sigkills_across_twenty_batches_and_generations_keep_every_record_once(
        kafka, pg_dsn: str, stack, tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("SINK_CRASH_SEED", "24")))
    topic = kafka.create_topic(partitions=3)
    produced = _values("r", 60)
    kafka.produce(topic, produced)
    create_target(pg_dsn, "orders_out")
    cfg = {"pipeline": "orders", "topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn,
           "checkpoint_root": str(tmp_path / "ck"), "jars": stack.spark_jars, "table": "orders_out",
           "max_per_trigger": 10}
    version, kills = 1, []
    # Eight runs, each after 30 more records arrive (so every run has at least three batches to do):
    # six die at a random batch's staging or commit, two on a timer (mid-batch, or before the first
    # batch, or never when the run drained its records first); each is restarted on the same
    # checkpoint or, 40% of the time, on a clean one (an upgrade). Then one runs to the end.
    points = ["stage", "commit"] * 3 + ["timer"] * 2
    rng.shuffle(points)
    for n, point in enumerate(points):
        more = _values(f"r{n}-", 30)
        kafka.produce(topic, more)
        produced += more
        if rng.random() < 0.4:
            version += 1
        run_cfg = {**cfg, "app_version": str(version)}
        if point != "timer":
            run_cfg["kill_at"] = [point, rng.randint(1, 3)]
        code, out = run_driver(run_cfg, kill_after_s=rng.uniform(5, 25) if point == "timer" else None)
        kills.append((version, point, run_cfg.get("kill_at"), code))
        if point == "timer":
            assert code in (0, -signal.SIGKILL), out[-3000:]
        else:
            assert code == -signal.SIGKILL and f"KILL {point}" in out, (kills, out[-3000:])
    code, out = run_driver({**cfg, "app_version": str(version)})
    assert code == 0, out[-3000:]
    assert target_values(pg_dsn, "orders_out") == Counter(produced)
    rows = _sink_rows(pg_dsn)
    assert len(rows) >= 24 and [r.sequence for r in rows] == list(range(1, len(rows) + 1))
