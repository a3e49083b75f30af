"""Spark's real-time mode (``trigger(realTime=...)``, PySpark 4.1+) on the real stack, killed mid-batch and upgraded.

A real-time batch spans the trigger interval and emits its rows while it runs; its commit file is
written only at the end. A driver SIGKILLed inside a batch has therefore already written some of
that batch's records to the output topic, and a restart reads them again: that batch, and only
that one, is at-least-once (Kafka's sink is not transactional). The oracle is the output topic
(read with kafka-python) against what was produced, and Spark's own checkpoint files of the killed
query (the end of its last committed batch) against the upgrade's plan.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from sqlalchemy import create_engine, text

from tests.integration.test_adopt_replay import _cli
from tests.integration.test_restart import _values

DRIVER = Path(__file__).with_name("realtime_driver.py")


def _output(bootstrap: str, topic: str) -> list[str]:
    """Every record of the output topic (one partition), in order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        out: list[str] = []
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(r.value.decode() for r in records)
        return out
    finally:
        consumer.close()


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen, log: Path) -> Any:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the driver exited ({proc.returncode}) while waiting for {what}:\n"
                                 f"{log.read_text()[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n{log.read_text()[-4000:]}")


def _batches(dsn: str, pipeline: str) -> list[Any]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            if conn.execute(text("SELECT to_regclass('batches')")).scalar() is None:
                return []
            return list(conn.execute(text(
                "SELECT query_id, batch_id, input_rows, batch_time, recorded_at FROM batches "
                "WHERE pipeline = :p ORDER BY recorded_at"), {"p": pipeline}))
    finally:
        engine.dispose()


def _start(cfg: dict[str, Any], log: Path) -> tuple[subprocess.Popen, Any]:  # type: ignore[type-arg]
    """The driver in its own process group (so a SIGKILL takes its JVM too), its output in ``log``."""
    out = log.open("w")
    proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(cfg)], stdout=out, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    return proc, out


def _plan_line(log: Path) -> str | None:
    return next((x for x in log.read_text().splitlines() if x.startswith("PLAN ")), None)


def _spark_batches(checkpoint: Path, kind: str) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / kind).iterdir() if p.name.isdigit()) \
        if (checkpoint / kind).is_dir() else []


def _offsets_file(checkpoint: Path, batch: int, topic: str) -> dict[str, int]:
    lines = (checkpoint / "offsets" / str(batch)).read_text(encoding="utf-8").splitlines()
    return {k: int(v) for k, v in json.loads(lines[2])[topic].items()}


def _key(record: str) -> str:
    """``<partition>:<offset>`` of an output record (the input it came from)."""
    partition, offset, _ = record.split(":", 2)
    return f"{partition}:{offset}"


@pytest.mark.long
def test_a_realtime_query_killed_mid_batch_and_upgraded_rereads_only_the_open_batch(
        kafka, pg_dsn: str, stack, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    out_topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, _values("a", 100))
    cfg = {"pipeline": "rt", "topic": topic, "out_topic": out_topic, "bootstrap": kafka.bootstrap_servers,
           "dsn": pg_dsn, "checkpoint_root": str(tmp_path / "ck"), "jars": stack.spark_jars,
           "spool_dir": str(tmp_path / "spool"), "app_version": "1"}
    log = tmp_path / "driver-1.log"
    proc, out = _start(cfg, log)
    try:
        plan = _wait("the plan", lambda: _plan_line(log), 60, proc, log)
        checkpoint = Path(plan.split()[1])
        # Batch 0 takes the backlog; the listener records it when it ends (a real-time batch reports
        # at its end only). Then wait for Spark to commit a batch: the next one has just begun.
        _wait("batch 0 in the ledger", lambda: _batches(pg_dsn, "rt"), 120, proc, log)
        seen = _spark_batches(checkpoint, "commits")
        _wait("a new batch", lambda: _spark_batches(checkpoint, "commits") != seen, 30, proc, log)
        opened = _spark_batches(checkpoint, "commits")[-1] + 1
        kafka.produce(topic, _values("b", 40))
        # Emitted while the batch runs: the records are in the output long before the batch ends.
        _wait("the open batch's output", lambda: sum(v.split(":", 2)[2].startswith("b")
                                                     for v in _output(kafka.bootstrap_servers, out_topic)) == 40,
              20, proc, log)
        # Status and lag while the batch is open: running (its last event is one batch old), and the
        # open batch's 40 records count as lag although they are in the output already.
        pipelines = json.loads(_cli("pipelines", "--dsn", pg_dsn, "--no-lag", "--format", "json").stdout)
        lag = json.loads(_cli("lag", "rt", "--dsn", pg_dsn, "--bootstrap-servers", kafka.bootstrap_servers,
                              "--format", "json").stdout)
        still_open = _spark_batches(checkpoint, "commits")[-1] < opened
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
    assert still_open, "the batch ended before the kill (a slow machine): the test did not kill mid-batch"
    # While the batch was open: running, and its 40 records are lag (the ledger moves at batch ends).
    assert [p["state"] for p in pipelines] == ["running"], pipelines
    assert sum(row["lag"] for row in lag) == 40, lag
    before_kill = Counter(_key(v) for v in _output(kafka.bootstrap_servers, out_topic))
    assert set(before_kill.values()) == {1} and len(before_kill) == 140
    # Spark wrote no offsets/<n> for the open batch (a real-time batch's end is known at its end).
    assert _spark_batches(checkpoint, "offsets") == _spark_batches(checkpoint, "commits") == list(range(opened))
    spark_end = _offsets_file(checkpoint, opened - 1, topic)

    log2 = tmp_path / "driver-2.log"
    upgrade, out2 = _start({**cfg, "app_version": "2", "run_s": 180,
                             "until_ends": {str(p): e for p, e in kafka.end_offsets(topic).items()}}, log2)
    upgrade.wait(timeout=240)
    out2.close()
    assert upgrade.returncode == 0, log2.read_text()[-4000:]
    plan = _plan_line(log2)
    assert plan is not None and " fresh=True " in plan
    # The upgrade starts where Spark's last committed batch ended: only the killed batch is read again.
    assert json.loads(plan.split(" ", 3)[3]) == {topic: spark_end}
    after = Counter(_key(v) for v in _output(kafka.bootstrap_servers, out_topic))
    produced = {f"{p}:{o}" for p, end in kafka.end_offsets(topic).items() for o in range(end)}
    killed_batch = {f"{p}:{o}" for p, end in kafka.end_offsets(topic).items() for o in range(spark_end[str(p)], end)}
    assert set(after) == produced  # nothing missing
    assert {k for k, n in after.items() if n > 1} == killed_batch and len(killed_batch) == 40
    assert max(after.values()) == 2
    # The listener recorded the upgrade's batch: the positions are at the end of the topic.
    engine = create_engine(pg_dsn)
    with engine.connect() as conn:
        positions = dict(conn.execute(text('SELECT "partition", next_offset FROM v_positions')).all())
        kinds = sorted(conn.execute(text("SELECT DISTINCT kind FROM findings")).scalars())
    engine.dispose()
    assert positions == {0: 70, 1: 70}, positions
    # The killed query's empty batches (one per trigger while the topic was quiet), which the listener
    # hears as heartbeats, were recorded from its checkpoint by the restart without a finding.
    assert "backfilled" not in kinds, kinds
