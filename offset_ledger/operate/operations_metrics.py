"""``Operations``' /metrics read: positions, lag and last batch per pipeline, and listener health.

A mixin of ``offset_ledger.operate.operations.Operations`` (the attributes it uses are that class's): one
job, kept apart from the verbs. The watermark look-ups degrade per topic, so one topic the cluster
refuses leaves only its own series without lag.
"""


from __future__ import annotations

import logging
import time
from typing import Any

from offset_ledger.errors import (
    KafkaError,
)
from offset_ledger.ledger import queries
from offset_ledger.ledger.activity import open_runs
from offset_ledger.operate.answers import (
    MetricsSnapshot,
    PartitionLag,
)
from offset_ledger.operate.visibility import current_scope, unscoped
from offset_ledger.rules.model import TopicPartition, Watermarks
from offset_ledger.rules.scope import PipelineScope


def visible_metrics(snap: MetricsSnapshot, scope: PipelineScope) -> MetricsSnapshot:
    """``snap`` with only the series of pipelines inside ``scope`` (listeners that named none are hidden)."""
    if scope.unrestricted:
        return snap
    from dataclasses import replace

    return replace(
        snap, pipelines=tuple(s for s in snap.pipelines if scope.allows(s.pipeline)),
        partitions=tuple(x for x in snap.partitions if scope.allows(x[0])),
        listeners=tuple(r for r in snap.listeners if scope.allows(r["pipeline"])),
        records_lost=tuple(x for x in snap.records_lost if scope.allows(x[0])))

log = logging.getLogger("offset_ledger.operate.operations")


class MetricsReads:
    """What ``Operations.metrics`` needs: ``_db``, ``_coalesce``, ``list_pipelines``, ``_enrich``, ``_headroom``,
    ``records_lost``, ``kafka`` and ``has_kafka``."""


    def metrics(self) -> MetricsSnapshot:
        """Positions, lag and last batch per pipeline, plus listener health, for /metrics.

        Concurrent scrapes (a Prometheus pair) share one computation that started after they all
        arrived (``offset_ledger.rules.coalesce``), as the pipelines list does.
        """
        # Shared by every scrape, so computed for every pipeline and cut to each caller's scope after.
        return visible_metrics(self._coalesce.run(("metrics",), lambda: unscoped(self._metrics)), current_scope())

    def _metrics(self) -> MetricsSnapshot:
        connect = getattr(self.kafka, "connect_in_background", None) if self.has_kafka else None
        if connect is not None:
            # A first scrape: the client's handshake overlaps the ledger reads below. Not the
            # timestamp consumer's: record timestamps come from the client's own Fetch now
            # (kafka/record_times.py); that consumer is made only for what the Fetch leaves.
            connect()
        summaries = self.list_pipelines(with_lag=False)
        with self._db() as conn:
            pos, facts = self._positions_and_window(conn)  # the status needs the facts read with the positions
            listeners = queries.listener_health_rows(conn)
            open_by_group = open_runs(conn)
        kafka_up: bool | None = None
        marks: dict[TopicPartition, Watermarks] = {}
        if self.has_kafka:
            got = self._watermarks_or_none({p.topic for ps in pos.values() for p in ps})
            kafka_up = got is not None
            marks = got or {}
        parts = []
        for (pipeline, group), ps in sorted(pos.items()):
            for p in ps:
                m = marks.get(p.tp)
                parts.append((pipeline, group, PartitionLag(p.topic, p.partition, p.next_offset,
                                                            m.log_start_offset if m else None,
                                                            m.log_end_offset if m else None)))
        if kafka_up:
            from dataclasses import replace

            from offset_ledger.operate.retention_insight import pipeline_headroom
            from offset_ledger.rules.status import overall_status, with_lost_records

            parts = self._headroom(self._enrich(parts, open_by_group, facts, kafka=True))
            by: dict[tuple[str, str], list[Any]] = {}
            for pipeline, group, x in parts:
                by.setdefault((pipeline, group), []).append(x.status)
            headrooms = pipeline_headroom(parts)
            summaries = [replace(s, status=with_lost_records(overall_status(by.get((s.pipeline, s.consumer_group), [])),
                                                              s.records_lost),
                                 headroom=headrooms.get((s.pipeline, s.consumer_group)))
                         for s in summaries]
        lost = self.records_lost()  # judged by list_pipelines above
        return MetricsSnapshot(tuple(summaries), tuple(parts), tuple(listeners), kafka_up,
                               records_lost=tuple((*k, n) for k, n in sorted(lost.items())))

    def _watermarks_or_none(self, topics: set[str]) -> dict[TopicPartition, Watermarks] | None:
        # Listing pipelines and metrics degrade to "lag unknown" rather than failing with Kafka down.
        if not self.has_kafka:
            return None
        if not topics:
            return {}
        key = frozenset(topics)
        with self._marks_lock:
            cached = self._marks_cache
            if cached is not None and cached[1] >= key and time.monotonic() - cached[0] < self.lag_cache_seconds:
                return cached[2]
            try:
                marks = self._watermarks_per_topic(sorted(topics))
            except KafkaError as exc:
                log.warning("lag unavailable: %s", exc.message)
                return None
            self._marks_cache = (time.monotonic(), key, marks)
            return marks


    def _watermarks_per_topic(self, topics: list[str]) -> dict[TopicPartition, Watermarks]:
        """Watermarks of ``topics`` in one request; when the cluster refuses it (not unreachable: one
        topic it rejects, such as a recorded name Kafka does not accept), topic by topic, so that one
        bad topic leaves only its own partitions without log offsets."""
        try:
            return self.kafka.watermarks(topics)
        except KafkaError as exc:
            if exc.retriable or len(topics) < 2:
                raise
            first = exc
        marks: dict[TopicPartition, Watermarks] = {}
        failed = []
        for topic in topics:
            try:
                marks.update(self.kafka.watermarks([topic]))
            except KafkaError as exc:
                if exc.retriable:
                    raise
                failed.append(topic)
        if len(failed) == len(topics):
            raise first
        log.warning("no watermarks for topic(s) %s: %s", ", ".join(map(repr, failed)), first.message)
        return marks
