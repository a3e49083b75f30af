"""Test helper over kafka-python: unique topics, producing records, watermarks."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import UnknownTopicOrPartitionError


class KafkaHelper:
    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, request_timeout_ms=30000)
        self.producer = self._producer()
        self.created: list[str] = []
        self.name_hint = "t"

    def _producer(self) -> KafkaProducer:
        # A short metadata age: partitions added to a topic show up within half a second.
        return KafkaProducer(bootstrap_servers=self.bootstrap_servers, linger_ms=5, acks="all",
                             metadata_max_age_ms=500)

    def create_topic(self, partitions: int = 3, name: str | None = None) -> str:
        """Create a unique topic and wait until every partition has a leader."""
        topic = name or f"{self.name_hint}_{uuid.uuid4().hex[:6]}"
        self.admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        self.created.append(topic)
        self.wait_partitions(topic, partitions)
        return topic

    def wait_partitions(self, topic: str, partitions: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.producer.partitions_for(topic) or set()
            if len(found) >= partitions:
                return
            time.sleep(0.1)
        raise TimeoutError(f"topic {topic} did not get {partitions} partitions")

    def add_partitions(self, topic: str, total: int) -> None:
        self.admin.create_partitions({topic: NewPartitions(total_count=total)})
        self.wait_partitions(topic, total)

    def produce(self, topic: str, values: Iterable[str], partition: int | None = None) -> int:
        """Send values (round-robin over partitions unless one is given); returns the count."""
        n = 0
        parts = sorted(self.producer.partitions_for(topic) or [0])
        for value in values:
            p = partition if partition is not None else parts[n % len(parts)]
            self.producer.send(topic, value=value.encode(), partition=p)
            n += 1
        self.producer.flush()
        return n

    def end_offsets(self, topic: str) -> dict[int, int]:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers)
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
            return {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
        finally:
            consumer.close()

    def delete_records(self, topic: str, before: dict[int, int]) -> None:
        """Advance log-start offsets as retention would (records below ``before[p]`` are gone)."""
        self.admin.delete_records({TopicPartition(topic, p): o for p, o in before.items()})

    def delete_topics(self, topics: list[str]) -> None:
        if not topics:
            return
        try:
            self.admin.delete_topics(topics)
        except UnknownTopicOrPartitionError:
            pass
        # A producer keeps refreshing metadata for every topic it ever sent to; once they are gone its
        # network thread spins on a full core for the rest of the run. A fresh one knows no topic.
        self.producer.close()
        self.producer = self._producer()

    def recreate_topic(self, topic: str, partitions: int) -> None:
        self.admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while topic in self.admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        while True:
            try:
                self.admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
                break
            except Exception:  # noqa: BLE001 - TopicAlreadyExists while deletion completes
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.wait_partitions(topic, partitions)

    def close(self) -> None:
        self.producer.close()
        self.admin.close()
