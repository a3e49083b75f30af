"""Retention headroom per partition: how long until retention may delete what a pipeline has not read.

``RetentionInsight.apply`` adds ``offset_ledger.rules.retention.headroom`` to PartitionLag rows
whose watermarks are known. What it asks the cluster, and how often:

- each topic's retention settings (one DescribeConfigs for every topic not cached), kept for
  ``CONFIG_TTL`` seconds: settings change rarely, and a change shows within a minute;
- the timestamp of the record at each position, only for partitions with something unread on a
  topic that deletes by age or size, through ``LagInsight.timestamps`` (the same read and the same
  (partition, offset) cache as time lag: where time lag was just read, this costs nothing);
- partition sizes (``KafkaAdapter.log_sizes``: one DescribeLogDirs per broker), only for topics with
  a ``retention.bytes`` limit, kept for ``SIZE_TTL`` seconds.

No state beyond those caches: the append rate for the size bound is the average over the unread
span (``rules.retention``), not samples kept in this process. A read that fails leaves the
partitions it concerns without a figure (status unknown) and is logged; it never fails the caller.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from offset_ledger.config import settings
from offset_ledger.errors import KafkaError
from offset_ledger.kafka.retention_reads import topic_retention
from offset_ledger.rules.durations import parse_duration
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.retention import Headroom, PartitionRetention, RetentionSettings, headroom, worst

if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter
    from offset_ledger.operate.answers import PartitionLag

log = logging.getLogger(__name__)

CONFIG_TTL = 60.0
SIZE_TTL = 15.0

Rows = Sequence[tuple[str, str, "PartitionLag"]]
Timestamps = Callable[[Sequence["PartitionLag"]], Mapping[tuple[str, int, int], int]]


def warn_seconds() -> float:
    """``OFFSET_LEDGER_RETENTION_WARN`` (default 1h) in seconds."""
    return parse_duration(settings().retention_warn, "OFFSET_LEDGER_RETENTION_WARN").total_seconds()


class RetentionInsight:
    """Adds retention headroom to PartitionLag rows; thread-safe, keeps short-lived caches."""

    def __init__(self, config_ttl: float = CONFIG_TTL, size_ttl: float = SIZE_TTL) -> None:
        self._lock = threading.Lock()
        self._config_ttl = config_ttl
        self._size_ttl = size_ttl
        self._configs: dict[str, tuple[float, RetentionSettings | None]] = {}
        self._sizes: tuple[float, frozenset[str], dict[TopicPartition, int]] | None = None

    def apply(self, kafka: KafkaAdapter, rows: Rows, timestamps: Timestamps, *, now_ms: int | None = None,
              warn: float | None = None) -> list[tuple[str, str, PartitionLag]]:
        """``rows`` with ``headroom`` set (``offset_ledger.rules.retention.Headroom``)."""
        warn = warn_seconds() if warn is None else warn
        at_risk = [x for _, _, x in rows if _unread(x)]
        configs = self._settings(kafka, sorted({x.topic for x in at_risk}))
        limited = [x for x in at_risk if (s := configs.get(x.topic)) is not None and (s.time_limited or s.size_limited)]
        stamps = timestamps(limited) if limited else {}
        sizes = self._partition_sizes(kafka, sorted({x.topic for x in limited if configs[x.topic].size_limited}))
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        out = []
        for pipeline, group, x in rows:
            tp = TopicPartition(x.topic, x.partition)
            h = headroom(PartitionRetention(
                x.next_offset, x.log_start_offset, x.log_end_offset, configs.get(x.topic), now_ms,
                None if x.next_offset is None else stamps.get((x.topic, x.partition, x.next_offset)),
                sizes.get(tp)), warn)
            # The constructor, not dataclasses.replace (as LagInsight.enrich: this runs for every partition).
            out.append((pipeline, group, type(x)(x.topic, x.partition, x.next_offset, x.log_start_offset,
                                                 x.log_end_offset, x.lag_seconds, x.committed_offset, x.status, h)))
        return out

    def _settings(self, kafka: KafkaAdapter, topics: list[str]) -> dict[str, RetentionSettings]:
        now = time.monotonic()
        with self._lock:
            missing = [t for t in topics if t not in self._configs or self._configs[t][0] <= now]
        if missing:
            try:
                found: dict[str, RetentionSettings] | None = topic_retention(kafka, missing)
            except KafkaError as exc:
                log.warning("retention settings unavailable: %s", exc.message)
                found = None
            except Exception as exc:  # noqa: BLE001 - headroom is extra; its absence must not fail a read
                log.warning("retention settings unavailable: %r", exc)
                found = None
            if found is not None:
                with self._lock:
                    if len(self._configs) > 10_000:
                        self._configs.clear()
                    for t in missing:
                        self._configs[t] = (now + self._config_ttl, found.get(t))
        with self._lock:
            return {t: got for t in topics if t in self._configs and (got := self._configs[t][1]) is not None}

    def _partition_sizes(self, kafka: KafkaAdapter, topics: list[str]) -> dict[TopicPartition, int]:
        if not topics:
            return {}
        key = frozenset(topics)
        with self._lock:
            cached = self._sizes
            if cached is not None and cached[1] >= key and time.monotonic() - cached[0] < self._size_ttl:
                return cached[2]
        try:
            sizes = kafka.log_sizes(topics)
        except KafkaError as exc:
            log.warning("partition sizes unavailable: %s", exc.message)
            return {}
        except Exception as exc:  # noqa: BLE001
            log.warning("partition sizes unavailable: %r", exc)
            return {}
        with self._lock:
            self._sizes = (time.monotonic(), key, sizes)
        return sizes


def _unread(x: PartitionLag) -> bool:
    """Something unread and still in the log: the only case whose headroom needs the cluster's settings."""
    return (x.next_offset is not None and x.log_start_offset is not None and x.log_end_offset is not None
            and x.log_start_offset <= x.next_offset < x.log_end_offset)


def pipeline_headroom(rows: Rows) -> dict[tuple[str, str], Headroom]:
    """Per (pipeline, consumer group): its most severe partition headroom (``rules.retention.worst``)."""
    by: dict[tuple[str, str], list[Headroom]] = {}
    for pipeline, group, x in rows:
        if x.headroom is not None:
            by.setdefault((pipeline, group), []).append(x.headroom)
    return {k: w for k, hs in by.items() if (w := worst(hs)) is not None}
