"""One look at a cluster: partitions, topic ids and log-start/log-end offsets of many topics at once.

A restart needs, for every partition of its topics, the leader, the topic's id and both
watermarks. kafka-python's consumer answers that with two full-cluster metadata refreshes and two
sequential ``beginning_offsets``/``end_offsets`` calls whose per-partition bookkeeping (a
``TopicPartition``, an error lookup and a debug log call per partition, on the I/O thread) cost
more than the broker's work (docs/benchmarks.md). Here the same answer
is one coroutine on the client's own I/O thread: one ``Metadata`` request for just these topics,
then a ``ListOffsets`` request per leader and per kind (earliest, latest), all sent before the
first reply is awaited, and the replies walked once. Requests are capped at the last
non-flexible ``ListOffsets`` version (5) because kafka-python's encoder is about four times
slower on the flexible ones, which carry nothing we need.

It goes through kafka-python's connection manager and protocol classes, so TLS, SASL, API-version
negotiation and reconnects are the client's; only the scheduling and the bookkeeping are ours.
Retriable errors (no leader yet, leader moved) are retried with fresh metadata until the deadline.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from offset_ledger.rules.model import TopicPartition, Watermarks

EARLIEST = -2  # ListOffsets timestamp sentinel: the log-start offset
LATEST = -1    # ListOffsets timestamp sentinel: the log-end offset (high watermark, read_uncommitted)
# v4 (Kafka 2.1+) fixes the partition fields' order we build; v5 is the last non-flexible version.
FIRST_LEADER_EPOCH_LIST_OFFSETS = 4
LAST_NON_FLEXIBLE_LIST_OFFSETS = 5
NO_TOPIC_ID = "00000000-0000-0000-0000-000000000000"

# Kafka error codes (the protocol's, stable across versions).
_NONE = 0
_UNKNOWN_TOPIC_OR_PARTITION = 3
_LEADER_NOT_AVAILABLE = 5
_NOT_LEADER_OR_FOLLOWER = 6
_REPLICA_NOT_AVAILABLE = 9
_KAFKA_STORAGE_ERROR = 56
_OFFSET_NOT_AVAILABLE = 78
_FENCED_LEADER_EPOCH = 74
_UNKNOWN_LEADER_EPOCH = 75
_RETRY = frozenset({_LEADER_NOT_AVAILABLE, _NOT_LEADER_OR_FOLLOWER, _REPLICA_NOT_AVAILABLE,
                    _KAFKA_STORAGE_ERROR, _OFFSET_NOT_AVAILABLE, _FENCED_LEADER_EPOCH, _UNKNOWN_LEADER_EPOCH})


class ClusterSnapshot(NamedTuple):
    """What one look at the cluster saw for the requested topics (topics that do not exist are absent)."""

    partitions: dict[str, list[int]]
    topic_ids: dict[str, str]               # KIP-516 ids; absent when the broker sends none
    watermarks: dict[TopicPartition, Watermarks]


class SnapshotError(Exception):
    """A non-retriable answer (authorization and the like), or retries that did not converge in time."""

    def __init__(self, message: str, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


class _Layout(NamedTuple):
    partitions: dict[str, list[int]]
    topic_ids: dict[str, str]
    leaders: dict[int, dict[str, list[int]]]  # leader node -> topic -> partitions
    waiting: list[str]                        # why the layout is not complete yet (retriable)


def snapshot(manager: Any, topics: Sequence[str], *, timeout_ms: int, retry_backoff_ms: int = 100) -> ClusterSnapshot:
    """Partitions, topic ids and watermarks of ``topics``; each attempt runs on the client's I/O thread."""
    wanted = list(dict.fromkeys(topics))
    if not wanted:
        return ClusterSnapshot({}, {}, {})
    deadline = time.monotonic() + timeout_ms / 1000
    marks: dict[TopicPartition, Watermarks] = {}
    while True:
        try:
            layout, retry = manager.run(_attempt, manager, wanted, marks)
        except Exception as exc:  # noqa: BLE001 - kafka-python marks the transient ones retriable
            if not getattr(exc, "retriable", False) or time.monotonic() + retry_backoff_ms / 1000 > deadline:
                raise
            layout, retry = None, [f"{type(exc).__name__}: {exc}"]  # a connection being (re)made
        if layout is not None and not retry:
            if len(marks) != sum(len(parts) for parts in layout.partitions.values()):
                # A topic vanished between attempts: keep only what the last metadata still lists.
                every = {TopicPartition(t, p) for t, parts in layout.partitions.items() for p in parts}
                marks = {tp: w for tp, w in marks.items() if tp in every}
            return ClusterSnapshot(layout.partitions, layout.topic_ids, marks)
        if time.monotonic() + retry_backoff_ms / 1000 > deadline:
            raise SnapshotError(f"Kafka did not answer for every partition within {timeout_ms} ms: "
                                + "; ".join(sorted(set(retry))[:5]))
        time.sleep(retry_backoff_ms / 1000)


async def _attempt(manager: Any, topics: list[str], marks: dict[TopicPartition, Watermarks]) -> tuple[_Layout, list[str]]:
    """One metadata request, then the watermarks ``marks`` lacks; adds them to ``marks``, returns what to retry."""
    layout = await topic_layout(manager, topics)
    missing = dict(layout.partitions) if not marks else {
        t: [p for p in parts if TopicPartition(t, p) not in marks] for t, parts in layout.partitions.items()}
    retry = list(layout.waiting)
    if any(missing.values()):
        got, failed = await _watermarks(manager, layout.leaders, missing)
        marks.update(got)
        retry += failed
    return layout, retry


async def topic_layout(manager: Any, topics: list[str]) -> _Layout:
    from kafka.protocol.metadata import MetadataRequest

    _Topic = MetadataRequest.MetadataRequestTopic
    request = MetadataRequest(topics=[_Topic(name=t) for t in topics], allow_auto_topic_creation=False)
    response = await manager.send(request)
    known = {b.node_id for b in manager.cluster.brokers()}
    if any(b.node_id not in known for b in response.brokers):
        manager.cluster.update_metadata(response)  # a broker we never met leads some partition
    partitions: dict[str, list[int]] = {}
    topic_ids: dict[str, str] = {}
    leaders: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    waiting: list[str] = []
    for topic in response.topics:
        if topic.error_code == _UNKNOWN_TOPIC_OR_PARTITION:
            continue  # does not exist: absent, as the callers expect
        if topic.error_code in _RETRY:
            waiting.append(f"{topic.name}: {_name(topic.error_code)}")
            continue
        if topic.error_code != _NONE:
            raise SnapshotError(f"Kafka refused metadata for topic {topic.name}: {_name(topic.error_code)}",
                                topic.error_code)
        parts = []
        for p in topic.partitions:
            parts.append(p.partition_index)
            if p.error_code in (_NONE, _REPLICA_NOT_AVAILABLE) and p.leader_id >= 0:
                leaders[p.leader_id][topic.name].append(p.partition_index)
            else:
                waiting.append(f"{topic.name}-{p.partition_index}: no leader ({_name(p.error_code)})")
        partitions[topic.name] = sorted(parts)
        topic_id = str(getattr(topic, "topic_id", None) or "")
        if topic_id and topic_id != NO_TOPIC_ID:
            topic_ids[topic.name] = topic_id
    return _Layout(partitions, topic_ids, leaders, waiting)


async def _watermarks(manager: Any, leaders: dict[int, dict[str, list[int]]],
                      missing: dict[str, list[int]]) -> tuple[dict[TopicPartition, Watermarks], list[str]]:
    """Both watermarks of the missing partitions: every request is in flight before the first reply."""
    from kafka.protocol.consumer import ListOffsetsRequest

    pending = []
    for node, by_topic in leaders.items():
        for kind in (EARLIEST, LATEST):
            request_topics = []
            for topic, parts in by_topic.items():
                todo = missing.get(topic) or ()
                chosen = parts if len(todo) == len(parts) else sorted(set(parts) & set(todo))
                if chosen:
                    # Positional (partition_index, current_leader_epoch, timestamp): the v4+ field
                    # order, ~5x cheaper to build and encode than one DataContainer per partition.
                    request_topics.append((topic, [(p, -1, kind) for p in chosen]))
            if request_topics:
                request = ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=request_topics,
                                             min_version=FIRST_LEADER_EPOCH_LIST_OFFSETS,
                                             max_version=LAST_NON_FLEXIBLE_LIST_OFFSETS)
                pending.append((kind, manager.send(request, node_id=node)))
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    failed: list[str] = []
    for kind, future in pending:
        response = await future
        into = starts if kind == EARLIEST else ends
        for topic in response.topics:
            name = topic.name
            for p in topic.partitions:
                if p.error_code == _NONE:
                    into[(name, p.partition_index)] = p.offset
                elif p.error_code in _RETRY or p.error_code == _UNKNOWN_TOPIC_OR_PARTITION:
                    # UNKNOWN_TOPIC_OR_PARTITION here: the leader has not heard of a new partition yet.
                    failed.append(f"{name}-{p.partition_index}: {_name(p.error_code)}")
                else:
                    raise SnapshotError(f"Kafka refused offsets of {name}-{p.partition_index}: "
                                        f"{_name(p.error_code)}", p.error_code)
    out = {TopicPartition(*key): Watermarks(start, ends[key]) for key, start in starts.items() if key in ends}
    return out, failed


def _name(error_code: int) -> str:
    from kafka import errors as kerr

    return kerr.for_code(error_code).__name__
