"""The Kafka sink's task (``sinks/_kafka_tx.py``) over an in-memory Kafka with transactions and epoch fencing.

The fake keeps what the task relies on: ``init_transactions`` bumps the transactional id's epoch and aborts the
older epoch's open transaction; outputs and offsets of a transaction become visible at its commit only; a fenced
producer's commit fails. The real broker runs the same in ``tests/integration/test_sink_kafka.py``.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from typing import Any

import pytest

from offset_ledger.rules.kafka_sink import Mark
from offset_ledger.sinks import _kafka_tx


class Broker:
    def __init__(self) -> None:
        self.epochs: Counter[str] = Counter()
        self.log: list[tuple[Any, ...]] = []  # committed outputs
        self.groups: dict[tuple[str, str, int], tuple[int, str]] = {}


class Fenced(Exception):
    pass


def fake_kafka(broker: Broker, die_after: dict[str, int] | None = None) -> types.ModuleType:
    """A ``confluent_kafka`` module over ``broker``; ``die_after``: {transactional id: outputs before a crash}."""
    mod = types.ModuleType("confluent_kafka")

    class KafkaException(Exception):
        pass

    class TopicPartition:
        def __init__(self, topic: str, partition: int, offset: int = -1001, metadata: str | None = None) -> None:
            self.topic, self.partition, self.offset, self.metadata = topic, partition, offset, metadata
            self.error = None

    class Consumer:
        def __init__(self, conf: dict[str, Any]) -> None:
            self.group = conf["group.id"]

        def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
            return [TopicPartition(tp.topic, tp.partition, broker.groups.get((self.group, tp.topic, tp.partition),
                                                                             (-1001, ""))[0]) for tp in tps]

        def consumer_group_metadata(self) -> str:
            return self.group

        def close(self) -> None:
            pass

    class Producer:
        def __init__(self, conf: dict[str, Any]) -> None:
            self.tid = conf["transactional.id"]
            self.pending: list[tuple[Any, ...]] = []
            self.offsets: list[tuple[str, TopicPartition]] = []

        def init_transactions(self, timeout: float) -> None:
            broker.epochs[self.tid] += 1
            self.epoch = broker.epochs[self.tid]

        def begin_transaction(self) -> None:
            self.pending, self.offsets = [], []

        def produce(self, topic: str, value: Any = None, key: Any = None, headers: Any = None,
                    partition: int = -1) -> None:
            if die_after is not None and die_after.get(self.tid) == len(self.pending):
                raise RuntimeError(f"executor lost while writing {self.tid}")
            self.pending.append((topic, value, key, tuple(headers or ()), partition))

        def poll(self, timeout: float) -> None:
            pass

        def send_offsets_to_transaction(self, tps: list[TopicPartition], group: str, timeout: float) -> None:
            if broker.epochs[self.tid] != self.epoch:  # the coordinator knows a newer epoch
                raise KafkaException(f"{self.tid}: producer fenced")
            self.offsets += [(group, tp) for tp in tps]

        def commit_transaction(self, timeout: float) -> None:
            if broker.epochs[self.tid] != self.epoch:
                raise Fenced(self.tid)
            broker.log.extend(self.pending)
            for group, tp in self.offsets:
                broker.groups[(group, tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")

        def abort_transaction(self, timeout: float) -> None:
            self.pending, self.offsets = [], []

    mod.KafkaException = KafkaException  # type: ignore[attr-defined]
    mod.TopicPartition = TopicPartition  # type: ignore[attr-defined]
    mod.Consumer = Consumer  # type: ignore[attr-defined]
    mod.Producer = Producer  # type: ignore[attr-defined]
    return mod


@pytest.fixture(autouse=True)
def _no_kept_clients() -> Any:
    """Each test starts with no producer or consumer kept from another test's fake broker."""
    _kafka_tx._PRODUCERS.clear()
    _kafka_tx._CONSUMERS.clear()
    yield
    _kafka_tx._PRODUCERS.clear()
    _kafka_tx._CONSUMERS.clear()


def _cfg(ranges: list[tuple[str, int, int, int]], seq: int = 1) -> dict[str, Any]:
    return {"client": {"bootstrap.servers": "fake"}, "producer": {}, "transaction_timeout_ms": 60000,
            "pipeline": "p", "sink": "p:out", "group": "g", "topic": "out", "timeout_s": 5,
            "mark": Mark("p:out", seq, 1, seq - 1, "q", len(ranges)).encode(), "ranges": ranges}


def _written(out: Any) -> list[tuple[Any, ...]]:
    """What a task reports per partition (its status batches' rows), without their timings."""
    return [tuple(row.values())[:5] for batch in out for row in batch.to_pylist()]


def _arrow(rows: list[tuple[Any, ...]], split: int | None = None, size: int = 4) -> list[Any]:
    """The rows as the task's Arrow record batches (``size`` rows each), tagged with the scan split that read them."""
    import pyarrow as pa

    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    out = []
    for i in range(0, len(rows), size):
        chunk = rows[i:i + size]
        arrays = [pa.array([r[0] for r in chunk], pa.string()), pa.array([r[1] for r in chunk], pa.int32()),
                  pa.array([r[2] for r in chunk], pa.int64()), pa.array([r[3] for r in chunk], pa.binary()),
                  pa.array([r[4] for r in chunk], pa.binary()), pa.array([r[5] for r in chunk], headers),
                  pa.array([r[6] for r in chunk], pa.int32())]
        names = ["topic", "partition", "offset", "value", "key", "headers", "_out"]
        if split is not None:
            arrays.append(pa.array([split] * len(chunk), pa.int32()))
            names.append("_split")
        out.append(pa.RecordBatch.from_arrays(arrays, names=names))
    return out


def _task(cfg: dict[str, Any], rows: list[tuple[Any, ...]], split: int | None = None) -> list[tuple[Any, ...]]:
    return _written(_kafka_tx.write_batches(cfg, iter(_arrow(rows, split))))


def _rows(part: int, offsets: range) -> list[tuple[Any, ...]]:
    return [("in", part, o, f"v{part}-{o}".encode(), None, None, None) for o in offsets]


def test_a_retried_task_writes_only_the_partitions_and_rows_the_first_attempt_missed(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    broker = Broker()
    ranges = [("in", 0, 0, 10), ("in", 1, 0, 10)]
    rows = _rows(0, range(10)) + _rows(1, range(10))
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker, die_after={"p.p:out.in.1": 4}))
    with pytest.raises(RuntimeError, match="executor lost"):
        _task(_cfg(ranges), rows)
    assert broker.log == [] and broker.groups == {}  # the task's transactions commit after its last row only
    # An attempt that committed partition 0 and failed at partition 1's commit (its producer fenced, say).
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    assert _task(_cfg(ranges), rows[:10]) == [("in", 0, 10, 0, 10)]
    assert broker.groups[("g", "in", 0)][0] == 10 and ("g", "in", 1) not in broker.groups
    runs = _task(_cfg(ranges), rows)
    assert runs == [("in", 0, 0, 10, 10), ("in", 1, 10, 0, 10)]
    assert Counter(v for _, v, *_ in broker.log) == Counter(r[3] for r in rows)  # each output once
    assert Mark.decode(broker.groups[("g", "in", 1)][1]).sequence == 1  # type: ignore[union-attr]


def test_a_zombie_attempt_cannot_commit_after_the_retry_fenced_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    broker = Broker()
    kafka = fake_kafka(broker)
    monkeypatch.setitem(sys.modules, "confluent_kafka", kafka)
    ranges = [("in", 0, 0, 5)]
    consumer = kafka.Consumer({"group.id": "g"})  # type: ignore[attr-defined]
    zombie = _kafka_tx.PartitionWriter(_cfg(ranges), consumer, "in", 0, {("in", 0): (0, 5)}, "")
    for row in _rows(0, range(5)):
        zombie.write(*row[2:])
    # The retry initialises after it (a new epoch), reads the position, writes and commits.
    assert _task(_cfg(ranges), _rows(0, range(5))) == [("in", 0, 5, 0, 5)]
    with pytest.raises(Fenced):
        zombie.commit()
    assert len(broker.log) == 5  # the retry's five, not the zombie's


def test_a_kept_producer_a_newer_attempt_fenced_is_replaced_before_any_row(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    broker = Broker()
    kafka = fake_kafka(broker)
    monkeypatch.setitem(sys.modules, "confluent_kafka", kafka)
    assert _task(_cfg([("in", 0, 0, 5)]), _rows(0, range(5))) == [("in", 0, 5, 0, 5)]
    assert len(_kafka_tx._PRODUCERS) == 1 and broker.epochs["p.p:out.in.0"] == 1
    # Another worker's attempt (a zombie of a killed driver, say) initialised since: the kept one is stale.
    other = kafka.Producer({"transactional.id": "p.p:out.in.0"})  # type: ignore[attr-defined]
    other.init_transactions(1)
    runs = _task(_cfg([("in", 0, 5, 10)], seq=2), _rows(0, range(5, 10)))
    assert runs == [("in", 0, 5, 0, 10)] and broker.epochs["p.p:out.in.0"] == 3  # replaced, fenced back
    assert len(broker.log) == 10
    # The next batch reuses the kept producer: no new epoch.
    _task(_cfg([("in", 0, 10, 12)], seq=3), _rows(0, range(10, 12)))
    assert broker.epochs["p.p:out.in.0"] == 3 and len(broker.log) == 12


def test_a_row_past_the_batchs_end_of_its_partition_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    with pytest.raises(ValueError, match=r"offset 5 lies past this batch's end"):
        _task(_cfg([("in", 0, 0, 5)]), _rows(0, range(6)))
    assert broker.log == [] and broker.groups == {}


def test_rows_of_a_partition_outside_the_batch_are_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    with pytest.raises(ValueError, match=r"in\[3\] offset 0 is not in this batch"):
        _task(_cfg([("in", 0, 0, 5)]), _rows(3, range(1)))
    assert broker.log == []


def test_a_partition_without_rows_still_commits_the_batch_end(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    runs = _kafka_tx.commit_empty(_cfg([("in", 0, 3, 8)]), [("in", 0)])
    assert [(r.written, r.committed) for r in runs] == [(0, 8)] and broker.groups[("g", "in", 0)][0] == 8


def test_a_scan_task_commits_the_partitions_of_the_splits_it_read_and_no_other(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    """Without the shuffle each row carries the scan split that read it; a task (after a coalesce: several splits)
    commits each partition it saw rows of, all after its last row; one whose rows were all filtered out is the
    driver's to commit (``commit_empty``), never a task's that merely expected it."""
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    cfg = {**_cfg([("in", 0, 0, 5), ("in", 1, 0, 4), ("in", 2, 0, 3)]),
           "assigned": [("in", 1), ("in", 0), None, ("in", 2)]}
    batches = _arrow(_rows(1, range(4)), split=0) + _arrow(_rows(2, range(3)), split=3)
    assert _written(_kafka_tx.write_batches(cfg, iter(batches))) == [("in", 1, 4, 0, 4), ("in", 2, 3, 0, 3)]
    assert _task(cfg, [], split=1) == []  # split 1's rows all filtered out: nothing committed by a task
    assert len(broker.log) == 7 and ("g", "in", 0) not in broker.groups
    assert broker.groups[("g", "in", 1)][0] == 4 and broker.groups[("g", "in", 2)][0] == 3
    # The retry of the task: the group holds both partitions, nothing is written twice.
    assert _written(_kafka_tx.write_batches(cfg, iter(batches))) == [("in", 1, 0, 4, 4), ("in", 2, 0, 3, 3)]
    assert len(broker.log) == 7


def test_a_scan_task_holding_a_row_its_split_does_not_read_fails_before_any_commit(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    """A job that rewrote the source columns: every transaction of the task is aborted, none committed, even the
    one whose rows were all right and came first."""
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    cfg = {**_cfg([("in", 0, 0, 5), ("in", 1, 0, 5)]), "assigned": [("in", 0), ("in", 1)]}
    batches = _arrow(_rows(0, range(3)), split=0) + _arrow(_rows(1, range(2, 3)), split=0)
    with pytest.raises(ValueError, match=r"a row of in\[1\] offset 2 came from Spark's read of in\[0\]"):
        _written(_kafka_tx.write_batches(cfg, iter(batches)))
    assert broker.log == [] and broker.groups == {}


def test_a_task_commits_all_its_partitions_only_after_its_last_row(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Rows of several partitions in one task (a shuffle's hash, a coalesce), interleaved across record batches: one
    transaction each, in offset order, none committed before the task's input ends."""
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    rows = [r for pair in zip(_rows(0, range(6)), _rows(1, range(6))) for r in pair]  # alternating partitions
    ranges = [("in", 0, 0, 6), ("in", 1, 0, 6)]

    def checked() -> Any:
        for batch in _arrow(rows, size=5):
            assert broker.log == [] and broker.groups == {}  # nothing committed while rows still come
            yield batch

    assert _written(_kafka_tx.write_batches(_cfg(ranges), checked())) == [("in", 0, 6, 0, 6), ("in", 1, 6, 0, 6)]
    assert [v for _, v, *_ in broker.log if v.startswith(b"v0")] == [f"v0-{o}".encode() for o in range(6)]


def test_a_partition_opened_ahead_whose_rows_never_came_is_released_not_committed(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    """The driver's hint says a task reads in[0] and in[1]; only in[1]'s rows come (in[0]'s all filtered out, or
    read by another task): in[0]'s transaction is aborted, its producer kept, nothing of in[0] committed."""
    broker = Broker()
    monkeypatch.setitem(sys.modules, "confluent_kafka", fake_kafka(broker))
    monkeypatch.setattr(_kafka_tx, "_expected", lambda cfg: [("in", 0), ("in", 1)])
    cfg = {**_cfg([("in", 0, 0, 5), ("in", 1, 0, 4)]), "assigned": [("in", 0), ("in", 1)]}
    assert _task(cfg, _rows(1, range(4)), split=1) == [("in", 1, 4, 0, 4)]
    assert ("g", "in", 0) not in broker.groups and len(broker.log) == 4
    assert len(_kafka_tx._PRODUCERS) == 2 and broker.epochs["p.p:out.in.0"] == 1  # kept for its next batch
    # The driver commits it (commit_empty: the position and mark alone).
    _kafka_tx.commit_empty(cfg, [("in", 0)])
    assert broker.groups[("g", "in", 0)][0] == 5


def test_a_batch_without_its_source_columns_is_refused_before_the_ledger_or_kafka_is_touched() -> None:
    from offset_ledger.errors import SinkInputRefused, exit_code
    from offset_ledger.sinks import KafkaSink

    class Aggregated:  # what foreachBatch hands the sink after a count(): no source record per row
        columns = ["value", "n"]

    # Nothing listens on either address: a refusal that connected first would fail otherwise.
    sink = KafkaSink(topic="out", bootstrap_servers="127.0.0.1:9", pipeline="p", dsn="postgresql://x@127.0.0.1:9/l",
                     checkpoint_location="/nowhere")
    with pytest.raises(SinkInputRefused, match=r"no topic, partition, offset column\(s\)") as refused:
        sink.write(Aggregated(), 0)
    assert exit_code(refused.value) == 2 and refused.value.details["missing"] == ["topic", "partition", "offset"]


def test_a_spark_connect_batch_is_refused_before_anything_is_touched() -> None:
    from offset_ledger.errors import ConfigError
    from offset_ledger.sinks import KafkaSink

    connect = type("DataFrame", (), {"__module__": "pyspark.sql.connect.dataframe",
                                     "columns": ["topic", "partition", "offset", "value"]})
    sink = KafkaSink(topic="out", bootstrap_servers="127.0.0.1:9", pipeline="p", dsn="postgresql://x@127.0.0.1:9/l",
                     checkpoint_location="/nowhere")
    with pytest.raises(ConfigError, match="classic Spark only"):
        sink.write(connect(), 0)


def test_a_partition_column_the_batch_lacks_is_refused_not_replaced_by_the_key_partitioner() -> None:
    """A named ``partition_column`` is a promise about where each output goes: a typo must not fall back to
    Kafka's partitioner on the key (the default name, ``output_partition``, stays optional)."""
    from offset_ledger.errors import SinkInputRefused, exit_code
    from offset_ledger.sinks import KafkaSink

    class Batch:
        columns = ["topic", "partition", "offset", "value", "out_partition"]

    sink = KafkaSink(topic="out", bootstrap_servers="127.0.0.1:9", pipeline="p", dsn="postgresql://x@127.0.0.1:9/l",
                     checkpoint_location="/nowhere", partition_column="out_partiton")
    with pytest.raises(SinkInputRefused, match="out_partiton") as refused:
        sink.write(Batch(), 0)
    assert exit_code(refused.value) == 2 and refused.value.details["missing"] == ["out_partiton"]
