"""start_from_ledger: read the ledger and the cluster, resolve startingOffsets, pick the checkpoint.

The steps are separate functions so the CLI's read-only ``resolve`` and the benchmark reuse them:
``read_ledger`` (one connection) -> ``read_cluster`` (the Kafka adapter) -> ``resolver.resolve``
(pure) -> ``start_from_ledger`` alone writes (a new checkpoint generation and consumed resets, in
one transaction).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.config import settings
from offset_ledger.errors import (
    ConfigError,
    InvalidRestartOptions,
)
from offset_ledger.kafka import KafkaAdapter
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.queries import current_positions
from offset_ledger.model import (
    Finding,
    OnDataLoss,
    Position,
    RestartPlan,
    TopicPartition,
    Watermarks,
)
from offset_ledger.resolver import (
    FirstRun,
    FirstRunTimestamp,
    is_first_run,
    new_generation_reason,
    parse_first_run,
    parse_on_data_loss,
    resolve,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerView:
    """What the restart reads from the ledger, read in an order that makes consuming resets safe."""

    positions: tuple[Position, ...]
    pending_reset_ids: tuple[int, ...]
    generation: gens.CheckpointGeneration | None


@dataclass(frozen=True)
class ClusterView:
    """The requested topics as resolved on the cluster, their watermarks and any time look-ups."""

    topics: tuple[str, ...]
    watermarks: Mapping[TopicPartition, Watermarks]
    offsets_for_time: Mapping[TopicPartition, int | None] | None


def read_ledger(
    engine: Engine, pipeline: str, consumer_group: str, topics: Sequence[str] | None,
) -> LedgerView:
    """Pending resets, then positions, then the current generation (``topics=None``: every topic)."""
    try:
        with engine.connect() as conn:
            # Resets are read before positions: a reset committed in between then stays pending
            # (a later restart applies it again, harmlessly) instead of being marked consumed
            # without its positions being in this plan.
            pending = gens.pending_reset_ids(conn, pipeline, consumer_group)
            positions = current_positions(conn, pipeline, consumer_group, topics)
            generation = gens.current_generation(conn, pipeline, consumer_group)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading positions") from exc
    return LedgerView(tuple(positions), tuple(pending), generation)


def select_topics(
    adapter: KafkaAdapter, topics: Sequence[str] | None, topic_pattern: str | None,
    ledger_topics: Sequence[str] = (),
) -> list[str]:
    """The requested topics: the list, or the pattern resolved on the cluster plus ledger topics it matches.

    Ledger topics matching the pattern are included so a deleted topic's positions are reported as
    removed rather than silently forgotten.
    """
    if (topics is None) == (topic_pattern is None):
        raise InvalidRestartOptions("give exactly one of topics or topic_pattern (like subscribe / subscribePattern)",
                                    option="topics")
    if topics is not None:
        if isinstance(topics, str):
            topics = [t.strip() for t in topics.split(",")]
        wanted = [t for t in topics if t]
        if not wanted:
            raise InvalidRestartOptions("topics is empty", option="topics")
        return list(dict.fromkeys(wanted))
    assert topic_pattern is not None
    matched = adapter.topics_matching(topic_pattern)
    regex = re.compile(topic_pattern)
    return sorted(set(matched) | {t for t in ledger_topics if regex.fullmatch(t)})


def read_cluster(
    adapter: KafkaAdapter, topics: Sequence[str], *, timestamp_ms: int | None = None,
) -> ClusterView:
    """Watermarks of every partition of the topics, and offsets for ``timestamp_ms`` when given."""
    watermarks = adapter.watermarks(list(topics))
    by_time = None
    if timestamp_ms is not None:
        by_time = adapter.offsets_for_time(sorted(watermarks), timestamp_ms)
    return ClusterView(tuple(topics), watermarks, by_time)


def plan_restart(
    engine: Engine,
    adapter: KafkaAdapter,
    *,
    pipeline: str,
    consumer_group: str | None = None,
    topics: Sequence[str] | None = None,
    topic_pattern: str | None = None,
    first_run: object = "earliest",
    on_data_loss: str = "fail",
) -> tuple[RestartPlan, LedgerView]:
    """A read-only plan (``checkpoint_location=None``) and the ledger view it was built from."""
    group = consumer_group or pipeline
    policy: FirstRun = parse_first_run(first_run)
    loss: OnDataLoss = parse_on_data_loss(on_data_loss)
    if topics is not None and topic_pattern is None:
        requested = select_topics(adapter, topics, None)
        ledger = read_ledger(engine, pipeline, group, requested)
    else:
        ledger = read_ledger(engine, pipeline, group, None)
        requested = select_topics(adapter, topics, topic_pattern, sorted({p.topic for p in ledger.positions}))
    positions = [p for p in ledger.positions if p.topic in set(requested)]
    timestamp_ms = (policy.timestamp_ms if isinstance(policy, FirstRunTimestamp)
                    and is_first_run(positions, requested) else None)
    cluster = read_cluster(adapter, requested, timestamp_ms=timestamp_ms)
    plan = resolve(pipeline, requested, positions, cluster.watermarks, first_run=policy,
                   on_data_loss=loss, offsets_for_time=cluster.offsets_for_time)
    return plan, ledger


def start_from_ledger(
    pipeline: str,
    topics: Sequence[str] | None = None,
    *,
    topic_pattern: str | None = None,
    bootstrap_servers: str | None = None,
    checkpoint_root: str,
    app_version: str | None = None,
    first_run: str | int | datetime | Mapping[str, Any] = "earliest",
    on_data_loss: str = "fail",
    dsn: str | None = None,
    consumer_group: str | None = None,
    new_checkpoint: bool = False,
    kafka_options: Mapping[str, Any] | None = None,
) -> RestartPlan:
    """Plan a pipeline's start from the ledger: complete ``startingOffsets`` and the checkpoint to use.

    ``topics`` (a list, like ``subscribe``) or ``topic_pattern`` (a regex matched against the whole
    name, like ``subscribePattern``) selects the topics; ``bootstrap_servers`` (default
    ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``) and Spark-style ``kafka_options`` (``kafka.security.protocol``,
    ``kafka.sasl.*``, ``kafka.ssl.*``, ...) reach the cluster the pipeline reads.

    ``starting_offsets`` names every current partition of every requested topic: the ledger position,
    ``-2`` for partitions the ledger does not know, and for positions outside the broker's log the
    ``on_data_loss`` policy: ``"fail"`` raises ``DataLossError`` naming the partitions and records
    lost; ``"earliest"`` resumes at the log-start offset and records a finding (also when a topic
    was re-created and the position is beyond its log-end). With no ledger position at all,
    ``first_run`` applies: ``"earliest"``, ``"latest"``, a timestamp (``datetime``, naive = UTC, or
    epoch ms; each partition starts at its first record at or after it, and at latest (-1) when no
    record is that new), or explicit offsets (dict or JSON; unnamed partitions start at earliest).

    Checkpoints: generations live at ``<checkpoint_root>/gen-<n>-<id>`` (any URI Spark accepts;
    nothing is listed or deleted). The current generation is reused when nothing changed; a fresh,
    empty one is handed out on the first run through the helper, when a reset is pending (the
    reset is then marked consumed), when ``app_version`` differs from the current generation's,
    when ``checkpoint_root`` changed, or when ``new_checkpoint=True``. ``plan.fresh_checkpoint``
    says which: when False, Spark resumes from the checkpoint and ignores ``startingOffsets``,
    which are still reported for inspection. Nothing is written when an error is raised.
    """
    if not checkpoint_root or not str(checkpoint_root).strip():
        raise ConfigError("checkpoint_root is required")
    root = str(checkpoint_root)
    options = dict(kafka_options or {})
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers") or settings().bootstrap_servers
    if not servers:
        raise ConfigError("no Kafka bootstrap servers (bootstrap_servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")
    group = consumer_group or pipeline

    from offset_ledger.ledger.engine import ensure_schema, make_engine

    engine = make_engine(dsn)
    try:
        ensure_schema(engine)
        with KafkaAdapter(servers, options) as adapter:
            plan, ledger = plan_restart(
                engine, adapter, pipeline=pipeline, consumer_group=group, topics=topics,
                topic_pattern=topic_pattern, first_run=first_run, on_data_loss=on_data_loss)
        current = ledger.generation
        reason = new_generation_reason(
            has_current=current is not None,
            current_app_version=current.app_version if current else None,
            current_checkpoint_root=current.checkpoint_root if current else None,
            app_version=app_version, checkpoint_root=root,
            pending_resets=bool(ledger.pending_reset_ids), requested=new_checkpoint)
        if reason is None:
            assert current is not None
            log.info("resuming checkpoint generation %s of %s at %s; Spark ignores startingOffsets",
                     current.generation, pipeline, current.location)
            return replace(plan, checkpoint_location=current.location, fresh_checkpoint=False)
        try:
            with engine.begin() as conn:
                generation, consumed = gens.create_generation(
                    conn, pipeline=pipeline, consumer_group=group, checkpoint_root=root,
                    app_version=app_version if app_version is not None else (current.app_version if current else None),
                    reason=reason, starting_offsets=plan.starting_offsets,
                    consume_reset_ids=ledger.pending_reset_ids)
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, "recording the checkpoint generation") from exc
        findings = list(plan.findings) + [
            Finding("reset_consumed",
                    f"pending reset {rid} applied through fresh checkpoint generation {generation.generation}",
                    details={"reset_id": rid, "generation": generation.generation,
                             "checkpoint_location": generation.location})
            for rid in consumed
        ]
        return replace(plan, checkpoint_location=generation.location, fresh_checkpoint=True,
                       findings=tuple(findings))
    finally:
        engine.dispose()
