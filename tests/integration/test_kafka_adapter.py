"""The Kafka adapter against the real broker."""

from __future__ import annotations

import time

import pytest

from offset_ledger.errors import KafkaUnavailable
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.rules.model import TopicPartition, Watermarks

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


def test_unreachable_brokers_are_reported_as_unavailable() -> None:
    with KafkaAdapter("127.0.0.1:1", request_timeout_ms=2000) as adapter:
        with pytest.raises(KafkaUnavailable, match="127.0.0.1:1"):
            adapter.partitions(["t"])


def test_snapshot_matches_what_the_consumer_and_admin_report(kafka) -> None:
    """Oracle: kafka-python's own consumer (beginning/end offsets) and admin client (topic ids)."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    trimmed = kafka.create_topic(partitions=3)
    kafka.produce(trimmed, [f"r{i}" for i in range(40)])
    kafka.delete_records(trimmed, {0: 5, 2: 1})
    grown = kafka.create_topic(partitions=2)
    kafka.produce(grown, [f"g{i}" for i in range(7)])
    kafka.add_partitions(grown, 5)
    kafka.produce(grown, [f"h{i}" for i in range(11)])
    empty = kafka.create_topic(partitions=1)

    with KafkaAdapter(kafka.bootstrap_servers) as adapter:
        seen = adapter.snapshot([trimmed, grown, empty, "no_such_topic_xyz"])

    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers)
    try:
        expected = {}
        for topic in (trimmed, grown, empty):
            tps = [KTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
            starts, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            expected.update({TopicPartition(topic, tp.partition): Watermarks(starts[tp], ends[tp]) for tp in tps})
    finally:
        consumer.close()
    described = {d["name"]: str(d["topic_id"]) for d in kafka.admin.describe_topics([trimmed, grown, empty])}

    assert seen.watermarks == expected
    assert seen.partitions == {trimmed: [0, 1, 2], grown: [0, 1, 2, 3, 4], empty: [0]}
    assert seen.topic_ids == described
    assert seen.watermarks[TopicPartition(trimmed, 0)].log_start_offset == 5  # the oracle is not trivially 0


def test_record_timestamps_by_fetch_match_the_consumers(kafka) -> None:
    """Oracle: kafka-python's consumer decoding every record (the path record_timestamps took before).

    Several batches per partition (plain, gzip, explicit timestamps), a partition trimmed by
    retention (wanted offsets below its log-start: the fetch is refused and the consumer answers),
    offsets at and past the log-end (no record: absent either way)."""
    from kafka import KafkaProducer

    from offset_ledger.kafka.record_times import record_times_by_fetch

    topic = kafka.create_topic(partitions=3)
    base = int(time.time() * 1000) - 3_600_000
    for codec in (None, "gzip"):
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, compression_type=codec, linger_ms=50)
        for i in range(60):
            producer.send(topic, value=b"x" * (i % 7) * 40, partition=i % 3, timestamp_ms=base + 1000 * i)
        producer.flush()
        producer.close()
    kafka.delete_records(topic, {2: 15})
    wanted = [(TopicPartition(topic, p), o) for p in range(3) for o in (0, 3, 7, 19, 20, 21, 39, 40, 41, 500)]

    with KafkaAdapter(kafka.bootstrap_servers) as adapter:
        fast = adapter.record_timestamps(wanted)
        expected = adapter._record_timestamps_by_consumer(wanted, timeout_ms=3000, rounds=4)
        with adapter._lock:
            direct, left = record_times_by_fetch(adapter._client()._manager, {
                (tp.topic, tp.partition): sorted(o for t, o in wanted if t == tp) for tp, _ in wanted})

    assert fast == expected
    # Each partition holds offsets 0-39 (20 plain records, then 20 gzip ones); 40 and past: absent.
    assert len(expected) == 3 * 7
    tp = {p: TopicPartition(topic, p) for p in range(3)}
    assert expected[(tp[1], 7)] == base + 1000 * (3 * 7 + 1)
    assert expected[(tp[0], 21)] == base + 1000 * (3 * 1 + 0)  # in a gzip batch
    assert expected[(tp[2], 3)] == base + 1000 * (3 * 15 + 2)  # below the log-start: its first record
    # The fetch itself answered partitions 0 and 1; partition 2's offsets below its log-start were
    # refused (OFFSET_OUT_OF_RANGE) and left to the consumer.
    assert {k: v for k, v in direct.items() if k[0].partition < 2} == \
        {k: v for k, v in expected.items() if k[0].partition < 2}
    assert (topic, 2) in left and not any(p < 2 for _, p in left)
