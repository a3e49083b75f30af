"""The cost of a move on the real broker: a reset's dry run (CLI and API answer) states the records it
re-reads or skips, their time span and about how many bytes — checked against the records Kafka
itself returns for those offsets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP

from offset_ledger.ledger.engine import make_engine, upgrade
from tests.ops_seed import seed_pipeline

CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]
# Record times an hour ago: well inside the topic's retention (the devstack broker checks retention
# every second, and a segment of records older than retention.ms would be deleted under the test).
T0 = (int(time.time()) - 3600) * 1000
VALUE = b"x" * 200


def records(bootstrap: str, topic: str, partition: int, first: int, end: int) -> list:  # type: ignore[type-arg]
    """What Kafka returns for [first, end) of one partition: the oracle."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = KTP(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, first)
        got: list = []  # type: ignore[type-arg]
        deadline = time.monotonic() + 30  # the first polls may return nothing while the client connects
        while len(got) < end - first and time.monotonic() < deadline:
            got += [r for r in consumer.poll(timeout_ms=1000).get(tp, []) if r.offset < end]
        assert len(got) == end - first, f"Kafka returned {len(got)} of {topic}/{partition} [{first}, {end})"
        return got
    finally:
        consumer.close()


def iso_ms(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def test_a_reset_states_what_it_rereads_and_skips(pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all", linger_ms=20)
    for i in range(1000):  # partition 0: one record a second of producer time
        producer.send(topic, value=VALUE, partition=0, timestamp_ms=T0 + 1000 * i)
    for i in range(50):
        producer.send(topic, value=VALUE, partition=1, timestamp_ms=T0 + 60_000 * i)
    producer.flush()
    producer.close()
    kafka.delete_records(topic, {0: 10})  # log-start 10: what retention took is not the move's doing
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "costly", {topic: {0: 980, 1: 20}})
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=kafka.bootstrap_servers)

    # Back 75: partition 0 re-reads 905..979; partition 1 would go to -55, clamped to 0 (re-reads 0..19).
    r = subprocess.run([*CLI, "reset", "costly", "--shift-by", "-75", "--dry-run", "-f", "json"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cost = json.loads(r.stdout)["cost"]
    expected = {0: (905, 980), 1: (0, 20)}
    assert cost["complete"] is True and cost["skip"]["records"] == 0
    total_bytes = 0
    for part in cost["partitions"]:
        first, end = expected[part["partition"]]
        seen = records(kafka.bootstrap_servers, topic, part["partition"], first, end)
        assert part["direction"] == "reread" and part["records"] == len(seen) == end - first
        assert iso_ms(part["firstRecordTime"]) == seen[0].timestamp
        assert iso_ms(part["lastRecordTime"]) == seen[-1].timestamp
        assert part["spanSeconds"] == (seen[-1].timestamp - seen[0].timestamp) / 1000
        payload = sum(len(rec.value) for rec in seen)
        # The broker's log size spread over its records: the payload plus record and batch framing.
        assert payload <= part["approxBytes"] <= 1.8 * payload, (part["approxBytes"], payload)
        total_bytes += part["approxBytes"]
    assert cost["reread"]["records"] == 75 + 20 and cost["reread"]["approxBytes"] == total_bytes
    assert iso_ms(cost["reread"]["firstRecordTime"]) == T0  # partition 1's offset 0
    assert iso_ms(cost["reread"]["lastRecordTime"]) == T0 + 60_000 * 19  # partition 1's offset 19, the latest
    assert "cost: re-reads 95 records" in r.stderr and "skips 0 records" in r.stderr

    # To earliest: partition 0 re-reads 10..979 (log-start 10: what retention took is not the move's),
    # far more than one fetch returns; partition 1 0..19.
    r = subprocess.run([*CLI, "reset", "costly", "--to-earliest", "--dry-run", "-f", "json"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cost = json.loads(r.stdout)["cost"]
    assert cost["complete"] is True and cost["reread"]["records"] == 970 + 20
    far = next(p for p in cost["partitions"] if p["partition"] == 0)
    assert (iso_ms(far["firstRecordTime"]), iso_ms(far["lastRecordTime"])) == (T0 + 10_000, T0 + 979_000)

    # Ahead 15: skips 80..94 and 20..34; the table names the size and span per partition.
    r = subprocess.run([*CLI, "reset", "costly", "--shift-by", "15", "--dry-run", "-f", "csv"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    header, *rows = [line.split(",") for line in r.stdout.strip().splitlines()]
    by_partition = {int(row[header.index("partition")]): dict(zip(header, row)) for row in rows}
    assert by_partition[0]["recordsSkipped"] == by_partition[1]["recordsSkipped"] == "15"
    assert float(by_partition[0]["spanSeconds"]) == 14.0 and float(by_partition[1]["spanSeconds"]) == 14 * 60.0
    assert int(by_partition[0]["approxBytes"]) >= 15 * len(VALUE)
    assert "cost: re-reads 0 records; skips 30 records" in r.stderr
