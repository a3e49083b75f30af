"""The operator's reads: pipelines, positions, history, lag, topics and the ledger's health.

Verbs over the context ``operate.operations.Operations`` (``history(ops, "orders")``): reads go to the
ledger (``ledger.queries``) and Kafka (``offset_ledger.kafka.adapter``); lag, drift and retention
headroom come from ``operate.lag_insight`` and ``operate.retention_insight`` (their caches are the
context's). The watermark look-ups degrade per topic, so one topic the cluster refuses leaves only
its own partitions without lag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from offset_ledger.errors import KafkaError, UnknownTopic
from offset_ledger.ledger import catalog, queries
from offset_ledger.ledger.activity import last_ends, open_runs, verdict
from offset_ledger.ledger.engine import require_schema
from offset_ledger.ledger.loss_reads import shortfall_findings
from offset_ledger.ledger.sink_outputs import outputs_by_batch
from offset_ledger.operate.audit import findings_counts
from offset_ledger.operate.answers import HistoryPage, PartitionLag, PipelineSummary, iso_utc
from offset_ledger.operate.answers import legacy_topic_answer, topic_answer
from offset_ledger.operate.inputs import check_limit, check_topic, decode_cursor, encode_cursor
from offset_ledger.operate.known import require_topics, require_visible as visible_or_unknown
from offset_ledger.operate.lag_insight import positions_and_window, status_window
from offset_ledger.operate.loss_status import per_pipeline
from offset_ledger.operate.operations import Operations, resolve_group
from offset_ledger.operate.retention_insight import pipeline_headroom
from offset_ledger.operate.visibility import current_scope, unscoped
from offset_ledger.rules.model import Position, TopicPartition, Watermarks
from offset_ledger.rules.status import overall_status, with_lost_records

if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter

log = logging.getLogger("offset_ledger.operate.operations")


# -- checks


def ping(ops: Operations) -> None:
    """Raise LedgerUnavailable when the ledger database cannot be reached."""
    with ops.reading() as conn:
        catalog.ping(conn)


def schema_revision(ops: Operations) -> str:
    """The ledger's schema revision (LedgerWithoutSchema / LedgerUnavailable when it has none or is away)."""
    return require_schema(ops.reads)


def require_visible(ops: Operations, pipeline: str) -> None:
    """UnknownPipeline, as for a name the ledger does not know, when the caller's scope hides ``pipeline``."""
    with ops.reading() as conn:
        visible_or_unknown(conn, pipeline)


# -- reads


def pipeline_answers(ops: Operations, *, with_lag: bool = True) -> list[dict[str, Any]]:
    """The pipelines list as every face answers it: each summary with ``findings`` (recorded, a repeated
    one once: the CLI's FINDINGS column) and ``findingsAttention`` (those that need a look, not
    first_run / new_partition: the console colours only these)."""
    rows = [p.to_dict() for p in list_pipelines(ops, with_lag=with_lag)]
    counts = findings_counts(ops)
    attention = findings_counts(ops, informational=False)
    for row in rows:
        row["findings"] = counts.get((row["pipeline"], row["consumerGroup"]), 0)
        row["findingsAttention"] = attention.get((row["pipeline"], row["consumerGroup"]), 0)
    return rows


def list_pipelines(ops: Operations, *, with_lag: bool = True) -> list[PipelineSummary]:
    """Every pipeline with state (running/stopped), last batch time and total lag.

    Concurrent callers share one computation that started after they all arrived
    (``offset_ledger.rules.coalesce``): dashboards polling together cost one read, none gets an older answer.
    """
    # Shared by every caller, so computed for every pipeline and cut to each caller's scope after.
    scope = current_scope()
    every = ops.coalesce.run(("pipelines", with_lag), lambda: unscoped(_list_pipelines, ops, with_lag))
    return every if scope.unrestricted else [s for s in every if scope.allows(s.pipeline)]


def _list_pipelines(ops: Operations, with_lag: bool) -> list[PipelineSummary]:
    # Every ledger read in one connection before Kafka is asked (round trips dominate this request).
    facts: dict[Any, Any] = {}
    with ops.reading() as conn:
        rows = queries.pipeline_summaries(conn)
        now = datetime.now(timezone.utc)
        open_by_group = open_runs(conn, now=now)
        ends = last_ends(conn)
        pos: dict[tuple[str, str], list[Position]] = {}
        if with_lag and rows and ops.has_kafka:  # without Kafka there is no lag to compute
            pos, facts = positions_and_window_now(conn)
        shortfalls = shortfall_findings(conn, ops.losses.seen)
    lost = per_pipeline(records_lost(ops, shortfalls))
    marks = watermarks_or_none(ops, {p.topic for ps in pos.values() for p in ps}) if pos else None
    statuses, headrooms = _statuses(ops, rows, open_by_group, pos, marks, facts) if marks is not None else ({}, {})
    out = []
    for r in rows:
        key = (r["pipeline"], r["consumer_group"])
        lag: int | None = None
        if marks is not None:
            lags = [_lag(p, marks.get(p.tp)) for p in pos.get(key, [])]
            known = [x for x in lags if x is not None]
            lag = sum(known) if known else None
        acts = tuple(open_by_group.get(key, []))
        active = tuple(a.run_id for a in acts if a.state == "active")
        gen = None if r["generation_id"] is None else {
            "id": r["generation_id"], "generation": r["generation_number"],
            "app_version": r["generation_app_version"], "location": r["generation_location"]}
        foreign = tuple(a.run_id for a in acts if a.state == "active" and gen is not None
                        and a.generation_id != gen["id"])
        judged = verdict(acts, ends.get(key), now=now)
        out.append(PipelineSummary(
            r["pipeline"], r["consumer_group"], judged.state, active,
            int(r["partitions"] or 0), r["last_batch_time"], r["last_batch_id"], lag,
            acts, gen, foreign, with_lost_records(statuses.get(key), lost.get(key, 0)), headrooms.get(key),
            state_reason=judged.reason, state_run_id=judged.run_id, last_event_at=judged.last_event_at,
            records_lost=lost.get(key, 0),
        ))
    return out


def records_lost(ops: Operations, shortfalls: Sequence[Any] = ()) -> dict[tuple[str, str, str, int], int]:
    """Unexplained lost records per (pipeline, group, topic, partition), ``shortfalls`` judged first."""
    return ops.losses.add(shortfalls, ops.kafka if ops.has_kafka else None)


def _statuses(ops: Operations, rows: list[dict[str, Any]], open_by_group: Mapping[tuple[str, str], Any],
              pos: Mapping[tuple[str, str], list[Position]],
              marks: Mapping[TopicPartition, Watermarks],
              facts: Mapping[Any, Any]) -> tuple[dict[tuple[str, str], str | None], dict[tuple[str, str], Any]]:
    """Overall status per pipeline (no time lag or drift needed for it: no extra Kafka round trips), and
    retention headroom per pipeline (its reads are cached: ``offset_ledger.operate.retention_insight``)."""
    parts = [(pipeline, group, PartitionLag(p.topic, p.partition, p.next_offset,
                                            marks[p.tp].log_start_offset if p.tp in marks else None,
                                            marks[p.tp].log_end_offset if p.tp in marks else None))
             for (pipeline, group), ps in pos.items() for p in ps]
    enriched = enrich(ops, parts, open_by_group, facts, kafka=False)
    by: dict[tuple[str, str], list[Any]] = {}
    for pipeline, group, x in enriched:
        by.setdefault((pipeline, group), []).append(x.status)
    return {k: overall_status(v) for k, v in by.items()}, pipeline_headroom(with_headroom(ops, enriched))


def with_headroom(ops: Operations, parts: list[tuple[str, str, PartitionLag]]) -> list[tuple[str, str, PartitionLag]]:
    """Retention headroom for ``parts`` (``offset_ledger.operate.retention_insight``), reusing time lag's reads."""
    if not ops.has_kafka:
        return parts
    return ops.retention_insight.apply(ops.kafka, parts, lambda xs: ops.lag_insight.timestamps(ops.kafka, xs))


def enrich(ops: Operations, parts: list[tuple[str, str, PartitionLag]], open_by_group: Mapping[tuple[str, str], Any],
           facts: Mapping[Any, Any], *, kafka: bool) -> list[tuple[str, str, PartitionLag]]:
    """Time lag, drift and status for ``parts`` (``offset_ledger.operate.lag_insight``), ``facts`` read with the positions."""
    active = {k: any(a.state == "active" for a in acts) for k, acts in open_by_group.items()}
    return ops.lag_insight.enrich(ops.kafka if kafka and ops.has_kafka else None, parts, facts, active,
                               window=status_window())


def positions_and_window_now(conn: Connection, pipeline: str | None = None, group: str | None = None,
                             ) -> tuple[dict[tuple[str, str], list[Position]], dict[Any, Any]]:
    """Positions and the status window's facts (``lag_insight.positions_and_window``) as of now."""
    return positions_and_window(conn, datetime.now(timezone.utc) - status_window(), pipeline, group)


def current_offsets(ops: Operations, pipeline: str, consumer_group: str | None = None) -> dict[str, dict[str, int]]:
    """``{"topic": {"0": next_offset}}``: the legacy getCurrentOffsets answer."""
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        positions = queries.current_positions(conn, pipeline, group)
    out: dict[str, dict[str, int]] = {}
    for p in positions:
        out.setdefault(p.topic, {})[str(p.partition)] = p.next_offset
    return out


def positions(ops: Operations, pipeline: str, consumer_group: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """(consumer group, positions with what placed them)."""
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        return group, queries.position_details(conn, pipeline, group)


def history(
    ops: Operations, pipeline: str, consumer_group: str | None = None, *, topic: str | None = None,
    since: datetime | None = None, until: datetime | None = None, limit: int = 100,
    cursor: str | None = None,
) -> HistoryPage:
    """Committed batches newest first, filtered by topic and [since, until), paged by cursor."""
    check_limit(limit)
    if topic is not None:
        check_topic(topic)
    after = decode_cursor(cursor) if cursor else None
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        if topic is not None:
            require_topics(conn, pipeline, group, [topic])
        rows = queries.batch_history(conn, pipeline, group, topic=topic, since=since, until=until,
                                     limit=limit + 1, after=after)
        more = len(rows) > limit
        rows = rows[:limit]

        wrote = outputs_by_batch(conn, pipeline, [(r["query_id"], r["batch_id"]) for r in rows])
    next_cursor = encode_cursor(rows[-1]["batch_time"], rows[-1]["id"]) if more else None
    items = tuple({
        "queryId": r["query_id"], "runId": r["run_id"], "batchId": r["batch_id"],
        "batchTime": iso_utc(r["batch_time"]), "recordedAt": iso_utc(r["recorded_at"]),
        "inputRows": r["input_rows"],
        "watermark": iso_utc(r["watermark"]), "eventTimeMin": iso_utc(r["event_time_min"]),
        "eventTimeMax": iso_utc(r["event_time_max"]), "stateRowsTotal": r["state_rows_total"],
        "stateRowsUpdated": r["state_rows_updated"],
        "stateRowsDroppedByWatermark": r["state_rows_dropped_by_watermark"],
        "ranges": [{"sourceIndex": x["source_index"], "topic": x["topic"], "partition": x["partition"],
                    "fromOffset": x["from_offset"], "untilOffset": x["until_offset"]} for x in r["ranges"]],
        # What the batch wrote through a transactional sink (offset_ledger.sinks); [] otherwise.
        "outputs": [{"sink": o["sink"], "kind": o["kind"], "target": o["target"], "sequence": o["sequence"],
                     "rowCount": o["row_count"], "tableVersion": o["table_version"]}
                    for o in wrote.get((r["query_id"], r["batch_id"]), ())],
    } for r in rows)
    return HistoryPage(items, next_cursor)


def lag(ops: Operations, pipeline: str, consumer_group: str | None = None) -> tuple[str, list[PartitionLag]]:
    """(consumer group, lag per partition): every current partition of the pipeline's topics."""
    with ops.reading() as conn:  # every ledger read before Kafka is asked
        group = resolve_group(conn, pipeline, consumer_group)
        by_group, facts = positions_and_window_now(conn, pipeline, group)
        runs = open_runs(conn, pipeline, group)
    positions = by_group.get((pipeline, group), [])
    marks = watermarks_per_topic(ops, sorted({p.topic for p in positions}))
    by_tp = {p.tp: p.next_offset for p in positions}
    out = []
    for tp in sorted(set(by_tp) | set(marks)):
        m = marks.get(tp)
        out.append(PartitionLag(tp.topic, tp.partition, by_tp.get(tp),
                                m.log_start_offset if m else None, m.log_end_offset if m else None))
    enriched = with_headroom(ops, enrich(ops, [(pipeline, group, x) for x in out], runs, facts, kafka=True))
    return group, [x for _, _, x in enriched]


def topic_details(ops: Operations, topic: str) -> dict[str, Any]:
    """``{"name": T, "partitions": {"0": {"logStartOffset": a, "logEndOffset": b}}}``: the resource route's answer."""
    return topic_answer(topic, topic_watermarks(ops.kafka, topic))


def legacy_topic_details(ops: Operations, topic: str) -> dict[str, Any]:
    """The legacy getTopicDetails answer, kept exactly: ``lastOffset`` is the log-end offset."""
    return legacy_topic_answer(topic, topic_watermarks(ops.kafka, topic))


def describe_topic(kafka: KafkaAdapter, topic: str) -> dict[str, Any]:
    """The topic's answer from Kafka alone (the CLI's ``topic`` needs no ledger)."""
    return topic_answer(topic, topic_watermarks(kafka, topic))


def topic_watermarks(kafka: KafkaAdapter, topic: str) -> dict[TopicPartition, Watermarks]:
    """Log-start and log-end offsets of every partition of ``topic``; UnknownTopic when it does not exist."""
    check_topic(topic)
    seen = kafka.snapshot([topic])
    if topic not in seen.partitions:
        raise UnknownTopic(topic)
    return dict(seen.watermarks)


def watermarks_or_none(ops: Operations, topics: set[str]) -> dict[TopicPartition, Watermarks] | None:
    # Listing pipelines and metrics degrade to "lag unknown" rather than failing with Kafka down.
    if not ops.has_kafka:
        return None
    if not topics:
        return {}
    key = frozenset(topics)
    with ops.marks_lock:
        cached = ops.marks_cache
        if cached is not None and cached[1] >= key and time.monotonic() - cached[0] < ops.lag_cache_seconds:
            return cached[2]
        try:
            marks = watermarks_per_topic(ops, sorted(topics))
        except KafkaError as exc:
            log.warning("lag unavailable: %s", exc.message)
            return None
        ops.marks_cache = (time.monotonic(), key, marks)
        return marks


def watermarks_per_topic(ops: Operations, topics: list[str]) -> dict[TopicPartition, Watermarks]:
    """Watermarks of ``topics`` in one request; when the cluster refuses it (not unreachable: one
    topic it rejects, such as a recorded name Kafka does not accept), topic by topic, so that one
    bad topic leaves only its own partitions without log offsets."""
    try:
        return ops.kafka.watermarks(topics)
    except KafkaError as exc:
        if exc.retriable or len(topics) < 2:
            raise
        first = exc
    marks: dict[TopicPartition, Watermarks] = {}
    failed = []
    for topic in topics:
        try:
            marks.update(ops.kafka.watermarks([topic]))
        except KafkaError as exc:
            if exc.retriable:
                raise
            failed.append(topic)
    if len(failed) == len(topics):
        raise first
    log.warning("no watermarks for topic(s) %s: %s", ", ".join(map(repr, failed)), first.message)
    return marks


def _lag(p: Position, m: Watermarks | None) -> int | None:
    return None if m is None else max(0, m.log_end_offset - p.next_offset)

