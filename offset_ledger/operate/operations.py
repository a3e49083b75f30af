"""What operators can do, as plain functions: the REST API and the CLI are two faces over these.

No HTTP or CLI code here. Reads go to the ledger (``ledger.queries``) and Kafka
(``offset_ledger.kafka.adapter``); resets are planned by ``offset_ledger.rules.resets`` (pure) and written by
``ledger.reset_store`` (one transaction). Database driver errors are translated into
``LedgerUnavailable`` / ``LedgerError`` here, so callers only ever see ``offset_ledger.errors``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.errors import (
    AmbiguousConsumerGroup,
    ConfigError,
    InvalidInput,
    UnknownConsumerGroup,
    UnknownTopic,
)
from offset_ledger.ledger import queries
from offset_ledger.ledger.activity import last_ends, open_runs, verdict
from offset_ledger.ledger.engine import read_engine, translate_db_error
from offset_ledger.ledger.loss_reads import shortfall_findings
from offset_ledger.operate.answers import (  # noqa: F401 - re-exported: the faces import them from here
    HistoryPage,
    MetricsSnapshot,
    PartitionLag,
    PipelineSummary,
    ResetOutcome,
    iso_utc,
)
from offset_ledger.operate.inputs import (  # noqa: F401 - re-exported: the faces import them from here
    check_name,
    check_reason,
    check_topic,
    decode_cursor,
    encode_cursor,
    parse_timestamp,
    request_from_legacy_body,
    scope_from_specs,
    to_epoch_ms,
)
from offset_ledger.rules.coalesce import Coalescer
from offset_ledger.rules.model import Position, TopicPartition, Watermarks
from offset_ledger.rules.resets import (
    PartitionReset,
)
from offset_ledger.rules.status import with_lost_records

if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter

from offset_ledger.operate.loss_status import per_pipeline
from offset_ledger.operate.operations_metrics import MetricsReads
from offset_ledger.operate.reset_operations import ResetOperations
from offset_ledger.operate.visibility import current_scope, unscoped

log = logging.getLogger(__name__)

# The values returned to the faces live in offset_ledger.operate.answers, checked input in offset_ledger.operate.inputs.


def resolve_group(conn: Connection, pipeline: str, consumer_group: str | None = None) -> str:
    """The consumer group to use: the one given (it must be in the ledger), else the pipeline's only one."""
    from offset_ledger.operate.known import require_pipeline

    check_name("pipeline", pipeline)
    groups = require_pipeline(conn, pipeline)  # UnknownPipeline naming the pipelines that exist
    if consumer_group is not None:
        check_name("consumer group", consumer_group)
        if consumer_group not in groups:
            raise UnknownConsumerGroup(pipeline, consumer_group, groups)
        return consumer_group
    if len(groups) == 1:
        return groups[0]
    # Guessing (say, the group named like the pipeline) would show or reset the wrong positions.
    raise AmbiguousConsumerGroup(pipeline, groups)


# -- the operations -------------------------------------------------------------------------


class Operations(ResetOperations, MetricsReads):
    """The operator's verbs over one ledger and one Kafka cluster; thread-safe, reusable."""

    def __init__(
        self, engine: Engine, *, bootstrap_servers: str | None = None,
        kafka_options: Mapping[str, Any] | None = None, kafka: KafkaAdapter | None = None,
        kafka_timeout_ms: int = 10_000, lag_cache_seconds: float = 2.0,
    ) -> None:
        self.engine = engine
        self._reads = read_engine(engine)
        self._coalesce = Coalescer()
        self._bootstrap = bootstrap_servers
        self._kafka_options = dict(kafka_options or {})
        self._kafka = kafka
        # Bounds how long a request waits for an unreachable cluster before answering 503.
        self._kafka_timeout_ms = kafka_timeout_ms
        # Lag in the pipelines list and /metrics may be this old; resets and /lag always ask Kafka.
        self.lag_cache_seconds = lag_cache_seconds
        self._marks_cache: tuple[float, frozenset[str], dict[TopicPartition, Watermarks]] | None = None
        self._marks_lock = threading.Lock()
        from offset_ledger.operate.lag_insight import LagInsight

        self._insight = LagInsight()
        from offset_ledger.operate.retention_insight import RetentionInsight

        self._retention = RetentionInsight()
        from offset_ledger.operate.loss_status import LossBook

        self._losses = LossBook()  # records lost per partition (issue 41), judged once per finding

    @classmethod
    def connect(
        cls, dsn: str | None = None, bootstrap_servers: str | None = None,
        kafka_options: Mapping[str, Any] | None = None,
    ) -> Operations:
        """Operations over ``dsn`` and ``bootstrap_servers`` (defaults: OFFSET_LEDGER_* settings)."""
        from offset_ledger.config import settings
        from offset_ledger.ledger.engine import make_engine

        s = settings()
        return cls(make_engine(dsn), bootstrap_servers=bootstrap_servers or s.bootstrap_servers,
                   kafka_options=kafka_options)

    @property
    def kafka(self) -> KafkaAdapter:
        """The Kafka adapter (created lazily; ConfigError when no bootstrap servers are set)."""
        if self._kafka is None:
            if not self._bootstrap:
                raise ConfigError("no Kafka bootstrap servers: pass --bootstrap-servers or set "
                                  "OFFSET_LEDGER_BOOTSTRAP_SERVERS")
            from offset_ledger.kafka.adapter import KafkaAdapter

            self._kafka = KafkaAdapter(self._bootstrap, self._kafka_options,
                                       request_timeout_ms=self._kafka_timeout_ms)
        return self._kafka

    @property
    def has_kafka(self) -> bool:
        return self._kafka is not None or bool(self._bootstrap)

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
        self.engine.dispose()
        if self._reads is not self.engine:
            self._reads.dispose()

    @contextmanager
    def _db(self) -> Iterator[Connection]:
        """A connection for reads (autocommit on PostgreSQL, see ``read_engine``); writes use ``engine.begin()``."""
        try:
            with self._reads.connect() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, "reading") from exc

    # -- checks

    def ping(self) -> None:
        """Raise LedgerUnavailable when the ledger database cannot be reached."""
        from sqlalchemy import text

        with self._db() as conn:
            conn.execute(text("SELECT 1"))

    def schema_revision(self) -> str:
        """The ledger's schema revision (LedgerWithoutSchema / LedgerUnavailable when it has none or is away)."""
        from offset_ledger.ledger.engine import require_schema

        return require_schema(self._reads)

    def resolve_group(self, conn: Connection, pipeline: str, consumer_group: str | None = None) -> str:
        """The consumer group to use (``resolve_group``)."""
        return resolve_group(conn, pipeline, consumer_group)

    def require_visible(self, pipeline: str) -> None:
        """UnknownPipeline, as for a name the ledger does not know, when the caller's scope hides ``pipeline``."""
        from offset_ledger.operate.known import require_visible

        with self._db() as conn:
            require_visible(conn, pipeline)

    # -- reads

    def list_pipelines(self, *, with_lag: bool = True) -> list[PipelineSummary]:
        """Every pipeline with state (running/stopped), last batch time and total lag.

        Concurrent callers share one computation that started after they all arrived
        (``offset_ledger.rules.coalesce``): dashboards polling together cost one read, none gets an older answer.
        """
        # Shared by every caller, so computed for every pipeline and cut to each caller's scope after.
        scope = current_scope()
        every = self._coalesce.run(("pipelines", with_lag), lambda: unscoped(self._list_pipelines, with_lag))
        return every if scope.unrestricted else [s for s in every if scope.allows(s.pipeline)]

    def _list_pipelines(self, with_lag: bool) -> list[PipelineSummary]:
        # Every ledger read in one connection before Kafka is asked (round trips dominate this request).
        facts: dict[Any, Any] = {}
        with self._db() as conn:
            rows = queries.pipeline_summaries(conn)
            now = datetime.now(timezone.utc)
            open_by_group = open_runs(conn, now=now)
            ends = last_ends(conn)
            pos: dict[tuple[str, str], list[Position]] = {}
            if with_lag and rows and self.has_kafka:  # without Kafka there is no lag to compute
                pos, facts = self._positions_and_window(conn)
            shortfalls = shortfall_findings(conn, self._losses.seen)
        lost = per_pipeline(self.records_lost(shortfalls))
        marks = self._watermarks_or_none({p.topic for ps in pos.values() for p in ps}) if pos else None
        statuses, headrooms = self._statuses(rows, open_by_group, pos, marks, facts) if marks is not None else ({}, {})
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

    def records_lost(self, shortfalls: Sequence[Any] = ()) -> dict[tuple[str, str, str, int], int]:
        """Unexplained lost records per (pipeline, group, topic, partition), ``shortfalls`` judged first."""
        return self._losses.add(shortfalls, self.kafka if self.has_kafka else None)

    def _statuses(self, rows: list[dict[str, Any]], open_by_group: Mapping[tuple[str, str], Any],
                  pos: Mapping[tuple[str, str], list[Position]],
                  marks: Mapping[TopicPartition, Watermarks],
                  facts: Mapping[Any, Any]) -> tuple[dict[tuple[str, str], str | None], dict[tuple[str, str], Any]]:
        """Overall status per pipeline (no time lag or drift needed for it: no extra Kafka round trips), and
        retention headroom per pipeline (its reads are cached: ``offset_ledger.operate.retention_insight``)."""
        from offset_ledger.operate.retention_insight import pipeline_headroom
        from offset_ledger.rules.status import overall_status

        parts = [(pipeline, group, PartitionLag(p.topic, p.partition, p.next_offset,
                                                marks[p.tp].log_start_offset if p.tp in marks else None,
                                                marks[p.tp].log_end_offset if p.tp in marks else None))
                 for (pipeline, group), ps in pos.items() for p in ps]
        enriched = self._enrich(parts, open_by_group, facts, kafka=False)
        by: dict[tuple[str, str], list[Any]] = {}
        for pipeline, group, x in enriched:
            by.setdefault((pipeline, group), []).append(x.status)
        return {k: overall_status(v) for k, v in by.items()}, pipeline_headroom(self._headroom(enriched))

    def _headroom(self, parts: list[tuple[str, str, PartitionLag]]) -> list[tuple[str, str, PartitionLag]]:
        """Retention headroom for ``parts`` (``offset_ledger.operate.retention_insight``), reusing time lag's reads."""
        if not self.has_kafka:
            return parts
        return self._retention.apply(self.kafka, parts, lambda xs: self._insight.timestamps(self.kafka, xs))

    def _enrich(self, parts: list[tuple[str, str, PartitionLag]], open_by_group: Mapping[tuple[str, str], Any],
                facts: Mapping[Any, Any], *, kafka: bool) -> list[tuple[str, str, PartitionLag]]:
        """Time lag, drift and status for ``parts`` (``offset_ledger.operate.lag_insight``), ``facts`` read with the positions."""
        from offset_ledger.operate.lag_insight import status_window

        active = {k: any(a.state == "active" for a in acts) for k, acts in open_by_group.items()}
        return self._insight.enrich(self.kafka if kafka and self.has_kafka else None, parts, facts, active,
                                    window=status_window())

    @staticmethod
    def _positions_and_window(conn: Connection, pipeline: str | None = None, group: str | None = None,
                              ) -> tuple[dict[tuple[str, str], list[Position]], dict[Any, Any]]:
        from offset_ledger.operate.lag_insight import (
            positions_and_window,
            status_window,
        )

        return positions_and_window(conn, datetime.now(timezone.utc) - status_window(), pipeline, group)

    def current_offsets(self, pipeline: str, consumer_group: str | None = None) -> dict[str, dict[str, int]]:
        """``{"topic": {"0": next_offset}}``: the legacy getCurrentOffsets answer."""
        with self._db() as conn:
            group = self.resolve_group(conn, pipeline, consumer_group)
            positions = queries.current_positions(conn, pipeline, group)
        out: dict[str, dict[str, int]] = {}
        for p in positions:
            out.setdefault(p.topic, {})[str(p.partition)] = p.next_offset
        return out

    def positions(self, pipeline: str, consumer_group: str | None = None) -> tuple[str, list[dict[str, Any]]]:
        """(consumer group, positions with what placed them)."""
        with self._db() as conn:
            group = self.resolve_group(conn, pipeline, consumer_group)
            return group, queries.position_details(conn, pipeline, group)

    def history(
        self, pipeline: str, consumer_group: str | None = None, *, topic: str | None = None,
        since: datetime | None = None, until: datetime | None = None, limit: int = 100,
        cursor: str | None = None,
    ) -> HistoryPage:
        """Committed batches newest first, filtered by topic and [since, until), paged by cursor."""
        if not 1 <= limit <= 1000:
            raise InvalidInput(f"limit must be between 1 and 1000, not {limit}", limit=limit)
        if topic is not None:
            check_topic(topic)
        after = decode_cursor(cursor) if cursor else None
        with self._db() as conn:
            group = self.resolve_group(conn, pipeline, consumer_group)
            if topic is not None:
                from offset_ledger.operate.known import require_topics

                require_topics(conn, pipeline, group, [topic])
            rows = queries.batch_history(conn, pipeline, group, topic=topic, since=since, until=until,
                                         limit=limit + 1, after=after)
            more = len(rows) > limit
            rows = rows[:limit]
            from offset_ledger.ledger.sink_store import outputs_by_batch

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

    def lag(self, pipeline: str, consumer_group: str | None = None) -> tuple[str, list[PartitionLag]]:
        """(consumer group, lag per partition): every current partition of the pipeline's topics."""
        with self._db() as conn:  # every ledger read before Kafka is asked
            group = self.resolve_group(conn, pipeline, consumer_group)
            by_group, facts = self._positions_and_window(conn, pipeline, group)
            runs = open_runs(conn, pipeline, group)
        positions = by_group.get((pipeline, group), [])
        marks = self._watermarks_per_topic(sorted({p.topic for p in positions}))
        by_tp = {p.tp: p.next_offset for p in positions}
        out = []
        for tp in sorted(set(by_tp) | set(marks)):
            m = marks.get(tp)
            out.append(PartitionLag(tp.topic, tp.partition, by_tp.get(tp),
                                    m.log_start_offset if m else None, m.log_end_offset if m else None))
        enriched = self._headroom(self._enrich([(pipeline, group, x) for x in out], runs, facts, kafka=True))
        return group, [x for _, _, x in enriched]

    def topic_details(self, topic: str) -> dict[str, Any]:
        """``{"name": T, "partitions": {"0": {"firstOffset": log_start, "lastOffset": log_end}}}``."""
        return topic_details(self.kafka, topic)


    # -- resets


def topic_details(kafka: KafkaAdapter, topic: str) -> dict[str, Any]:
    """The legacy getTopicDetails answer; needs only Kafka (no ledger)."""
    check_topic(topic)
    seen = kafka.snapshot([topic])
    if topic not in seen.partitions:
        raise UnknownTopic(topic)
    marks = seen.watermarks
    return {
        "name": topic,
        "partitions": {
            str(tp.partition): {"firstOffset": m.log_start_offset, "lastOffset": m.log_end_offset}
            for tp, m in sorted(marks.items())
        },
    }


def _lag(p: Position, m: Watermarks | None) -> int | None:
    return None if m is None else max(0, m.log_end_offset - p.next_offset)


__all__ = [
    "HistoryPage", "MetricsSnapshot", "Operations", "PartitionLag", "PartitionReset", "PipelineSummary",
    "ResetOutcome", "check_name", "check_topic", "parse_timestamp", "request_from_legacy_body", "resolve_group",
    "scope_from_specs", "to_epoch_ms", "topic_details",
]
