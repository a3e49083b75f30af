"""The one-look cluster snapshot's bookkeeping: absent topics, retries, refusals (a scripted broker)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

import pytest

from offset_ledger.kafka.snapshot import EARLIEST, SnapshotError, snapshot
from offset_ledger.rules.model import TopicPartition, Watermarks

TOPIC_ID = "6f1d7a4e-0c5b-4a57-9d0e-2a1f3c4b5d6e"


class ScriptedBroker:
    """Answers Metadata and ListOffsets from a dict of partitions; ``errors`` scripts failures per call."""

    def __init__(self, logs: dict[str, dict[int, tuple[int, int]]], *, leader: int = 1) -> None:
        self.logs = logs
        self.leader = leader
        self.metadata_errors: list[dict[str, int]] = []   # per metadata call: topic -> error code
        self.offset_errors: list[dict[tuple[str, int], int]] = []  # per ListOffsets call
        self.requests: list[tuple[str, object]] = []
        self.cluster = NS(brokers=lambda: [NS(node_id=1)], update_metadata=lambda response: None)

    def run(self, fn, *args):
        return asyncio.run(fn(*args))

    async def _answer(self, request):
        return request

    def send(self, request, node_id=None):
        if hasattr(request, "allow_auto_topic_creation"):
            self.requests.append(("metadata", None))
            errors = self.metadata_errors.pop(0) if self.metadata_errors else {}
            topics = []
            for t in request.topics:
                name = t.name
                if name not in self.logs:
                    topics.append(NS(name=name, error_code=3, topic_id=None, partitions=[]))
                    continue
                topics.append(NS(name=name, error_code=errors.get(name, 0), topic_id=TOPIC_ID, partitions=[
                    NS(partition_index=p, error_code=0, leader_id=self.leader) for p in self.logs[name]]))
            return self._answer(NS(brokers=[NS(node_id=1)], topics=topics))
        self.requests.append(("list_offsets", node_id))
        errors = self.offset_errors.pop(0) if self.offset_errors else {}
        topics = []
        for name, parts in request.topics:
            answered = []
            for p, _epoch, kind in parts:
                start, end = self.logs[name][p]
                answered.append(NS(partition_index=p, error_code=errors.get((name, p), 0),
                                   offset=start if kind == EARLIEST else end))
            topics.append(NS(name=name, partitions=answered))
        return self._answer(NS(topics=topics))


def test_every_partition_of_existing_topics_and_nothing_for_absent_ones() -> None:
    broker = ScriptedBroker({"a": {0: (3, 14), 1: (0, 0)}, "b": {0: (5, 9)}})
    seen = snapshot(broker, ["a", "b", "gone", "a"], timeout_ms=1000)
    assert seen.partitions == {"a": [0, 1], "b": [0]}
    assert seen.topic_ids == {"a": TOPIC_ID, "b": TOPIC_ID}
    assert seen.watermarks == {TopicPartition("a", 0): Watermarks(3, 14), TopicPartition("a", 1): Watermarks(0, 0),
                               TopicPartition("b", 0): Watermarks(5, 9)}
    # one metadata request, then earliest and latest for the one leader, both sent before any reply
    assert broker.requests == [("metadata", None), ("list_offsets", 1), ("list_offsets", 1)]


def test_a_partition_without_a_leader_is_retried_until_it_has_one() -> None:
    broker = ScriptedBroker({"a": {0: (0, 7), 1: (2, 4)}})
    broker.offset_errors = [{("a", 1): 6}]  # NOT_LEADER_OR_FOLLOWER on the first earliest request
    seen = snapshot(broker, ["a"], timeout_ms=5000, retry_backoff_ms=1)
    assert seen.watermarks == {TopicPartition("a", 0): Watermarks(0, 7), TopicPartition("a", 1): Watermarks(2, 4)}
    # the retry asks again only for what is missing
    assert [kind for kind, _ in broker.requests].count("metadata") == 2


def test_a_topic_still_being_created_is_retried() -> None:
    broker = ScriptedBroker({"a": {0: (0, 1)}})
    broker.metadata_errors = [{"a": 5}, {"a": 5}]  # LEADER_NOT_AVAILABLE twice
    assert snapshot(broker, ["a"], timeout_ms=5000, retry_backoff_ms=1).watermarks == {
        TopicPartition("a", 0): Watermarks(0, 1)}


def test_retries_that_never_converge_fail_loudly_naming_the_partition() -> None:
    broker = ScriptedBroker({"a": {0: (0, 1)}})
    broker.offset_errors = [{("a", 0): 6}] * 1000
    with pytest.raises(SnapshotError, match="a-0: NotLeaderForPartitionError"):
        snapshot(broker, ["a"], timeout_ms=50, retry_backoff_ms=5)


def test_a_refusal_is_not_retried() -> None:
    broker = ScriptedBroker({"a": {0: (0, 1)}})
    broker.metadata_errors = [{"a": 29}]  # TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(SnapshotError, match="topic a: TopicAuthorizationFailedError"):
        snapshot(broker, ["a"], timeout_ms=5000, retry_backoff_ms=1)
    assert len(broker.requests) == 1
