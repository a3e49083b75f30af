"""Helpers of the Kafka sink's tests: keyed input, a read_committed oracle, the sink's group and the ledger."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import create_engine, text


def produce_keyed(bootstrap: str, topic: str, values: Iterable[str], partitions: int) -> int:
    """Each value to partition i % partitions, keyed ``k<i % 5>`` (the sink's output must keep the key)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    n = 0
    for n, value in enumerate(values, 1):
        producer.produce(topic, value=value.encode(), key=f"k{(n - 1) % 5}".encode(), partition=(n - 1) % partitions)
    producer.flush(30)
    return n


def read_topic(bootstrap: str, topic: str, *, committed_only: bool = True, timeout: float = 60) -> list[Any]:
    """Every record of ``topic`` a ``read_committed`` (or ``read_uncommitted``) consumer sees, to its end."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oracle-{time.monotonic_ns()}",
                         "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed_only else "read_uncommitted"})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
            positions = {tp.partition: tp.offset for tp in consumer.position([TopicPartition(topic, p) for p in parts])}
            if msg is None and all(positions[p] >= ends[p] or ends[p] == 0 for p in parts):
                return out
        raise TimeoutError(f"did not read {topic} to its end {ends} in {timeout} s")
    finally:
        consumer.close()


def group_positions(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets, as the AdminClient (kafka-consumer-groups' API) lists them."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=30)
    return {(tp.topic, tp.partition): tp.offset for tp in found.topic_partitions if tp.offset >= 0}


def ledger_positions(dsn: str, pipeline: str) -> dict[tuple[str, int], int]:
    engine = create_engine(dsn)
    try:
        # The ledger's own read, whatever layout its revision keeps positions in.
        from offset_ledger.ledger.queries import current_positions

        with engine.connect() as conn:
            return {(p.topic, p.partition): p.next_offset for p in current_positions(conn, pipeline)}
    finally:
        engine.dispose()


def sink_outputs(dsn: str, sink: str) -> list[Any]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(
                "SELECT sequence, generation, batch_id, row_count FROM v_batch_outputs WHERE sink = :s "
                "ORDER BY sequence"), {"s": sink}))
    finally:
        engine.dispose()
