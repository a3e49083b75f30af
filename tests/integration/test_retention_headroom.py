"""Retention headroom on the real broker: a topic whose retention.ms is seconds long counts down from
OK to WARN while the records remain, and turns ERR (records lost, headroom 0) once the broker itself
deleted the segment past the pipeline's position; a compacted topic has no figure.

The devstack broker checks retention every second (``log.retention.check.interval.ms=1000``).
Set ``OFFSET_LEDGER_CAPTURE_DIR`` to keep the CLI's output (docs/operations.md quotes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import NewTopic
from sqlalchemy.engine import Engine

from offset_ledger.operate import operations_metrics, reads
from offset_ledger.api.metrics import render_metrics
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.model import TopicPartition
from tests.ops_seed import seed_pipeline

RETENTION_MS = 20_000
CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


def create_topic(kafka: Any, configs: dict[str, str]) -> str:  # type: ignore[no-untyped-def]
    topic = f"{kafka.name_hint}_{uuid.uuid4().hex[:4]}"
    kafka.admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, topic_configs=configs)])
    kafka.created.append(topic)
    kafka.wait_partitions(topic, 1)
    return topic


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def cli(ledger: Engine, bootstrap: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=ledger.url.render_as_string(hide_password=False),
               OFFSET_LEDGER_BOOTSTRAP_SERVERS=bootstrap, OFFSET_LEDGER_RETENTION_WARN="10s")
    r = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = os.environ.get("OFFSET_LEDGER_CAPTURE_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / "retention-headroom.txt", "a") as f:
            f.write(f"$ offset-ledger {' '.join(args)}\n{r.stdout}\n")
    return r.stdout


def test_headroom_counts_down_warns_then_turns_err_when_the_broker_deletes_the_position(
        ledger: Engine, kafka, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OFFSET_LEDGER_RETENTION_WARN", "10s")
    short = create_topic(kafka, {"retention.ms": str(RETENTION_MS), "segment.ms": "1000",
                                 "segment.bytes": "1048576", "cleanup.policy": "delete"})
    compacted = create_topic(kafka, {"cleanup.policy": "compact"})
    kafka.produce(short, [f"v{i}" for i in range(20)], partition=0)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    for i in range(10):
        producer.send(compacted, key=f"k{i}".encode(), value=b"x", partition=0)
    producer.flush()
    producer.close()
    pipeline = f"ret_{uuid.uuid4().hex[:6]}"
    seed_pipeline(ledger, pipeline, {short: {0: 5}, compacted: {0: 4}})
    ops = Operations(ledger, bootstrap_servers=kafka.bootstrap_servers)
    tp = TopicPartition(short, 0)

    def lag() -> dict[str, Any]:
        _group, parts = reads.lag(ops, pipeline)
        return {x.topic: x for x in parts}

    try:
        # Fresh records, retention 20 s: a figure below 20 s, above the 10 s threshold, from the time bound.
        first = lag()[short]
        assert ops.kafka.watermarks([short])[tp].log_start_offset == 0  # the broker still has offset 5
        assert first.headroom is not None and first.headroom.basis == "time"
        assert 10 < first.headroom.seconds < RETENTION_MS / 1000 and first.headroom.status == "OK"
        doc = first.to_dict()
        assert doc["headroomStatus"] == "OK" and doc["headroomBasis"] == "time" and 10 < doc["headroomSeconds"] < 20

        # The compacted topic deletes nothing by age or size: no figure, and no gauge.
        other = lag()[compacted]
        assert other.headroom is not None and other.headroom.basis == "compacted"
        assert other.headroom.seconds is None and other.headroom.status is None

        time.sleep(1.5)
        second = lag()[short]
        assert 0 < second.headroom.seconds < first.headroom.seconds  # counting down while data remains

        # Below the threshold while the broker still holds the position's record: WARN.
        warn = wait_until(lambda: (x := lag()[short]).headroom.status == "WARN" and x, 20, "WARN")
        # The headroom is a lower bound: the broker cannot have deleted the position's segment yet.
        assert ops.kafka.watermarks([short])[tp].log_start_offset == 0
        assert 0 <= warn.headroom.seconds < 10 and warn.headroom.basis == "time"
        summary = next(s for s in reads.list_pipelines(ops) if s.pipeline == pipeline)
        assert summary.to_dict()["headroomStatus"] == "WARN"
        metrics = render_metrics(operations_metrics.metrics(ops))
        assert "# TYPE offset_ledger_retention_headroom_seconds gauge" in metrics
        line = next(x for x in metrics.splitlines()
                    if x.startswith("offset_ledger_retention_headroom_seconds{") and f'topic="{short}"' in x)
        assert 0 <= float(line.rsplit(" ", 1)[1]) < 10
        assert not any(x.startswith("offset_ledger_retention_headroom_seconds{") and f'topic="{compacted}"' in x
                       for x in metrics.splitlines())
        table = cli(ledger, kafka.bootstrap_servers, "lag", pipeline)
        assert "WARN:" in table and "compacted" in table
        listed = json.loads(cli(ledger, kafka.bootstrap_servers, "lag", pipeline, "--format", "json"))
        doc = {x["topic"]: x for x in listed}
        assert doc[short]["headroomStatus"] == "WARN" and doc[short]["headroomBasis"] == "time"
        assert doc[compacted]["headroomSeconds"] is None and doc[compacted]["headroomBasis"] == "compacted"

        # The broker deletes the segment (the whole log here: its newest record aged past retention.ms).
        deleted = wait_until(lambda: (m := ops.kafka.watermarks([short])[tp]).log_start_offset > 5 and m,
                             RETENTION_MS / 1000 + 40, "the broker to delete the position's segment")
        lost = lag()[short]
        assert lost.log_start_offset == deleted.log_start_offset == 20  # what the broker reports
        assert lost.headroom is not None and lost.headroom.status == "ERR" and lost.headroom.seconds == 0
        assert lost.headroom.basis == "lost" and lost.headroom.lost_records == lost.log_start_offset - 5
        # The estimate never promised more time than the broker gave: it reached 0 no later than the deletion.
        assert lost.to_dict()["headroomSeconds"] == 0 and lost.to_dict()["headroomStatus"] == "ERR"
        summary = next(s for s in reads.list_pipelines(ops) if s.pipeline == pipeline)
        assert summary.headroom is not None and summary.headroom.status == "ERR"
        metrics = render_metrics(operations_metrics.metrics(ops))
        assert any(x.startswith("offset_ledger_retention_headroom_seconds{") and f'topic="{short}"' in x
                   and x.endswith(" 0") for x in metrics.splitlines())
        table = cli(ledger, kafka.bootstrap_servers, "lag", pipeline)
        assert "ERR:lost" in table
        listing = cli(ledger, kafka.bootstrap_servers, "pipelines")
        assert "ERR:lost" in listing
    finally:
        ops.close()


def test_default_retention_is_ok_and_a_caught_up_partition_has_nothing_at_risk(
        ledger: Engine, pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(20)])  # 10 per partition
    pipeline = f"ret_{uuid.uuid4().hex[:6]}"
    seed_pipeline(ledger, pipeline, {topic: {0: 4, 1: 10}})
    ops = Operations(ledger, bootstrap_servers=kafka.bootstrap_servers)
    try:
        _group, parts = reads.lag(ops, pipeline)
        behind, caught_up = parts
        week = 7 * 24 * 3600
        # The broker's default retention.ms (7 days), read from the cluster: just under a week left.
        assert behind.headroom.basis == "time" and week - 120 < behind.headroom.seconds <= week
        assert behind.headroom.status == "OK"
        assert caught_up.headroom.basis == "caught-up" and caught_up.headroom.seconds is None
        assert caught_up.headroom.status == "OK"
        metrics = render_metrics(operations_metrics.metrics(ops))
        assert any(x.startswith("offset_ledger_retention_headroom_seconds{") and 'partition="1"' in x
                   and f'topic="{topic}"' in x and x.endswith(" +Inf") for x in metrics.splitlines())
    finally:
        ops.close()

    # The REST resources carry the same fields; the legacy /v1 answer keeps its exact shape.
    import httpx

    from tests.integration.test_api import serving

    with serving(pg_dsn, kafka.bootstrap_servers) as srv, httpx.Client(base_url=srv.url) as c:
        (p,) = [x for x in c.get("/api/v1/pipelines").json()["pipelines"] if x["pipeline"] == pipeline]
        assert (p["headroomStatus"], p["headroomBasis"]) == ("OK", "time") and p["headroomSeconds"] > week - 120
        lag = c.get(f"/api/v1/pipelines/{pipeline}/lag").json()["partitions"]
        assert [(x["headroomStatus"], x["headroomBasis"]) for x in lag] == [("OK", "time"), ("OK", "caught-up")]
        assert lag[1]["headroomSeconds"] is None
        assert c.get(f"/v1/getCurrentOffsets/?pipelineName={pipeline}").json() == {topic: {"0": 4, "1": 10}}


def test_a_size_limited_topic_gets_the_size_bound_from_the_broker_s_log_size(
        ledger: Engine, kafka) -> None:  # type: ignore[no-untyped-def]
    from offset_ledger.kafka.retention_reads import topic_retention

    topic = create_topic(kafka, {"retention.ms": "-1", "retention.bytes": "10000000"})
    kafka.produce(topic, [f"value-{i:04d}" for i in range(20)], partition=0)
    pipeline = f"ret_{uuid.uuid4().hex[:6]}"
    seed_pipeline(ledger, pipeline, {topic: {0: 5}})
    ops = Operations(ledger, bootstrap_servers=kafka.bootstrap_servers)
    try:
        settings = topic_retention(ops.kafka, [topic])[topic]
        assert (settings.retention_ms, settings.retention_bytes, settings.cleanup_policy) == (-1, 10_000_000, "delete")
        assert settings.segment_bytes == 1048576  # the devstack broker's log.segment.bytes, as the topic applies it
        size = ops.kafka.log_sizes([topic])[TopicPartition(topic, 0)]
        assert 20 * len("value-0000") < size < 20_000  # 20 small records and their batch headers
        time.sleep(1.0)  # the record at the position has an age: the append rate is the unread span's
        _group, (x,) = reads.lag(ops, pipeline)
        # 15 unread records are far from 10 MB: a long way off, by size (retention.ms is -1).
        assert x.headroom.basis == "size" and x.headroom.status == "OK" and x.headroom.seconds > 3600
    finally:
        ops.close()
