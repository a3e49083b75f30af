"""The Kafka adapter against the real broker."""

from __future__ import annotations

import time

import pytest

from offset_ledger.errors import KafkaUnavailable, UnknownTopic
from offset_ledger.kafka import KafkaAdapter
from offset_ledger.model import TopicPartition, Watermarks

pytestmark = pytest.mark.kafka_broker  # also run against every broker of scripts/test --matrix


def test_partitions_watermarks_and_offsets_for_time(kafka) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"a{i}" for i in range(10)], partition=0)
    midpoint_ms = int(time.time() * 1000)
    time.sleep(0.05)
    kafka.produce(topic, [f"b{i}" for i in range(4)], partition=0)
    kafka.delete_records(topic, {0: 3})

    with KafkaAdapter(kafka.bootstrap_servers) as adapter:
        assert adapter.partitions([topic, "no_such_topic_xyz"]) == {topic: [0, 1]}
        assert adapter.watermarks([topic]) == {
            TopicPartition(topic, 0): Watermarks(log_start_offset=3, log_end_offset=14),
            TopicPartition(topic, 1): Watermarks(log_start_offset=0, log_end_offset=0),
        }
        found = adapter.offsets_for_time([TopicPartition(topic, 0), TopicPartition(topic, 1)], midpoint_ms)
        assert found == {TopicPartition(topic, 0): 10, TopicPartition(topic, 1): None}
        assert adapter.topics_matching(topic[:-6] + ".*") == [topic]
        with pytest.raises(UnknownTopic):
            adapter.require_topics([topic, "no_such_topic_xyz"])


def test_unreachable_brokers_are_reported_as_unavailable() -> None:
    with KafkaAdapter("127.0.0.1:1", request_timeout_ms=2000) as adapter:
        with pytest.raises(KafkaUnavailable, match="127.0.0.1:1"):
            adapter.partitions(["t"])
