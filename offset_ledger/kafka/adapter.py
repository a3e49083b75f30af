"""kafka-python adapter: partitions, log-start/log-end offsets, offsets for a time, record timestamps
and consumer-group offsets (read, and committed without joining the group).

The only module that talks to Kafka and the only one that knows kafka-python's stringly-typed
``**configs``. Constructing an adapter makes no network call; the first question connects.
Kafka client settings are accepted the way Spark's reader takes them (``kafka.``-prefixed Java
property names), so a pipeline's reader options can be handed over as they are.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from offset_ledger.addresses import KafkaAddress
from offset_ledger.errors import (
    ConfigError,
    KafkaError,
)
from offset_ledger.kafka.client_config import client_configs
from offset_ledger.kafka.client_errors import translate_error as _translate
from offset_ledger.kafka.group_admin import GroupAdmin
from offset_ledger.kafka.readable_records import read_ranges
from offset_ledger.kafka.record_times import record_times_by_fetch
from offset_ledger.kafka.snapshot import ClusterSnapshot, SnapshotError, snapshot
from offset_ledger.rules.model import TopicPartition, Watermarks

log = logging.getLogger(__name__)


class KafkaAdapter(GroupAdmin):
    """Answers offset questions about a cluster; thread-safe, lazy, reusable."""

    def __init__(self, bootstrap_servers: str, options: Mapping[str, Any] | None = None,
                 *, request_timeout_ms: int = 10000) -> None:
        self._configs = client_configs(bootstrap_servers, options)
        self._configs.setdefault("request_timeout_ms", request_timeout_ms)
        # Without this an unreachable cluster blocks the first call for 30 s (kafka-python's default).
        self._configs.setdefault("bootstrap_timeout_ms", self._configs["request_timeout_ms"])
        self._configs.setdefault("reconnect_backoff_max_ms", 2000)
        self._configs.setdefault("client_id", "offset-ledger")
        self._bootstrap = ",".join(self._configs["bootstrap_servers"])
        self._consumer: Any = None
        self._sampler: Any = None  # a second group-less consumer that reads record timestamps
        self._admin: Any = None    # consumer-group offsets: read, and committed by the mirror
        self._connect_error: Exception | None = None  # from connect_in_background, for the next call
        self._closes = 0
        self._lock = threading.Lock()

    @classmethod
    def open(cls, address: KafkaAddress) -> KafkaAdapter:
        """The client of the cluster at ``address``: the one way this package makes a ``KafkaAdapter``.

        Every face resolves its ``KafkaAddress`` once and hands the value down; the clients are made
        here, not from loose servers and options at each caller (the listener's mirror, a failover's
        target, the CLI and ``Operations`` all reach Kafka the same way). ConfigError without servers.
        """
        # Named, not ``cls(``: tests/unit/project/test_addresses.py finds the one construction by its name.
        return KafkaAdapter(address.require(), address.options, request_timeout_ms=address.timeout_ms)

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap

    def __enter__(self) -> KafkaAdapter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._closes += 1  # a handshake started before this close makes no client afterwards
        with self._lock:
            clients = [c for c in (self._consumer, self._sampler) if c is not None]
            self._consumer = self._sampler = None
            admin, self._admin = self._admin, None
        # kafka-python 3.0 joins its IO thread without a bound when a client closes; a thread stuck
        # on a broker would hang close() and, with it, a CLI command past its --timeout (the command
        # had already answered). The clients close in a daemon thread waited on for at most one
        # request timeout; past it, the process goes on and the daemon IO threads end with it.
        closing = threading.Thread(target=_close_clients, args=(clients, admin), daemon=True,
                                   name="offset-ledger-kafka-close")
        closing.start()
        closing.join(self._configs["request_timeout_ms"] / 1000)
        if closing.is_alive():
            log.warning("Kafka clients of %s did not close within %d ms; left to end with the process",
                        self._bootstrap, self._configs["request_timeout_ms"])

    def connect_in_background(self, *, sampler: bool = False) -> None:
        """Start making the client (import, bootstrap: connect, API versions) on a daemon thread,
        and with ``sampler`` the record-timestamp reader too; nothing to do when they exist.

        For a caller with other work first (a restart reads the ledger before it asks the cluster,
        a /metrics scrape too): the handshakes' round trips overlap that work instead of following
        it. The first question waits for them under the adapter's lock; a failure of the client is
        kept and raised by that question (the sampler's is met again when it is next made).
        """
        if self._consumer is not None and (self._sampler is not None or not sampler):
            return
        closes = self._closes

        def connect() -> None:
            with self._lock:
                if self._closes != closes:
                    return  # closed before the thread got the lock: nothing to make (or leak)
                try:
                    self._client()
                    if sampler:
                        self._sampler_client()
                except Exception as exc:  # noqa: BLE001 - raised again by the first question
                    if self._consumer is None:
                        self._connect_error = exc

        threading.Thread(target=connect, name="offset-ledger-kafka-connect", daemon=True).start()

    def _client(self) -> Any:
        if self._connect_error is not None:
            failed, self._connect_error = self._connect_error, None
            raise failed
        if self._consumer is None:
            from kafka import KafkaConsumer

            try:
                self._consumer = KafkaConsumer(
                    group_id=None, enable_auto_commit=False, allow_auto_create_topics=False,
                    **self._configs,
                )
            except Exception as exc:
                raise _translate(exc, self._bootstrap) from exc
        return self._consumer

    def _call(self, fn_name: str, *args: Any) -> Any:
        with self._lock:
            consumer = self._client()
            try:
                return getattr(consumer, fn_name)(*args)
            except Exception as exc:
                raise _translate(exc, self._bootstrap) from exc

    # -- topics and partitions

    def all_topics(self) -> set[str]:
        """Every topic the client may see, fresh from the cluster (internal topics excluded)."""
        return {t for t in self._call("topics") if not t.startswith("__")}

    def topics_matching(self, pattern: str) -> list[str]:
        """Topics whose whole name matches ``pattern`` (Java regex subset), like ``subscribePattern``."""
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"invalid topic pattern {pattern!r}: {exc}", pattern=pattern) from exc
        return sorted(t for t in self.all_topics() if regex.fullmatch(t))

    def partitions(self, topics: Sequence[str]) -> dict[str, list[int]]:
        """Current partitions of each existing topic; topics that do not exist are absent."""
        existing = self.all_topics()  # one metadata round trip refreshes every topic at once
        result: dict[str, list[int]] = {}
        for topic in topics:
            if topic in existing:
                parts = self._call("partitions_for_topic", topic) or set()
                result[topic] = sorted(parts)
        return result

    def topic_ids(self, topics: Sequence[str]) -> dict[str, str]:
        """Kafka topic ids (KIP-516) of the existing ``topics``, fresh from the cluster.

        A deleted and re-created topic keeps its name but gets a new id. Topics the broker reports
        no id for (metadata before v10) are absent.
        """
        self.all_topics()  # one metadata round trip; the client keeps the ids it carried
        with self._lock:
            cluster = getattr(self._client(), "_cluster", None)
            lookup = getattr(cluster, "topic_id", None)
            if lookup is None:
                return {}
            out = {}
            for topic in topics:
                found = lookup(topic)
                if found is not None and str(found) != "00000000-0000-0000-0000-000000000000":
                    out[topic] = str(found)
            return out

    # -- offsets

    def watermarks(self, topics: Sequence[str]) -> dict[TopicPartition, Watermarks]:
        """Log-start (first stored) and log-end (next to be written) offset of every partition."""
        return self.snapshot(topics).watermarks

    def snapshot(self, topics: Sequence[str]) -> ClusterSnapshot:
        """Partitions, topic ids and watermarks of ``topics`` from one metadata request and one
        ListOffsets request per leader and kind, all in flight together (see ``kafka_snapshot``)."""
        from kafka import errors as kerr

        with self._lock:
            consumer = self._client()
            try:
                return snapshot(consumer._manager, topics, timeout_ms=self._configs["request_timeout_ms"])
            except kerr.IncompatibleBrokerVersion:
                pass  # a broker before Kafka 2.1 (no ListOffsets v4): the consumer's slower calls below
            except SnapshotError as exc:
                raise KafkaError(f"Kafka request failed: {exc}", bootstrap_servers=self._bootstrap) from exc
            except Exception as exc:
                raise _translate(exc, self._bootstrap) from exc
        return self._snapshot_by_consumer(topics)

    def _snapshot_by_consumer(self, topics: Sequence[str]) -> ClusterSnapshot:
        from kafka import TopicPartition as KTP

        partitions = self.partitions(topics)
        tps = [KTP(t, p) for t, parts in partitions.items() for p in parts]
        starts = self._call("beginning_offsets", tps) if tps else {}
        ends = self._call("end_offsets", tps) if tps else {}
        marks = {TopicPartition(tp.topic, tp.partition): Watermarks(int(starts[tp]), int(ends[tp])) for tp in tps}
        return ClusterSnapshot(partitions, self.topic_ids(list(partitions)), marks)

    def offsets_for_time(self, tps: Sequence[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        """The first offset whose timestamp is >= ``timestamp_ms`` per partition; None when no record is that new."""
        from kafka import TopicPartition as KTP

        if not tps:
            return {}
        found = self._call("offsets_for_times", {KTP(tp.topic, tp.partition): int(timestamp_ms) for tp in tps})
        return {
            TopicPartition(k.topic, k.partition): (None if v is None else int(v.offset))
            for k, v in found.items()
        }

    def read_ranges(self, ranges: Sequence[tuple[str, int, int, int]]) -> dict[tuple[str, int, int, int], Any]:
        """(topic, partition, from, until) ranges read again by a read_committed consumer (``kafka.readable_records``)."""
        try:
            return read_ranges(self._configs, ranges, timeout_ms=int(self._configs["request_timeout_ms"]))
        except Exception as exc:
            raise _translate(exc, self._bootstrap) from exc

    # -- log sizes (the cost of a move)

    def log_sizes(self, topics: Sequence[str]) -> dict[TopicPartition, int]:
        """Bytes each partition's log holds (its largest replica: a lagging follower holds less).

        One DescribeLogDirs request per broker; needs DESCRIBE on the cluster where ACLs are on.
        """
        answers = self._admin_call("describe_log_dirs", list(topics))
        wanted = set(topics)
        sizes: dict[TopicPartition, int] = {}
        for broker in answers or []:
            for result in broker.get("log_dirs", []):
                if _field(result, "error_code"):
                    continue
                for topic in _field(result, "topics") or []:
                    name = _field(topic, "name")
                    if name not in wanted:
                        continue
                    for part in _field(topic, "partitions") or []:
                        if _field(part, "is_future_key"):  # a replica being moved between log dirs
                            continue
                        tp = TopicPartition(name, int(_field(part, "partition_index")))
                        sizes[tp] = max(sizes.get(tp, 0), int(_field(part, "partition_size") or 0))
        return sizes

    # -- record timestamps (time lag)

    def record_timestamps(self, wanted: Iterable[tuple[TopicPartition, int]], *,
                          timeout_ms: int = 3000, rounds: int = 4) -> dict[tuple[TopicPartition, int], int]:
        """Timestamp (epoch ms) of the first record at or after each (partition, offset); absent when none came.

        One consumer without a group (nothing joined, nothing committed) is assigned every
        partition and seeks each to its lowest wanted offset; its fetcher sends one request per
        broker for all partitions it leads, so many partitions cost a few round trips, never one
        per partition. Each fetch returns a run of records, which answers every wanted offset it
        covers (pipelines at different offsets of one partition); further rounds seek to the rest.
        """
        by_key: dict[tuple[str, int], set[int]] = {}
        for tp, offset in wanted:
            by_key.setdefault((tp.topic, tp.partition), set()).add(int(offset))
        if not by_key:
            return {}
        # Our own Fetch per leader, reading only batch and record headers (``kafka/record_times.py``);
        # what it cannot answer goes to the consumer below, which decodes every record it fetches.
        found: dict[tuple[TopicPartition, int], int] = {}
        left = {key: sorted(offsets) for key, offsets in by_key.items()}
        try:
            with self._lock:
                found, left = record_times_by_fetch(self._client()._manager, left, rounds=rounds)
        except Exception as exc:  # noqa: BLE001 - the consumer path below answers (or reports) it
            log.debug("record timestamps by our own fetch failed (%s); the consumer reads them", exc)
        if left:
            found.update(self._record_timestamps_by_consumer(
                [(TopicPartition(t, p), o) for (t, p), offsets in left.items() for o in offsets],
                timeout_ms=timeout_ms, rounds=rounds))
        return found

    def _record_timestamps_by_consumer(self, wanted: Iterable[tuple[TopicPartition, int]], *,
                                       timeout_ms: int, rounds: int) -> dict[tuple[TopicPartition, int], int]:
        from kafka import TopicPartition as KTP

        todo: dict[KTP, set[int]] = {}
        for tp, offset in wanted:
            todo.setdefault(KTP(tp.topic, tp.partition), set()).add(int(offset))
        found: dict[tuple[TopicPartition, int], int] = {}
        if not todo:
            return found
        with self._lock:
            sampler = self._sampler_client()
            deadline = time.monotonic() + timeout_ms / 1000
            try:
                for _ in range(rounds):
                    if not todo or time.monotonic() >= deadline:
                        break
                    sampler.assign(list(todo))
                    # A partition paused in an earlier round stays paused across assign(): without
                    # this, offsets beyond one fetch (max_poll_records) were never read.
                    sampler.resume(*todo)
                    # The subscription's seek: the consumer's checks the partition against a fresh set
                    # of every assigned partition on each call (quadratic; docs/benchmarks.md).
                    seek = getattr(getattr(sampler, "_subscription", None), "seek", None) or sampler.seek
                    for ktp, offsets in todo.items():
                        seek(ktp, min(offsets))
                    waiting = set(todo)
                    while waiting and time.monotonic() < deadline:
                        polled = sampler.poll(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)))
                        for ktp, records in polled.items():
                            if ktp not in waiting or not records:
                                continue
                            waiting.discard(ktp)
                            sampler.pause(ktp)
                            ordered = sorted(records, key=lambda r: r.offset)  # in offset order already
                            offsets_seen = [r.offset for r in ordered]
                            tp = TopicPartition(ktp.topic, ktp.partition)
                            for offset in sorted(todo[ktp]):
                                at = bisect.bisect_left(offsets_seen, offset)  # first record at or after it
                                if at == len(ordered):
                                    break
                                found[(tp, offset)] = int(ordered[at].timestamp)
                                todo[ktp].discard(offset)
                    todo = {k: v for k, v in todo.items() if v and k not in waiting}
            except Exception as exc:
                raise _translate(exc, self._bootstrap) from exc
            finally:
                try:
                    sampler.assign([])
                except Exception:  # noqa: BLE001 - a broken sampler is rebuilt on the next call
                    self._sampler = None
        return found

    def _sampler_client(self) -> Any:
        if self._sampler is None:
            from kafka import KafkaConsumer

            try:
                self._sampler = KafkaConsumer(
                    group_id=None, enable_auto_commit=False, allow_auto_create_topics=False,
                    auto_offset_reset="earliest", max_poll_records=1_000_000,
                    # A small run of records per partition is all we need from each.
                    max_partition_fetch_bytes=64 * 1024, fetch_max_wait_ms=20,
                    # kafka-python checks CRC32C in pure Python unless the optional crc32c package is
                    # installed: seconds per scrape of 1,000 partitions (docs/benchmarks.md). Only a
                    # timestamp is read, TCP checksums the transfer and the broker checked the batch
                    # when it was written; a consumer of the data (Spark) still checks. An explicit
                    # kafka.check.crcs setting wins.
                    **{"check_crcs": False, **self._configs})
            except Exception as exc:
                raise _translate(exc, self._bootstrap) from exc
        return self._sampler


def _close_clients(consumers: Sequence[Any], admin: Any) -> None:
    for consumer in consumers:
        try:
            consumer.close(autocommit=False)
        except Exception:  # noqa: BLE001 - closing a broken client must not mask the real error
            log.debug("error closing Kafka consumer", exc_info=True)
    if admin is not None:
        try:
            admin.close()
        except Exception:  # noqa: BLE001
            log.debug("error closing Kafka admin client", exc_info=True)


def _field(item: Any, name: str) -> Any:
    """A field of a decoded response, as a dict key or an attribute."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)
