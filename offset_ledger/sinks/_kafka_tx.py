"""Executor side of the Kafka sink: one Kafka transaction per source partition.

Runs in Spark's Python workers (and on the driver for a partition no row reached): importable module
members and plain values only, so it pickles the same on classic Spark and Spark Connect, and it
imports neither SQLAlchemy nor the ledger. ``confluent_kafka`` must be installed where the executors
run (the ``kafka-sink`` extra).

Per source partition, in this order (each step is why the next one is safe)::

    init_transactions()      a new epoch for <pipeline>.<sink>.<topic>.<partition>: any older attempt
                             (a retried task, a zombie executor or driver) is fenced, its open
                             transaction aborted
    committed(group)         the sink's position in that partition, read after the fence: nothing
                             older can move it any more
    produce rows >= position the rows an earlier attempt committed are skipped, not written again
    send_offsets_to_transaction(position', mark)   in the same transaction as the outputs
    commit_transaction()
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from offset_ledger.rules.kafka_sink import PartitionRun, commit_position, to_write, transactional_id

#: Errors of the group coordinator that pass by themselves (a coordinator moving or loading its log).
_RETRIABLE = {"NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "_TIMED_OUT",
              "UNSTABLE_OFFSET_COMMIT", "_TRANSPORT"}


def _client(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in conf.items() if v is not None}


def _committed(consumer: Any, topic: str, partition: int, timeout_s: float) -> int | None:
    """The group's committed position of one partition (None: none yet), retrying a coordinator in motion."""
    from confluent_kafka import KafkaException, TopicPartition

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            tp = consumer.committed([TopicPartition(topic, partition)], timeout=max(1.0, deadline - time.monotonic()))[0]
            if tp.error is not None:
                raise KafkaException(tp.error)
            return tp.offset if tp.offset >= 0 else None
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            name = err.name() if hasattr(err, "name") else ""
            if name not in _RETRIABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class PartitionWriter:
    """One source partition's transaction: fence, read the position, write what is past it, commit."""

    def __init__(self, cfg: Mapping[str, Any], consumer: Any, topic: str, partition: int) -> None:
        from confluent_kafka import Producer

        self.cfg, self.consumer, self.topic, self.partition = cfg, consumer, topic, partition
        timeout = float(cfg["timeout_s"])
        self.producer = Producer(_client({
            **cfg["client"], "transactional.id": transactional_id(cfg["pipeline"], cfg["sink"], topic, partition),
            "enable.idempotence": True, "linger.ms": 5, "transaction.timeout.ms": cfg["transaction_timeout_ms"],
            **cfg["producer"]}))
        self.producer.init_transactions(timeout)
        self.position = _committed(consumer, topic, partition, timeout)
        self.producer.begin_transaction()
        self.written = self.skipped = 0
        self.last: int | None = None

    def write(self, offset: int, value: Any, key: Any, headers: Any, out_partition: Any) -> None:
        self.last = offset if self.last is None or offset > self.last else self.last
        if not to_write(offset, self.position):
            self.skipped += 1
            return
        kwargs: dict[str, Any] = {"value": value, "key": key}
        if headers:
            kwargs["headers"] = [(h[0], None if h[1] is None else bytes(h[1])) for h in headers]
        if out_partition is not None:
            kwargs["partition"] = int(out_partition)
        while True:
            try:
                self.producer.produce(self.cfg["topic"], **kwargs)
                break
            except BufferError:  # the local queue is full: let the batches in flight drain
                self.producer.poll(0.05)
        self.written += 1

    def commit(self, ranges: Mapping[tuple[str, int], tuple[int | None, int]], mark: str) -> PartitionRun:
        from confluent_kafka import TopicPartition

        until = ranges.get((self.topic, self.partition), (None, None))[1]
        position = commit_position(until, self.last, self.position)
        timeout = float(self.cfg["timeout_s"])
        self.producer.send_offsets_to_transaction(
            [TopicPartition(self.topic, self.partition, position, metadata=mark)],
            self.consumer.consumer_group_metadata(), timeout)
        self.producer.commit_transaction(timeout)
        return PartitionRun(self.topic, self.partition, self.written, self.skipped, position)

    def abort(self) -> None:
        try:
            self.producer.abort_transaction(5)
        except Exception:  # noqa: BLE001 - fenced or gone: the broker aborts it at the timeout anyway
            pass


def _consumer(cfg: Mapping[str, Any]) -> Any:
    from confluent_kafka import Consumer

    return Consumer(_client({**cfg["client"], "group.id": cfg["group"], "enable.auto.commit": False,
                             "isolation.level": "read_committed"}))


def write_partitions(cfg: Mapping[str, Any], rows: Iterable[Any]) -> Iterator[tuple[str, int, int, int, int]]:
    """``mapPartitions``: the task's rows, sorted by (topic, partition, offset), one transaction per source
    partition; yields (topic, partition, written, skipped, committed position) per partition.

    Each row is (topic, partition, offset, value, key, headers, output partition), as the driver selected.
    """
    ranges = {(t, int(p)): (f, int(u)) for t, p, f, u in cfg["ranges"]}
    consumer = None
    current: PartitionWriter | None = None
    try:
        for row in rows:
            topic, partition = row[0], int(row[1])
            if (topic, partition) not in ranges:
                raise ValueError(f"a row of {topic}[{partition}] offset {row[2]} is not in this batch's source "
                                 f"ranges: the sink writes rows of the batch's own Kafka records only")
            if current is None or (current.topic, current.partition) != (topic, partition):
                if current is not None:
                    yield _run(current.commit(ranges, cfg["mark"]))
                consumer = consumer or _consumer(cfg)
                current = PartitionWriter(cfg, consumer, topic, partition)
            current.write(int(row[2]), row[3], row[4], row[5], row[6])
        if current is not None:
            yield _run(current.commit(ranges, cfg["mark"]))
            current = None
    except BaseException:
        if current is not None:
            current.abort()
        raise
    finally:
        if consumer is not None:
            consumer.close()


def commit_empty(cfg: Mapping[str, Any], partitions: Iterable[tuple[str, int]]) -> list[PartitionRun]:
    """The transactions of source partitions no row reached (all filtered out): the position and mark only."""
    ranges = {(t, int(p)): (f, int(u)) for t, p, f, u in cfg["ranges"]}
    out = []
    consumer = _consumer(cfg)
    try:
        for topic, partition in partitions:
            writer = PartitionWriter(cfg, consumer, topic, partition)
            try:
                out.append(writer.commit(ranges, cfg["mark"]))
            except BaseException:
                writer.abort()
                raise
    finally:
        consumer.close()
    return out


def _run(run: PartitionRun) -> tuple[str, int, int, int, int]:
    return (run.topic, run.partition, run.written, run.skipped, run.committed)
