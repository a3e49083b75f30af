"""failover: move a pipeline to the MirrorMaker 2 backup cluster as a fresh checkpoint generation there.

The pipeline's consumer-group mirror (``commit_to_kafka``) committed its positions to a Kafka group;
MirrorMaker 2 translated that group's offsets onto the backup (``<alias>.checkpoints.internal``).
``failover`` reads those translations and the backup's logs, plans each partition
(``offset_ledger.rules.failover``: never past what the ledger read; uncheckpointed partitions are a
loud choice), measures the re-read gap in records and record time, and records the result like any
restart: a fresh checkpoint generation whose starting offsets become the positions, keyed by the
backup's topic names and Kafka topic ids (ids are per cluster, so a restart that reaches the wrong
cluster sees a different topic). Later restarts, resets, the mirror and ``verify`` then work on the
backup. Failing back is the same call with the aliases swapped, but MM2 never translates a
topic back onto the topic it came from (docs/failover.md, "Failing back"): such partitions are
refused (``not_translated_back``) unless started from the original topic's log start.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.addresses import LedgerAddress
from offset_ledger.errors import (
    ActiveRunConflict,
    ConfigError,
    FailoverRefused,
    KafkaError,
    PlanConflict,
    UnknownConsumerGroup,
    UnknownPipeline,
    UnknownTopic,
)
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.kafka.mm2_checkpoints import cluster_id, read_checkpoints
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import require_schema, translate_db_error
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.queries import (
    active_run_ids,
    current_positions,
    pipeline_footprint,
)
from offset_ledger.operate.known import pipeline_names, require_visible
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart_plan import choose_group
from offset_ledger.rules.failover import (
    FailoverPlan,
    FailoverRequest,
    ReplicationPolicy,
    Uncheckpointed,
    checkpoints_topic,
    failover_findings,
    plan_failover,
    with_time_spans,
)
from offset_ledger.rules.model import Finding, TopicPartition, starting_offsets_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FailoverResult:
    """A failover's plan and, unless a dry run, the checkpoint generation it opened on the backup."""

    pipeline: str
    consumer_group: str
    source_alias: str
    target_bootstrap: str
    target_cluster_id: str | None
    plan: FailoverPlan
    dry_run: bool
    checkpoint_location: str | None = None
    generation: int | None = None
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def starting_offsets(self) -> dict[str, dict[str, int]]:
        return self.plan.starting_offsets

    @property
    def starting_offsets_json(self) -> str:
        """The string for ``.option("startingOffsets", ...)`` on the backup cluster."""
        return starting_offsets_json(self.starting_offsets)

    @property
    def topics(self) -> list[str]:
        """The topics to subscribe to on the backup (renamed by the replication policy)."""
        return sorted(set(self.plan.topic_map.values()))

    @property
    def reread_max(self) -> int:
        return self.plan.reread_max


def failover(
    pipeline: str,
    *,
    to_bootstrap: str,
    source_alias: str = "primary",
    target_alias: str | None = None,
    replication_policy: ReplicationPolicy = "default",
    separator: str = ".",
    uncheckpointed: Uncheckpointed = "fail",
    consumer_group: str | None = None,
    topics: Sequence[str] | None = None,
    checkpoint_root: str | None = None,
    app_version: str | None = None,
    dsn: str | None = None,
    kafka_options: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    force: bool = False,
) -> FailoverResult:
    """Fail ``pipeline`` over to the cluster at ``to_bootstrap``, which MirrorMaker 2 fills from ``source_alias``.

    Reads the pipeline's positions (its consumer group: the one its mirror commits to), MM2's
    translated offsets of that group on the target, and the target's logs; plans every partition
    of the renamed topics (``replication_policy`` ``"default"``: ``<source_alias><separator><topic>``,
    ``"identity"``: the same names; a topic that came from ``target_alias`` maps back to its original
    name). ``uncheckpointed`` decides partitions MM2 gives no safe translation for: ``"fail"``
    (FailoverRefused naming them) or ``"earliest"`` (the backup's log start, stated in a finding).

    Unless ``dry_run``, records a fresh checkpoint generation (reason ``failover``) under
    ``checkpoint_root`` (default: the current generation's root) whose starting offsets become the
    positions, drops the positions of topics not carried over, and stores a ``failover`` finding
    with the translation gap: at most how many records each partition reads again, and their record
    time span. Refused (ActiveRunConflict) while a run of the pipeline is active unless ``force``.
    Start the query on the backup with ``result.topics``, ``result.starting_offsets_json`` and
    ``result.checkpoint_location`` (or call ``start_from_ledger`` with those topics: it resumes the
    new generation).
    """
    # The arguments as one value, checked before anything connects.
    request = FailoverRequest(
        to_bootstrap=to_bootstrap, source_alias=source_alias, target_alias=target_alias,
        replication_policy=replication_policy, separator=separator, uncheckpointed=uncheckpointed,
        topics=topics, checkpoint_root=checkpoint_root,  # type: ignore[arg-type]  # the value makes it a tuple
        app_version=app_version, kafka_options=kafka_options or {})
    # The ledger resolved once; a mistyped SQLite path is an error, never a new ledger. No source KafkaAddress:
    # the only cluster asked is the request's ``target``, never OFFSET_LEDGER_BOOTSTRAP_SERVERS.
    ops = Operations.open(LedgerAddress.resolve(dsn, create=False))
    try:
        return fail_over(ops, pipeline, request, consumer_group=consumer_group, dry_run=dry_run, force=force)
    finally:
        ops.close()


def fail_over(
    ops: Operations, pipeline: str, request: FailoverRequest, *, consumer_group: str | None = None,
    dry_run: bool = False, force: bool = False,
) -> FailoverResult:
    """The verb: ``failover`` over the context's ledger (its Kafka is not asked: the target cluster is
    the request's ``target``). ``consumer_group``: default, the pipeline's only group."""
    engine = ops.engine
    require_schema(engine)  # a ledger without the schema knows no pipeline; a dry run writes nothing
    group, before, root, version, read_ids = _read_ledger(engine, pipeline, consumer_group, request)
    wanted = sorted({tp.topic for tp in before} if request.topics is None else set(request.topics))
    unknown = sorted(set(wanted) - {tp.topic for tp in before})
    if unknown:  # a typo, not a refusal: name the topics the pipeline does read
        raise UnknownTopic(unknown[0], pipeline, sorted({tp.topic for tp in before}))
    topic_map = {t: request.target_topic(t) for t in wanted}
    ledger = {tp: o for tp, o in before.items() if tp.topic in topic_map}
    with KafkaAdapter.open(request.target) as adapter:
        present = adapter.partitions(sorted(set(topic_map.values())))
        watermarks = adapter.watermarks(sorted(present)) if present else {}
        ids = adapter.topic_ids(sorted(present)) if present else {}
        # Failing back: the name says so (default policy), or the target topic is one the pipeline
        # read before (its Kafka id is in an earlier generation: the identity policy's case).
        returning = {s for s, t in topic_map.items()
                     if request.returns_home(s) or (t in ids and ids[t] in read_ids.get(t, set()))}
        cps = _checkpoints(request, group, failing_back=returning == set(topic_map))
        plan = plan_failover(ledger, cps, watermarks, topic_map, uncheckpointed=request.uncheckpointed,
                             returning=returning)
        plan = _with_spans(adapter, plan, watermarks)
    try:
        target_id = cluster_id(request.target.require(), request.target.options)
    except KafkaError as exc:  # the id is for the record; the plan stands without it
        log.warning("failover of %s: the target's cluster id could not be read: %s", pipeline, exc.message)
        target_id = None
    findings = failover_findings(plan, source_alias=request.source_alias, target_bootstrap=request.to_bootstrap,
                                 target_cluster_id=target_id, source_cluster_id=None)
    result = FailoverResult(pipeline, group, request.source_alias, request.to_bootstrap, target_id, plan, dry_run,
                            findings=findings)
    if dry_run:
        return result
    return _record(engine, result, before, root, version, ids, watermarks, force)


def _checkpoints(request: FailoverRequest, group: str, *, failing_back: bool) -> dict[TopicPartition, Any]:
    """MM2's checkpoints of ``group``; failing back, a missing checkpoints topic is simply none.

    MM2 never checkpoints a topic back to the cluster it came from, so a failback must not demand
    that a reverse flow ran: the plan then names the partitions (``not_translated_back``).
    """
    try:
        return read_checkpoints(request.target.require(), checkpoints_topic(request.source_alias), group,
                                options=request.target.options)
    except FailoverRefused as exc:
        if failing_back and exc.details.get("reason") == "no_checkpoints_topic":
            return {}
        raise


def _read_ledger(engine: Any, pipeline: str, consumer_group: str | None, request: FailoverRequest,
                 ) -> tuple[str, dict[TopicPartition, int], str | None, str | None, dict[str, set[str]]]:
    try:
        with engine.connect() as conn:
            require_visible(conn, pipeline)
            footprint = pipeline_footprint(conn, pipeline)
            if not footprint:
                raise UnknownPipeline(pipeline, pipeline_names(conn))
            if consumer_group is not None and consumer_group not in footprint:
                raise UnknownConsumerGroup(pipeline, consumer_group, sorted(footprint))
            group = consumer_group or choose_group(pipeline, footprint)
            if gens.pending_reset_ids(conn, pipeline, group):
                # MM2 translated the group's offsets, which a pending reset has not moved yet.
                raise FailoverRefused(f"pipeline {pipeline!r} has a pending reset; apply it (restart) or "
                                      "cancel it before failing over", reason="reset_pending")
            positions = {TopicPartition(p.topic, p.partition): p.next_offset
                         for p in current_positions(conn, pipeline, group)}
            current = gens.current_generation(conn, pipeline, group, offsets=False)
            read_ids: dict[str, set[str]] = {}
            for g in gens.generations(conn, pipeline, group):
                for t, tid in (g.topic_ids or {}).items():
                    read_ids.setdefault(t, set()).add(str(tid))
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the pipeline") from exc
    if not positions:
        raise FailoverRefused(f"pipeline {pipeline!r} has no positions under consumer group {group!r}",
                              reason="no_positions")
    root = request.checkpoint_root or (current.checkpoint_root if current else None)
    version = request.app_version if request.app_version is not None else (current.app_version if current else None)
    return group, positions, root, version, read_ids


def _with_spans(adapter: KafkaAdapter, plan: FailoverPlan, watermarks: Mapping[TopicPartition, Any]) -> FailoverPlan:
    """The record-time span of what each partition may read again: its first and last record there."""
    firsts, lasts = [], []
    for p in plan.partitions:
        if p.reread_max > 0:
            tp = TopicPartition(p.target_topic, p.partition)
            firsts.append((tp, p.start_next_offset))
            lasts.append((tp, watermarks[tp].log_end_offset - 1))
    if not firsts:
        return plan
    found = adapter.record_timestamps([*firsts, *lasts])
    return with_time_spans(plan, {tp: found[(tp, o)] for tp, o in firsts if (tp, o) in found},
                           {tp: found[(tp, o)] for tp, o in lasts if (tp, o) in found})


def _record(engine: Any, result: FailoverResult, before: Mapping[TopicPartition, int], root: str | None,
            version: str | None, topic_ids: Mapping[str, str], watermarks: Mapping[TopicPartition, Any],
            force: bool) -> FailoverResult:
    """The failover generation, under the pipeline lock, only if the positions read are still the positions."""
    from dataclasses import replace

    if not root:
        raise ConfigError(f"pipeline {result.pipeline!r} has no checkpoint generation yet: give checkpoint_root")
    pipeline, group = result.pipeline, result.consumer_group
    targets = set(result.plan.topic_map.values())
    try:
        with engine.begin() as conn:
            lock_pipeline(conn, pipeline, group)
            active = active_run_ids(conn, pipeline, group)
            if active and not force:
                raise ActiveRunConflict(pipeline, active)
            now = {TopicPartition(p.topic, p.partition): p.next_offset
                   for p in current_positions(conn, pipeline, group)}
            if now != dict(before):
                raise PlanConflict(pipeline, 1, ["positions moved while the failover was planned"])
            # Positions of the old cluster's topics go: they are offsets of another cluster. With the
            # identity policy the names stay and the baseline overwrites them instead.
            dropped = sorted((tp.topic, tp.partition) for tp in before if tp.topic not in targets)
            wm_json: dict[str, dict[str, list[int]]] = {}
            for tp, wm in watermarks.items():
                wm_json.setdefault(tp.topic, {})[str(tp.partition)] = [wm.log_start_offset, wm.log_end_offset]
            generation, _ = gens.create_generation(conn, gens.NewGeneration(
                pipeline=pipeline, consumer_group=group, checkpoint_root=root, app_version=version,
                reason="failover", starting_offsets=result.starting_offsets, resolved_offsets=result.starting_offsets,
                topic_ids={t: i for t, i in topic_ids.items() if t in targets}, watermarks=wm_json,
                dropped_partitions=dropped, restart_findings=list(result.findings)))
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "recording the failover generation") from exc
    log.info("pipeline %s failed over to %s: generation %s at %s, at most %d record(s) re-read", pipeline,
             result.target_bootstrap, generation.generation, generation.location, result.reread_max)
    return replace(result, checkpoint_location=generation.location, generation=generation.generation)
