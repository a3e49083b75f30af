"""Executor side of the Kafka sink: one Kafka transaction per source partition.

Runs in Spark's Python workers (and on the driver for a partition no row reached): importable module
members and plain values only, so it pickles the same on classic Spark and Spark Connect, and it
imports neither SQLAlchemy nor the ledger. ``confluent_kafka`` must be installed where the executors
run (the ``kafka-sink`` extra).

A Spark task (``write_batches``, in a ``mapInArrow``) receives its rows as Arrow record batches, holding
every row of each source partition it sees; each partition's transaction runs in the executor's producer
owner (``_kafka_owner``: one process per executor that keeps the producers, whichever Python worker runs
the task), the task sending it the rows as Arrow bytes, and all of a task's transactions are committed
after its last row. In the owner, on the driver, or in a worker that cannot reach an owner a transaction
is ``PartitionWriter``.
Per source partition, in this order (each step is why the next one is safe)::

    init_transactions()      a new epoch for <pipeline>.<sink>.<topic>.<partition>: any older attempt
                             (a retried task, a zombie executor or driver) is fenced, its open
                             transaction aborted (once per process: the producer is kept between batches)
    committed(group)         the sink's position in that partition, read after the fence: nothing
                             older can move it any more
    begin_transaction(); send_offsets_to_transaction(max(batch end, position), mark)
                             first: it fails for a kept producer a newer attempt fenced (replaced then)
    produce rows >= position the rows an earlier attempt committed are skipped, not written again
    commit_transaction()     outputs and position, one fact
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from offset_ledger.rules.kafka_sink import PartitionRun, commit_position, to_write, transactional_id
from offset_ledger.sinks._kafka_owner import OwnedWriter, arrow_rows, connect, run

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
            left = max(1.0, deadline - time.monotonic())
            tp = consumer.committed([TopicPartition(topic, partition)], timeout=left)[0]
            if tp.error is not None:
                raise KafkaException(tp.error)
            return tp.offset if tp.offset >= 0 else None
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            name = err.name() if hasattr(err, "name") else ""
            if name not in _RETRIABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: Producers kept between batches, one per transactional id, in each process that writes (the executor's owner,
#: the driver, a worker without an owner). Taken out while a partition uses it (from one thread of the owner), put
#: back after its commit; a producer that failed is never put back. Creating one and ``init_transactions`` cost most
#: of a small batch (issue 53's benchmark: ~1.3 s a batch of 6 partitions).
_PRODUCERS: dict[tuple[str, str], Any] = {}
_CONSUMERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _conf_key(conf: Mapping[str, Any]) -> str:
    return repr(sorted((k, str(v)) for k, v in conf.items()))


class PartitionWriter:
    """One source partition's transaction: fence, read the position, write what is past it, commit.

    The source position goes to the transaction first (``send_offsets_to_transaction``, right after
    ``begin_transaction``), before any row: it is known up front (the batch's end of the partition, or
    the group's position when that is further), and it is the first call that asks the coordinator
    whether this producer's epoch is still the newest. A kept producer that a newer attempt fenced
    since its last batch fails there, before a row was taken from the task's iterator, and is replaced
    by a new one (whose ``init_transactions`` fences that attempt in turn) without failing the task.
    """

    def __init__(self, cfg: Mapping[str, Any], consumer: Any, topic: str, partition: int,
                 ranges: Mapping[tuple[str, int], tuple[int | None, int]], mark: str) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        started = time.perf_counter()
        #: Where this partition's time went (ms; new_producers a count), summed over the batch by the driver.
        self.timings = {"init_ms": 0.0, "fenced_ms": 0.0, "group_read_ms": 0.0, "send_offsets_ms": 0.0,
                        "rows_ms": 0.0, "commit_ms": 0.0, "new_producers": 0.0}
        self.cfg, self.consumer, self.topic, self.partition = cfg, consumer, topic, partition
        self.until = ranges[(topic, partition)][1]
        timeout = float(cfg["timeout_s"])
        conf = _client({
            **cfg["client"], "transactional.id": transactional_id(cfg["pipeline"], cfg["sink"], topic, partition),
            "enable.idempotence": True, "linger.ms": 5, "transaction.timeout.ms": cfg["transaction_timeout_ms"],
            # The next transaction's first call meets the coordinator still finishing the last one
            # (CONCURRENT_TRANSACTIONS) and is retried after this backoff: librdkafka's default 100 ms was
            # most of a small batch's transaction (measured: 100 ms -> 8 ms per partition and batch).
            "retry.backoff.ms": 10, "retry.backoff.max.ms": 100,
            **cfg["producer"]})
        self.key = (conf["transactional.id"], _conf_key(conf))
        with _LOCK:
            producer = _PRODUCERS.pop(self.key, None)
        fresh = producer is None
        while True:
            t0 = time.perf_counter()
            if producer is None:
                producer = self._new(conf, timeout)
                self.timings["new_producers"] += 1
            self.producer = producer
            t1 = time.perf_counter()
            try:
                # After the fence (a new producer's init) or with a kept producer nothing else wrote since.
                self.position = _committed(consumer, topic, partition, timeout)
                self.committing = commit_position(self.until, None, self.position)
                t2 = time.perf_counter()
                producer.begin_transaction()
                producer.send_offsets_to_transaction(
                    [TopicPartition(topic, partition, self.committing, metadata=mark)],
                    consumer.consumer_group_metadata(), timeout)
                t3 = time.perf_counter()
                self._add(init_ms=t1 - t0, group_read_ms=t2 - t1, send_offsets_ms=t3 - t2)
                break
            except KafkaException:
                self.abort()
                if fresh:
                    raise
                self._add(fenced_ms=time.perf_counter() - t0)  # the kept producer's try, found fenced
                producer, fresh = None, True  # a newer attempt fenced the kept producer: fence it back
        self.written = self.skipped = 0
        self.opened = time.perf_counter()
        self.started = started

    def _add(self, **seconds: float) -> None:
        for name, value in seconds.items():
            self.timings[name] += value * 1000

    @staticmethod
    def _new(conf: Mapping[str, Any], timeout: float) -> Any:
        from confluent_kafka import Producer

        producer = Producer(dict(conf))
        producer.init_transactions(timeout)
        return producer

    def write(self, offset: int, value: Any, key: Any, headers: Any, out_partition: Any) -> None:
        check_in_batch(self.topic, self.partition, offset, self.until)
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

    def write_batch(self, batch: Any) -> None:
        """An Arrow record batch of ``ROW_COLUMNS`` (the task's, or one the owner received): checked whole (its
        last offset against the batch's end of the partition, its first against the group's position), then
        produced in one loop; row by row through ``write`` only when it straddles the group's position."""
        import pyarrow.compute as pc

        n = batch.num_rows
        if n == 0:
            return
        bounds = pc.min_max(batch.column("offset"))
        check_in_batch(self.topic, self.partition, int(bounds["max"].as_py()), self.until)
        if not to_write(int(bounds["min"].as_py()), self.position):  # a re-run: some rows are already there
            for row in arrow_rows(batch):
                self.write(*row)
            return
        produce, poll, topic = self.producer.produce, self.producer.poll, self.cfg["topic"]
        for _, value, key, headers, out in arrow_rows(batch):
            kwargs: dict[str, Any] = {"value": value, "key": key, "partition": -1 if out is None else int(out)}
            if headers:
                kwargs["headers"] = [(h[0], None if h[1] is None else bytes(h[1])) for h in headers]
            while True:
                try:
                    produce(topic, **kwargs)
                    break
                except BufferError:  # the local queue is full: let the batches in flight drain
                    poll(0.05)
        self.written += n

    def request_commit(self) -> None:
        """Nothing ahead of ``commit`` in this process (the owner's writer commits as its connection asks)."""

    def commit(self) -> PartitionRun:
        t0 = time.perf_counter()
        self.producer.commit_transaction(float(self.cfg["timeout_s"]))
        self._add(rows_ms=t0 - self.opened, commit_ms=time.perf_counter() - t0)
        with _LOCK:
            _PRODUCERS[self.key] = self.producer  # kept for this partition's next batch
        return PartitionRun(self.topic, self.partition, self.written, self.skipped, self.committing)

    def abort(self) -> None:
        """Give the transaction up; the producer is dropped (never kept after a failure)."""
        try:
            self.producer.abort_transaction(5)
        except Exception:  # noqa: BLE001 - fenced or gone: the broker aborts it at the timeout anyway
            pass

    def release(self) -> None:
        """Give up a transaction opened ahead for rows that never came (no row written): aborted, and the producer
        kept when the abort succeeded (nothing failed; a newer epoch is found at its next ``send_offsets``)."""
        try:
            self.producer.abort_transaction(float(self.cfg["timeout_s"]))
        except Exception:  # noqa: BLE001 - not kept: the broker aborts it at the timeout anyway
            return
        with _LOCK:
            _PRODUCERS[self.key] = self.producer


def check_in_batch(topic: str, partition: int, offset: int, until: int) -> None:
    if offset >= until:
        raise ValueError(f"a row of {topic}[{partition}] at offset {offset} lies past this batch's "
                         f"end of the partition ({until}): the sink writes the batch's own records only")


def open_writer(cfg: Mapping[str, Any], topic: str, partition: int, mark: str) -> PartitionWriter:
    """One source partition's transaction with a producer kept in this process (the owner's, or the driver's)."""
    ranges = {(t, int(p)): (f, int(u)) for t, p, f, u in cfg["ranges"]}
    return PartitionWriter(cfg, _consumer(cfg), topic, partition, ranges, mark)


def serve_owner(path: str, daemon_pid: int) -> None:
    """The executor's producer owner (``_kafka_owner``): started by the first worker that found none."""
    run(path, daemon_pid, open_writer)


#: A source partition's transaction in a task: in the executor's owner when ``cfg["owner"]`` (the sink sets it)
#: and the owner can be reached, else with a producer kept in this worker.
Writer = PartitionWriter | OwnedWriter


def _task_writer(cfg: Mapping[str, Any], topic: str, partition: int,
                 ranges: Mapping[tuple[str, int], tuple[int | None, int]]) -> Writer:
    if cfg.get("owner"):
        t0 = time.perf_counter()
        sock = connect()
        if sock is not None:
            try:
                writer = OwnedWriter(sock, cfg, topic, partition, ranges[(topic, partition)][1],
                                     cfg["mark"], check_in_batch)
            except OSError:  # the owner went away between the connect and the open (its idle end): keep our own
                sock.close()
            else:
                writer.connect_ms = (time.perf_counter() - t0) * 1000
                return writer
    return PartitionWriter(cfg, _consumer(cfg), topic, partition, ranges, cfg["mark"])


def _consumer(cfg: Mapping[str, Any]) -> Any:
    """The sink group's consumer (never subscribed: it reads committed positions and names the group)."""
    from confluent_kafka import Consumer

    conf = _client({**cfg["client"], "group.id": cfg["group"], "enable.auto.commit": False,
                    "isolation.level": "read_committed"})
    key = _conf_key(conf)
    with _LOCK:
        if key not in _CONSUMERS:
            _CONSUMERS[key] = Consumer(conf)
        return _CONSUMERS[key]


#: What a task sends back per source partition: (topic, partition, written, skipped, committed position, timings).
TaskRun = tuple[str, int, int, int, int, dict[str, float]]

#: The columns the driver selects for the tasks (``sinks/kafka.py``): the source record, what is written, and on the
#: scan path ``_split``, the index of the Spark partition of the batch's Kafka scan that read the row.
SOURCE = ("topic", "partition")
ROW_COLUMNS = ("offset", "value", "key", "headers", "_out")
#: What a task returns to the driver (``mapInArrow``'s schema): one row per source partition it committed.
STATUS_SCHEMA = "topic string, partition int, written long, skipped long, committed long, timings string"


def write_batches(cfg: Mapping[str, Any], batches: Iterable[Any]) -> Iterator[Any]:
    """``mapInArrow``: the task's rows as Arrow record batches; one transaction per source partition among them,
    all committed after the task's last row; yields one status row per committed partition (never a row).

    ``cfg["assigned"]`` (the scan path: no shuffle): per Spark partition of the batch's Kafka scan, the one source
    partition it reads (``rules.kafka_sink.scan_assignment``, checked on the driver); every row carries the index of
    the split that read it (``_split``) and must name that split's partition. A split is computed whole by one task
    (a coalesce hands whole splits to tasks), so a task that saw a row of a partition holds all of its rows. Without
    ``assigned`` (the shuffle path) the rows were grouped by source partition and sorted by offset.

    A transaction opens at its partition's first row (in the executor's owner, which fences, reads the group's
    position and sends the offsets while the task goes on reading) and every one of the task's transactions is
    committed only once the task has read all its rows: a row the task refuses, wherever it comes, aborts them
    all before anything of the task is committed. A partition none of whose rows reached any task is committed
    by the driver (``commit_empty``), never by a task that merely expected it.
    """
    ranges = {(t, int(p)): (f, int(u)) for t, p, f, u in cfg["ranges"]}
    assigned = cfg.get("assigned")
    writers: dict[tuple[str, int], Writer] = {}
    seen: set[tuple[str, int]] = set()
    done: list[TaskRun] = []
    try:
        # Before the first batch is asked for: the partitions the driver expects this task to read (a hint) are
        # opened now, so the owner's fence, group read and send_offsets overlap Spark's read of the splits.
        for tp in _expected(cfg):
            writers[tp] = _task_writer(cfg, tp[0], tp[1], ranges)
        for batch in batches:
            for tp, rows in _runs(batch, ranges, assigned):
                writer = writers.get(tp)
                if writer is None:
                    writer = writers[tp] = _task_writer(cfg, tp[0], tp[1], ranges)
                seen.add(tp)
                writer.write_batch(rows.select(list(ROW_COLUMNS)))
        for tp in [tp for tp in writers if tp not in seen]:  # expected, no row came: never committed by a task
            writers.pop(tp).release()
        for writer in writers.values():  # the owner commits them side by side; the answers are read below
            writer.request_commit()
        for tp in list(writers):
            done.append(_run(writers[tp]))
            del writers[tp]
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    if done:
        yield _status(done)


def _expected(cfg: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The source partitions the driver expects this task to read (``cfg["expected"]`` per task index), or none."""
    expected = cfg.get("expected")
    if not expected:
        return []
    try:
        from pyspark import TaskContext

        index = TaskContext.get().partitionId()
    except Exception:  # noqa: BLE001 - not in a Spark task (a test): nothing opened ahead
        return []
    return [(t, int(p)) for t, p in expected[index]] if 0 <= index < len(expected) else []


def _runs(batch: Any, ranges: Mapping[tuple[str, int], tuple[int | None, int]],
          assigned: list[tuple[str, int] | None] | None) -> Iterator[tuple[tuple[str, int], Any]]:
    """The batch cut into runs of rows of one source partition (and one split), each checked against the batch."""
    import pyarrow.compute as pc

    n = batch.num_rows
    if n == 0:
        return
    # Where the source partition (or the split) changes, found by pyarrow, not by a Python loop over the rows.
    keys = [batch.column("topic"), batch.column("partition")]
    if assigned is not None:
        keys.append(batch.column("_split"))
    changed = None
    for key in keys:
        step = pc.not_equal(key.slice(1), key.slice(0, n - 1)).fill_null(True)
        changed = step if changed is None else pc.or_(changed, step)
    cuts = [0] + ([i + 1 for i in pc.indices_nonzero(changed).to_pylist()] if changed is not None else []) + [n]
    topics, parts = batch.column("topic"), batch.column("partition")
    splits = batch.column("_split") if assigned is not None else None
    for start, end in zip(cuts, cuts[1:]):
        tp = (topics[start].as_py(), int(parts[start].as_py()))
        if tp not in ranges:
            raise ValueError(f"a row of {tp[0]}[{tp[1]}] offset {batch.column('offset')[start].as_py()} is not in "
                             f"this batch's source ranges: the sink writes rows of the batch's own Kafka records only")
        if splits is not None and assigned is not None:
            split = splits[start].as_py()
            read = assigned[split] if split is not None and 0 <= split < len(assigned) else None
            if read != tp:
                what = "an empty range" if read is None else f"{read[0]}[{read[1]}]"
                raise ValueError(f"a row of {tp[0]}[{tp[1]}] offset {batch.column('offset')[start].as_py()} came "
                                 f"from Spark's read of {what}: the sink's topic, partition and offset columns must "
                                 f"be the Kafka source's own")
        yield tp, batch.slice(start, end - start)


def _status(runs: list[TaskRun]) -> Any:
    import json

    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([r[0] for r in runs], pa.string()), pa.array([r[1] for r in runs], pa.int32()),
         pa.array([r[2] for r in runs], pa.int64()), pa.array([r[3] for r in runs], pa.int64()),
         pa.array([r[4] for r in runs], pa.int64()), pa.array([json.dumps(r[5]) for r in runs], pa.string())],
        names=["topic", "partition", "written", "skipped", "committed", "timings"])


def commit_empty(cfg: Mapping[str, Any], partitions: Iterable[tuple[str, int]]) -> list[PartitionRun]:
    """The transactions of source partitions no row reached (all filtered out): the position and mark only, side by
    side (each its own producer and transaction)."""
    from concurrent.futures import ThreadPoolExecutor

    ranges = {(t, int(p)): (f, int(u)) for t, p, f, u in cfg["ranges"]}

    def one(tp: tuple[str, int]) -> PartitionRun:
        writer = PartitionWriter(cfg, _consumer(cfg), tp[0], tp[1], ranges, cfg["mark"])
        try:
            return writer.commit()
        except BaseException:
            writer.abort()
            raise

    todo = list(partitions)
    if len(todo) <= 1:
        return [one(tp) for tp in todo]
    with ThreadPoolExecutor(max_workers=min(len(todo), 8)) as pool:
        return list(pool.map(one, todo))


def _run(writer: Writer) -> TaskRun:
    run = writer.commit()
    timings = dict(writer.timings)
    if isinstance(writer, OwnedWriter):
        timings["connect_ms"] = writer.connect_ms
    return (run.topic, run.partition, run.written, run.skipped, run.committed, timings)
