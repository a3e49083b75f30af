"""Adopt a running pipeline: import its Spark checkpoint's last committed batch as the ledger's positions.

``import_checkpoint`` reads the checkpoint (``offset_ledger.rules.checkpoint`` parses; local paths are
read directly, remote URIs through ``fsspec``), then writes one checkpoint generation whose
location *is* the adopted checkpoint and whose resolved offsets are its Kafka positions: the
running query's runs, which report that checkpoint, become the generation's authoritative runs.
Dry run unless ``execute=True``; nothing is written when anything is wrong.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.capture.checkpoint_files import checkpoint_files
from offset_ledger.errors import AdoptionRefused, ConfigError
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import current_revision, ensure_schema, translate_db_error
from offset_ledger.ledger.queries import pipeline_footprint
from offset_ledger.operate.inputs import check_name
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.checkpoint import (
    CheckpointState,
    KafkaPositions,
    SourceChoice,
    kafka_positions,
    parse_source_choice,
    read_checkpoint,
)
from offset_ledger.rules.model import Finding

if TYPE_CHECKING:
    from offset_ledger.rules.restart_options import PipelineRef, RestartOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdoptResult:
    """What an import wrote (``executed``) or would write (dry run)."""

    pipeline: str
    consumer_group: str
    checkpoint_location: str
    checkpoint_root: str
    query_id: str
    committed_batch_id: int | None
    planned_batch_ids: tuple[int, ...]
    positions: Mapping[str, Mapping[int, int]]  # topic -> partition -> next_offset
    sources_used: tuple[int, ...]
    skipped: tuple[str, ...]
    executed: bool
    generation: int | None = None
    findings: tuple[Finding, ...] = field(default=())

    @property
    def starting_offsets(self) -> dict[str, dict[str, int]]:
        return {t: {str(p): o for p, o in parts.items()} for t, parts in self.positions.items()}


def parent_location(location: str) -> str:
    """The directory holding the checkpoint, by string (a URI keeps its scheme and authority)."""
    trimmed = location.rstrip("/")
    head, sep, _tail = trimmed.rpartition("/")
    if not sep:
        return "."
    if not head:
        return "/"
    if head.endswith(":/"):  # "s3a://bucket": the bucket is as high as it goes
        return trimmed
    return head


def clean_location(location: str) -> str:
    """The checkpoint path as the generation records it: stripped, no trailing slash, local paths absolute.

    Spark qualifies a relative ``checkpointLocation`` against the driver's working directory and
    reports it absolute; the recorded location must compare equal to what runs report.
    """
    text = str(location).strip()
    if not text:
        raise ConfigError("the checkpoint path is empty")
    if "://" not in text and not text.startswith("file:"):
        text = os.path.abspath(text)
    return text.rstrip("/") or "/"


# -- importing --------------------------------------------------------------------------------


def plan_import(location: str, source: SourceChoice | str = None,
                storage_options: Mapping[str, Any] | None = None) -> tuple[CheckpointState, KafkaPositions]:
    """Read and parse the checkpoint and choose its Kafka positions (no ledger access)."""
    choice = parse_source_choice(source)  # type: ignore[arg-type]
    state = read_checkpoint(location, checkpoint_files(location, storage_options))
    return state, kafka_positions(state, choice)


def _finding(state: CheckpointState, chosen: KafkaPositions) -> Finding:
    planned = (f"; planned but uncommitted batch(es) {', '.join(map(str, state.planned_batch_ids))} are not "
               "positions (Spark re-runs them)" if state.planned_batch_ids else "")
    skipped = f"; {'; '.join(chosen.skipped)}" if chosen.skipped else ""
    return Finding(
        "checkpoint_adopted",
        f"adopted checkpoint {state.location} of query {state.query_id} at {state.describe_batch()}{planned}"
        f"{skipped}",
        details={"checkpoint_location": state.location, "query_id": state.query_id,
                 "batch_id": state.committed_batch_id, "planned_batch_ids": list(state.planned_batch_ids),
                 "sources_used": list(chosen.used), "skipped_sources": list(chosen.skipped)})


def adopt(
    conn: Connection, state: CheckpointState, chosen: KafkaPositions, *, pipeline: str, consumer_group: str,
    checkpoint_root: str, app_version: str | None, force: bool = False, execute: bool = True,
    topic_ids: Mapping[str, str] | None = None,
) -> AdoptResult:
    """Refuse if the group already has positions or generations (unless ``force``); write when ``execute``.

    Call inside one transaction.
    """
    footprint = pipeline_footprint(conn, pipeline).get(consumer_group)
    if footprint and (footprint.get("topics") or footprint.get("generations")) and not force:
        raise AdoptionRefused(pipeline, consumer_group, footprint)
    finding = _finding(state, chosen)
    result = AdoptResult(pipeline, consumer_group, state.location, checkpoint_root, state.query_id,
                         state.committed_batch_id, state.planned_batch_ids, chosen.positions, chosen.used,
                         chosen.skipped, executed=False, findings=(finding,))
    if not execute:
        return result
    offsets = result.starting_offsets
    generation, _ = gens.create_generation(conn, gens.NewGeneration(
        pipeline=pipeline, consumer_group=consumer_group, checkpoint_root=checkpoint_root,
        app_version=app_version, reason="adopted", starting_offsets=offsets, resolved_offsets=offsets,
        topic_ids={t: i for t, i in (topic_ids or {}).items() if t in offsets} or None,
        restart_findings=[finding], location=state.location, query_id=state.query_id))
    log.info("adopted checkpoint %s of query %s at %s as generation %s of %s/%s", state.location,
             state.query_id, state.describe_batch(), generation.generation, pipeline, consumer_group)
    return AdoptResult(**{**result.__dict__, "executed": True, "generation": generation.generation})


@dataclass(frozen=True)
class AdoptionPlan:
    """What an import would adopt, read from the checkpoint alone (no ledger): ``plan_adoption`` builds it."""

    pipeline: str
    consumer_group: str
    checkpoint_root: str
    state: CheckpointState
    chosen: KafkaPositions

    def dry_run(self) -> AdoptResult:
        """The answer of a dry run on a ledger with nothing of the pipeline (or no ledger at all)."""
        return AdoptResult(self.pipeline, self.consumer_group, self.state.location, self.checkpoint_root,
                           self.state.query_id, self.state.committed_batch_id, self.state.planned_batch_ids,
                           self.chosen.positions, self.chosen.used, self.chosen.skipped, executed=False,
                           findings=(_finding(self.state, self.chosen),))


def plan_adoption(
    checkpoint: str, *, pipeline: str, consumer_group: str | None = None, source: int | str | None = None,
    checkpoint_root: str | None = None, storage_options: Mapping[str, Any] | None = None,
) -> AdoptionPlan:
    """Check the names, read and parse the checkpoint, choose its Kafka positions: before any connection."""
    check_name("pipeline", pipeline)
    group = check_name("consumer group", consumer_group) if consumer_group else pipeline
    location = clean_location(checkpoint)
    state, chosen = plan_import(location, source, storage_options)
    return AdoptionPlan(pipeline, group, checkpoint_root or parent_location(location), state, chosen)


def adopt_checkpoint(
    ops: Operations, plan: AdoptionPlan, *, app_version: str | None = None, execute: bool = False,
    force: bool = False,
) -> AdoptResult:
    """The verb: import ``plan`` (``plan_adoption``) into the context's ledger; a dry run unless ``execute``.

    Refuses (AdoptionRefused) when the consumer group already has positions or generations, unless
    ``force``. With the context's Kafka, an executed import records the topics' Kafka ids too, so a
    topic re-created later is told apart (as for generations ``start_from_ledger`` opens). A dry run
    on a ledger that was never set up answers from the plan and creates nothing, not even the schema.
    """
    topic_ids: Mapping[str, str] | None = None
    if execute and ops.has_kafka:
        topic_ids = ops.kafka.topic_ids(sorted(plan.chosen.positions))
    try:
        if execute:
            ensure_schema(ops.engine)
        elif current_revision(ops.engine) is None:
            return plan.dry_run()  # a ledger that was never set up: nothing there to refuse over
        with ops.engine.begin() as conn:
            return adopt(conn, plan.state, plan.chosen, pipeline=plan.pipeline, consumer_group=plan.consumer_group,
                         checkpoint_root=plan.checkpoint_root, app_version=app_version, force=force,
                         execute=execute, topic_ids=topic_ids)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "importing the checkpoint") from exc


def import_checkpoint(
    checkpoint: str,
    *,
    pipeline: str,
    consumer_group: str | None = None,
    app_version: str | None = None,
    source: int | str | None = None,
    execute: bool = False,
    force: bool = False,
    dsn: str | None = None,
    checkpoint_root: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    bootstrap_servers: str | None = None,
    kafka_options: Mapping[str, Any] | None = None,
    kafka_timeout_ms: int = 10_000,
) -> AdoptResult:
    """Import a Spark checkpoint's last committed batch as the pipeline's positions (dry run by default).

    The entry point of ``offset-ledger import-checkpoint``: plans (``plan_adoption``), builds the
    context over ``dsn`` and ``bootstrap_servers`` and calls the verb ``adopt_checkpoint``. The new
    checkpoint generation's location is ``checkpoint`` itself (so the query running on it moves
    positions from then on), bound to the checkpoint's query id; ``checkpoint_root`` (where later
    fresh generations go) defaults to its parent directory. ``source``: the Kafka source index when
    the query has several, or ``"all"`` (positions then take each partition's lowest offset); the
    consumer group defaults to the pipeline's name. A dry run before the ledger's database exists
    answers from the checkpoint alone: the context needs a ledger to open, and a dry run never
    creates one.
    """
    plan = plan_adoption(checkpoint, pipeline=pipeline, consumer_group=consumer_group, source=source,
                         checkpoint_root=checkpoint_root, storage_options=storage_options)
    ledger = LedgerAddress.resolve(dsn, create=execute)  # a dry run never creates a ledger
    kafka = KafkaAddress.resolve(bootstrap_servers, kafka_options, timeout_ms=kafka_timeout_ms, environment=False)
    try:
        ops = Operations.open(ledger, kafka)
    except ConfigError as exc:
        if execute or not exc.details.get("missing"):
            raise
        return plan.dry_run()  # no ledger yet: nothing there to refuse over, and nothing created
    try:
        return adopt_checkpoint(ops, plan, app_version=app_version, execute=execute, force=force)
    finally:
        ops.close()


def adopt_if_unknown(ops: Operations, ref: PipelineRef, options: RestartOptions) -> AdoptResult | None:
    """``start_from_ledger(adopt_checkpoint=...)``: import ``options.adopt_checkpoint`` (all Kafka sources)
    into the context's ledger when it has nothing for the pipeline, recording ``options``' checkpoint
    root and app version; None when it already knows it (the ledger, not the checkpoint, is then the
    truth). The topics' Kafka ids come from the context's cluster."""
    assert options.adopt_checkpoint is not None and options.checkpoint_root is not None
    engine, pipeline, checkpoint = ops.engine, ref.pipeline, options.adopt_checkpoint
    with engine.connect() as conn:
        if pipeline_footprint(conn, pipeline):
            log.info("pipeline %s is in the ledger: adopt_checkpoint=%s is not imported", pipeline, checkpoint)
            return None
    location = clean_location(checkpoint)
    state, chosen = plan_import(location, "all")
    # Recorded so a topic deleted and re-created later is told apart from this incarnation.
    topic_ids = ops.kafka.topic_ids(sorted(chosen.positions))
    try:
        with engine.begin() as conn:
            return adopt(conn, state, chosen, pipeline=pipeline, consumer_group=ref.consumer_group or pipeline,
                         checkpoint_root=options.checkpoint_root, app_version=options.app_version,
                         topic_ids=topic_ids)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "adopting the checkpoint") from exc
