"""The /metrics read, a verb over ``operate.operations.Operations``: positions, lag and last batch per
pipeline, and listener health (``metrics(ops)``). The watermark look-ups (``operate.reads``) degrade
per topic, so one topic the cluster refuses leaves only its own series without lag.
"""


from __future__ import annotations

from typing import Any

from offset_ledger.ledger import queries
from offset_ledger.ledger.activity import open_runs
from offset_ledger.operate.answers import (
    MetricsSnapshot,
    PartitionLag,
)
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.reads import (
    enrich,
    list_pipelines,
    positions_and_window_now,
    records_lost,
    watermarks_or_none,
    with_headroom,
)
from offset_ledger.operate.retention_insight import pipeline_headroom
from offset_ledger.operate.visibility import current_scope, unscoped
from offset_ledger.rules.model import TopicPartition, Watermarks
from offset_ledger.rules.scope import PipelineScope
from offset_ledger.rules.status import overall_status, with_lost_records


def visible_metrics(snap: MetricsSnapshot, scope: PipelineScope) -> MetricsSnapshot:
    """``snap`` with only the series of pipelines inside ``scope`` (listeners that named none are hidden)."""
    if scope.unrestricted:
        return snap
    from dataclasses import replace

    return replace(
        snap, pipelines=tuple(s for s in snap.pipelines if scope.allows(s.pipeline)),
        partitions=tuple(x for x in snap.partitions if scope.allows(x[0])),
        listeners=tuple(r for r in snap.listeners if scope.allows(r["pipeline"])),
        records_lost=tuple(x for x in snap.records_lost if scope.allows(x[0])),
        resets=tuple(x for x in snap.resets if scope.allows(x[0])),
        findings=tuple(x for x in snap.findings if scope.allows(x[0])))


def metrics(ops: Operations) -> MetricsSnapshot:
    """Positions, lag and last batch per pipeline, plus listener health, for /metrics.

    Concurrent scrapes (a Prometheus pair) share one computation that started after they all
    arrived (``offset_ledger.rules.coalesce``), as the pipelines list does.
    """
    # Shared by every scrape, so computed for every pipeline and cut to each caller's scope after.
    return visible_metrics(ops.coalesce.run(("metrics",), lambda: unscoped(_metrics, ops)), current_scope())


def _metrics(ops: Operations) -> MetricsSnapshot:
    connect = getattr(ops.kafka, "connect_in_background", None) if ops.has_kafka else None
    if connect is not None:
        # A first scrape: the client's handshake overlaps the ledger reads below. Not the
        # timestamp consumer's: record timestamps come from the client's own Fetch now
        # (kafka/record_times.py); that consumer is made only for what the Fetch leaves.
        connect()
    summaries = list_pipelines(ops, with_lag=False)
    with ops.reading() as conn:
        pos, facts = positions_and_window_now(conn)  # the status needs the facts read with the positions
        listeners = queries.listener_health_rows(conn)
        open_by_group = open_runs(conn)
        # Small grouped reads (resets are few; findings one row per kind), one round trip.
        resets, kinds = queries.resets_and_findings(conn)
    kafka_up: bool | None = None
    marks: dict[TopicPartition, Watermarks] = {}
    if ops.has_kafka:
        got = watermarks_or_none(ops, {p.topic for ps in pos.values() for p in ps})
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

        parts = with_headroom(ops, enrich(ops, parts, open_by_group, facts, kafka=True))
        by: dict[tuple[str, str], list[Any]] = {}
        for pipeline, group, x in parts:
            by.setdefault((pipeline, group), []).append(x.status)
        headrooms = pipeline_headroom(parts)
        summaries = [replace(s, status=with_lost_records(overall_status(by.get((s.pipeline, s.consumer_group), [])),
                                                          s.records_lost),
                             headroom=headrooms.get((s.pipeline, s.consumer_group)))
                     for s in summaries]
    lost = records_lost(ops)  # judged by list_pipelines above
    return MetricsSnapshot(tuple(summaries), tuple(parts), tuple(listeners), kafka_up,
                           records_lost=tuple((*k, n) for k, n in sorted(lost.items())),
                           resets=tuple(sorted(resets, key=lambda x: x[:2])), findings=tuple(sorted(kinds)))
