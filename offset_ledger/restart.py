"""start_from_ledger: read the ledger and the cluster, resolve startingOffsets, pick the checkpoint.

The steps are separate functions so the CLI's read-only ``resolve`` and the benchmark reuse them:
``read_ledger`` (one connection) -> ``read_cluster`` (the Kafka adapter) -> ``resolver.resolve``
(pure) -> ``start_from_ledger`` alone writes (a new checkpoint generation and consumed resets, in
one transaction).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.config import settings
from offset_ledger.errors import (
    AmbiguousConsumerGroup,
    ConfigError,
    FirstRunRefused,
    InvalidRestartOptions,
    PlanConflict,
)
from offset_ledger.kafka import KafkaAdapter
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.queries import current_positions, pipeline_footprint
from offset_ledger.model import (
    EARLIEST,
    LATEST,
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
    TopicIncarnation,
    is_first_run,
    new_generation_reason,
    parse_first_run,
    parse_on_data_loss,
    resolve,
)
from offset_ledger.restart_stateful import state_rewind, stateful_record, stored_stateful
from offset_ledger.stateful import WindowSpec, parse_duration_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerView:
    """What the restart reads from the ledger, read in an order that makes consuming resets safe."""

    positions: tuple[Position, ...]
    pending_reset_ids: tuple[int, ...]
    generation: gens.CheckpointGeneration | None
    consumer_group: str = ""
    #: everything the ledger holds for the pipeline, per consumer group (``queries.pipeline_footprint``)
    footprint: Mapping[str, Mapping[str, Any]] | None = None
    #: set by ``plan_restart``: the stateful inputs a generation opened from this plan stores
    next_stateful: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ClusterView:
    """The requested topics as resolved on the cluster, their watermarks and any time look-ups."""

    topics: tuple[str, ...]
    watermarks: Mapping[TopicPartition, Watermarks]
    offsets_for_time: Mapping[TopicPartition, int | None] | None
    topic_ids: Mapping[str, str] = ()  # type: ignore[assignment]


def read_ledger(
    engine: Engine, pipeline: str, consumer_group: str | None, topics: Sequence[str] | None,
) -> LedgerView:
    """Pending resets, then positions, then the current generation (``topics=None``: every topic).

    ``consumer_group=None`` means the pipeline's only group in the ledger (its own name when the
    ledger has none); AmbiguousConsumerGroup when it has several.
    """
    try:
        with engine.connect() as conn:
            return read_ledger_on(conn, pipeline, consumer_group, topics)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading positions") from exc


def read_ledger_on(
    conn: Connection, pipeline: str, consumer_group: str | None, topics: Sequence[str] | None,
) -> LedgerView:
    """``read_ledger`` on an open connection (the restart reads again under the pipeline lock)."""
    footprint = pipeline_footprint(conn, pipeline)
    group = consumer_group or choose_group(pipeline, footprint)
    # Resets are read before positions: a reset committed in between then stays pending
    # (a later restart applies it again, harmlessly) instead of being marked consumed
    # without its positions being in this plan.
    pending = gens.pending_reset_ids(conn, pipeline, group)
    positions = current_positions(conn, pipeline, group, topics)
    generation = gens.current_generation(conn, pipeline, group, offsets=False)
    return LedgerView(tuple(positions), tuple(pending), generation, group, footprint)


def ledger_changes(before: LedgerView, after: LedgerView, topics: Sequence[str]) -> list[str]:
    """What differs between two reads of the ledger that a plan depends on (empty: nothing)."""
    wanted = set(topics)
    changed = []
    if before.consumer_group != after.consumer_group:
        changed.append(f"consumer group {before.consumer_group!r} -> {after.consumer_group!r}")
    old_gen = before.generation.id if before.generation else None
    new_gen = after.generation.id if after.generation else None
    if old_gen != new_gen:
        changed.append("another restart opened checkpoint generation "
                       f"{after.generation.generation if after.generation else '?'}")
    if before.pending_reset_ids != after.pending_reset_ids:
        changed.append(f"pending resets {list(before.pending_reset_ids)} -> {list(after.pending_reset_ids)}")
    mine = [p for p in before.positions if p.topic in wanted]
    theirs = [p for p in after.positions if p.topic in wanted]
    if mine != theirs:
        moved = len(set(theirs) ^ set(mine))
        changed.append(f"{moved} position row(s) moved (a batch or a reset committed)")
    return changed


def choose_group(pipeline: str, footprint: Mapping[str, Any]) -> str:
    """The consumer group of a pipeline nobody named one for: its only group, else its own name."""
    groups = sorted(footprint)
    if len(groups) > 1:
        raise AmbiguousConsumerGroup(pipeline, groups)
    return groups[0] if groups else pipeline


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
    seen = adapter.snapshot(list(topics))  # one metadata request: partitions, ids and watermarks agree
    by_time = None
    if timestamp_ms is not None:
        by_time = adapter.offsets_for_time(sorted(seen.watermarks), timestamp_ms)
    return ClusterView(tuple(topics), seen.watermarks, by_time, seen.topic_ids)


def recreated_topics(
    generation: gens.CheckpointGeneration | None, cluster: ClusterView,
    watermarks_of: Callable[[int], Mapping[str, Mapping[str, list[int]]] | None] | None = None,
) -> list[TopicIncarnation]:
    """Topics whose Kafka topic id differs from the one the current generation recorded.

    What the old incarnation held comes from the watermarks the generation saw: its own, or
    ``watermarks_of(generation.id)``, asked only when a topic was re-created (the restart reads
    generations without their per-partition JSON).
    """
    if generation is None or not generation.topic_ids:
        return []
    changed = [(topic, old_id, cluster.topic_ids[topic]) for topic, old_id in sorted(generation.topic_ids.items())
               if cluster.topic_ids.get(topic) not in (None, old_id)]
    if not changed:
        return []
    marks = generation.watermarks
    if marks is None and watermarks_of is not None:
        marks = watermarks_of(generation.id)
    return [TopicIncarnation(topic, old_id, new_id,
                             {int(p): int(w[1]) for p, w in (marks or {}).get(topic, {}).items()})
            for topic, old_id, new_id in changed]


def plan_restart(
    engine: Engine,
    adapter: KafkaAdapter,
    *,
    pipeline: str,
    consumer_group: str | None = None,
    topics: Sequence[str] | None = None,
    topic_pattern: str | None = None,
    first_run: object = None,
    on_data_loss: str = "fail",
    allow_first_run: bool = False,
    window: str | None = None,
    slide: str | None = None,
    watermark_delay: str | None = None,
    event_time_is_kafka_timestamp: bool = False,
) -> tuple[RestartPlan, LedgerView, ClusterView]:
    """A read-only plan (``checkpoint_location=None``) and the ledger and cluster views it was built from.

    Refuses (FirstRunRefused) to treat a pipeline the ledger knows as a first run, unless
    ``first_run`` is given and ``allow_first_run`` is True. With ``window`` the positions are
    rewound for a windowed pipeline (``offset_ledger.stateful``) and the plan carries the event-time floor.
    """
    spec = WindowSpec.parse(window, slide) if window is not None else None
    if spec is None and (slide is not None or watermark_delay is not None or event_time_is_kafka_timestamp):
        raise InvalidRestartOptions("slide, watermark_delay and event_time_is_kafka_timestamp need window",
                                    option="window")
    delay_ms = parse_duration_ms(watermark_delay, option="watermark_delay") if watermark_delay is not None else None
    policy: FirstRun = parse_first_run("earliest" if first_run is None else first_run)
    loss: OnDataLoss = parse_on_data_loss(on_data_loss)
    if allow_first_run and first_run is None:
        raise InvalidRestartOptions("allow_first_run needs first_run too: say where the pipeline starts over",
                                    option="allow_first_run")
    t0 = time.perf_counter()
    if topics is not None and topic_pattern is None:
        requested = select_topics(adapter, topics, None)
        ledger = read_ledger(engine, pipeline, consumer_group, requested)
    else:
        ledger = read_ledger(engine, pipeline, consumer_group, None)
        requested = select_topics(adapter, topics, topic_pattern, sorted({p.topic for p in ledger.positions}))
    wanted = set(requested)
    positions = [p for p in ledger.positions if p.topic in wanted]
    first = is_first_run(positions, requested)
    if first and ledger.footprint and not allow_first_run:
        raise FirstRunRefused(pipeline, ledger.consumer_group, requested, ledger.footprint)
    timestamp_ms = policy.timestamp_ms if isinstance(policy, FirstRunTimestamp) and first else None
    t1 = time.perf_counter()
    cluster = read_cluster(adapter, requested, timestamp_ms=timestamp_ms)
    t2 = time.perf_counter()
    rewind = None
    stored = stored_stateful(ledger.generation)
    if spec is not None:
        rewind = state_rewind(engine, adapter, ledger, pipeline, positions, spec, delay_ms,
                              event_time_is_kafka_timestamp, stored)
        positions = [Position(tp.topic, tp.partition, o) for tp, o in sorted(rewind[1].offsets.items())
                     if o >= 0 and tp.topic in wanted]
    def watermarks_of(generation_id: int) -> Any:
        with engine.connect() as conn:
            return gens.generation_watermarks(conn, generation_id)

    plan = resolve(pipeline, requested, positions, cluster.watermarks, first_run=policy,
                   on_data_loss=loss, offsets_for_time=cluster.offsets_for_time,
                   recreated=recreated_topics(ledger.generation, cluster, watermarks_of))
    if rewind is not None:
        plan = replace(plan, findings=(*plan.findings, rewind[1].finding(rewind[0])),
                       event_time_floor=rewind[1].event_time_floor)
    elif stored is not None and stored.event_time_floor is not None:
        # The generation was opened by a stateful restart: its floor holds for every later start,
        # with or without window= (records before it were emitted in windows already).
        plan = replace(plan, findings=(*plan.findings, stored.kept_finding()),
                       event_time_floor=stored.event_time_floor)
    log.debug("plan for %s over %d partitions: ledger %.1f ms, cluster %.1f ms, resolve %.1f ms", pipeline,
              len(cluster.watermarks), (t1 - t0) * 1000, (t2 - t1) * 1000, (time.perf_counter() - t2) * 1000)
    ledger = replace(ledger, next_stateful=stateful_record(rewind, stored, event_time_is_kafka_timestamp))
    return replace(plan, consumer_group=ledger.consumer_group), ledger, cluster


def resolved_offsets(plan: RestartPlan, cluster: ClusterView) -> dict[str, dict[str, int]]:
    """The plan's starting offsets as numbers: earliest as log-start, latest as log-end, seen now."""
    out: dict[str, dict[str, int]] = {}
    for topic, parts in plan.starting_offsets.items():
        for partition, offset in parts.items():
            w = cluster.watermarks.get(TopicPartition(topic, int(partition)))
            if offset == EARLIEST:
                offset = w.log_start_offset if w else 0
            elif offset == LATEST:
                if w is None:
                    continue
                offset = w.log_end_offset
            out.setdefault(topic, {})[partition] = int(offset)
    return out


def _watermarks_json(cluster: ClusterView) -> dict[str, dict[str, list[int]]]:
    out: dict[str, dict[str, list[int]]] = {}
    for tp, w in sorted(cluster.watermarks.items()):
        out.setdefault(tp.topic, {})[str(tp.partition)] = [w.log_start_offset, w.log_end_offset]
    return out


def start_from_ledger(
    pipeline: str,
    topics: Sequence[str] | None = None,
    *,
    topic_pattern: str | None = None,
    bootstrap_servers: str | None = None,
    checkpoint_root: str,
    app_version: str | None = None,
    first_run: str | int | datetime | Mapping[str, Any] | None = None,
    on_data_loss: str = "fail",
    dsn: str | None = None,
    consumer_group: str | None = None,
    new_checkpoint: bool = False,
    kafka_options: Mapping[str, Any] | None = None,
    allow_first_run: bool = False,
    commit_to_kafka: bool = False,
    window: str | None = None,
    slide: str | None = None,
    watermark_delay: str | None = None,
    event_time_is_kafka_timestamp: bool = False,

    adopt_checkpoint: str | None = None,
) -> RestartPlan:
    """Plan a pipeline's start from the ledger: complete ``startingOffsets`` and the checkpoint to use.

    ``topics`` (a list, like ``subscribe``) or ``topic_pattern`` (a regex matched against the whole
    name, like ``subscribePattern``) selects the topics; ``bootstrap_servers`` (default
    ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``) and Spark-style ``kafka_options`` (``kafka.security.protocol``,
    ``kafka.sasl.*``, ``kafka.ssl.*``, ...) reach the cluster the pipeline reads. ``consumer_group``
    defaults to the pipeline's only group in the ledger (AmbiguousConsumerGroup when it has several).

    ``starting_offsets`` names every current partition of every requested topic: the ledger position,
    ``-2`` for partitions the ledger does not know, and for positions outside the broker's log (or
    on a topic deleted and re-created since, told by its Kafka topic id) the ``on_data_loss``
    policy: ``"fail"`` raises ``DataLossError`` naming the partitions and records lost;
    ``"earliest"`` resumes at the log-start offset and records a finding. With no ledger position
    at all, ``first_run`` applies (default ``"earliest"``): ``"earliest"``, ``"latest"``, a
    timestamp (``datetime``, naive = UTC, or epoch ms; each partition starts at its first record at
    or after it, and at latest (-1) when no record is that new), or explicit offsets (dict or JSON;
    unnamed partitions start at earliest). A pipeline the ledger already knows (under another
    consumer group, or on other topics) is never silently started as a first run: that raises
    ``FirstRunRefused`` unless ``first_run`` is given and ``allow_first_run=True``.

    Checkpoints: generations live at ``<checkpoint_root>/gen-<n>-<id>`` (any URI Spark accepts;
    nothing is listed or deleted). The current generation is reused when nothing changed; a fresh,
    empty one is handed out on the first run through the helper, when a reset is pending (the
    reset is then marked consumed), when positions had to be clamped (data loss accepted), when
    ``app_version`` differs from the current generation's, when ``checkpoint_root`` changed, or when
    ``new_checkpoint=True``. A fresh generation is the pipeline's authority: its resolved starting
    offsets become the positions, its findings are stored, and only runs on its checkpoint move
    positions from then on. ``plan.fresh_checkpoint`` says which: when False, Spark resumes from
    the checkpoint and ignores ``startingOffsets``, which are still reported for inspection.
    Nothing is written when an error is raised.

    ``commit_to_kafka=True`` mirrors the resulting positions into the Kafka consumer group (also
    backwards, after a reset: see ``offset_ledger.mirror``); a group with active members is left
    alone and a ``mirror_refused`` finding says so, a Kafka failure only a ``mirror_pending`` one.

    Windowed (append-mode) pipelines: ``window`` (``"10 minutes"``, as in Spark's ``window()``),
    ``slide`` for sliding windows and ``watermark_delay`` (the ``withWatermark`` delay; read back
    from the recorded watermarks when omitted) rewind the starting offsets to where the windows the
    old checkpoint still held open begin (``offset_ledger.stateful``), always on a fresh checkpoint
    generation. ``plan.event_time_floor`` is then the event time before which the new query must
    drop records right after parsing; a ``state_rewind`` finding says what is read again and why.
    With ``event_time_is_kafka_timestamp=True`` the rewind uses the brokers' offsets-for-times at
    the floor (tighter). Refused (StatefulRestartRefused) when the ledger has no watermark.

    ``adopt_checkpoint``: the checkpoint a pipeline ran on before it used the ledger. When the
    ledger has nothing for the pipeline, that checkpoint's last committed batch is imported first
    (``offset_ledger.adopt``) as a generation at that very location, recording ``app_version`` and
    ``checkpoint_root``: the plan then resumes the adopted checkpoint (Spark continues from its own
    files), or, with a different ``app_version`` later, starts a fresh generation at its positions.
    Once the ledger knows the pipeline the argument is ignored, so it can stay in the code. The
    import is its own transaction: when the plan then fails (say, ``DataLossError``), the adopted
    positions stay, exactly as ``offset-ledger import-checkpoint --execute`` would have left them.
    """
    if not checkpoint_root or not str(checkpoint_root).strip():
        raise ConfigError("checkpoint_root is required")
    root = str(checkpoint_root)
    options = dict(kafka_options or {})
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers") or settings().bootstrap_servers
    if not servers:
        raise ConfigError("no Kafka bootstrap servers (bootstrap_servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")

    from offset_ledger.ledger.engine import ensure_schema, make_engine

    started = time.perf_counter()
    engine = make_engine(dsn)
    try:
        ensure_schema(engine)
        with KafkaAdapter(servers, options) as adapter:
            if adopt_checkpoint is not None:
                from offset_ledger.adopt import adopt_if_unknown

                adopt_if_unknown(engine, adopt_checkpoint, pipeline=pipeline, consumer_group=consumer_group,
                                 checkpoint_root=root, app_version=app_version, topic_ids_of=adapter.topic_ids)
            done = restart_with(
                engine, adapter, pipeline=pipeline, consumer_group=consumer_group, topics=topics,
                topic_pattern=topic_pattern, checkpoint_root=root, app_version=app_version, first_run=first_run,
                on_data_loss=on_data_loss, new_checkpoint=new_checkpoint, allow_first_run=allow_first_run,
                window=window, slide=slide, watermark_delay=watermark_delay,
                event_time_is_kafka_timestamp=event_time_is_kafka_timestamp)
        log.debug("start_from_ledger(%s): %.1f ms", pipeline, (time.perf_counter() - started) * 1000)
        return _mirrored(done, engine, servers, options, pipeline, done.consumer_group or pipeline) \
            if commit_to_kafka else done
    finally:
        engine.dispose()


def restart_with(
    engine: Engine, adapter: Any, *, pipeline: str, checkpoint_root: str, consumer_group: str | None = None,
    topics: Sequence[str] | None = None, topic_pattern: str | None = None, app_version: str | None = None,
    first_run: object = None, on_data_loss: str = "fail", new_checkpoint: bool = False,
    allow_first_run: bool = False, window: str | None = None, slide: str | None = None,
    watermark_delay: str | None = None, event_time_is_kafka_timestamp: bool = False,
) -> RestartPlan:
    """``start_from_ledger`` on an open engine and Kafka adapter: reconcile, plan, decide under the lock."""
    # Ground truth first: what the current generation's checkpoint committed and the
    # listener never delivered is recorded before anything is planned from the ledger.
    truth = reconcile_current(engine, pipeline, consumer_group)
    changes: list[str] = []
    for attempt in range(1, _PLAN_ATTEMPTS + 1):
        plan, ledger, cluster = plan_restart(
            engine, adapter, pipeline=pipeline, consumer_group=consumer_group, topics=topics,
            topic_pattern=topic_pattern, first_run=first_run, on_data_loss=on_data_loss,
            allow_first_run=allow_first_run, window=window, slide=slide, watermark_delay=watermark_delay,
            event_time_is_kafka_timestamp=event_time_is_kafka_timestamp)
        done = _decide_under_lock(
            engine, plan, ledger, cluster, pipeline=pipeline, consumer_group=consumer_group,
            checkpoint_root=checkpoint_root, app_version=app_version,
            new_checkpoint=new_checkpoint or window is not None,
            # Nobody named the group: it stays the helper's guess until a run reports its own.
            defaulted_group=consumer_group is None and (
                not ledger.footprint or bool(ledger.generation and ledger.generation.group_defaulted)))
        if isinstance(done, RestartPlan):
            # Reconciliation findings were stored when found; the plan shows them too.
            return replace(done, findings=(*truth, *done.findings)) if truth else done
        changes = done
        log.info("start_from_ledger(%s): the ledger changed while planning (%s); planning again (%d/%d)",
                 pipeline, "; ".join(changes), attempt, _PLAN_ATTEMPTS)
    raise PlanConflict(pipeline, _PLAN_ATTEMPTS, changes)


#: How often a restart plans again when the ledger moved under it before it gives up (PlanConflict).
_PLAN_ATTEMPTS = 3


def reconcile_current(engine: Engine, pipeline: str, consumer_group: str | None) -> tuple[Finding, ...]:
    """Reconcile the pipeline's current generation with its checkpoint; the findings say what happened.

    Nothing to do for a pipeline without a generation (no checkpoint location is known) or with
    several consumer groups and none named (planning raises AmbiguousConsumerGroup next).
    """
    from offset_ledger.reconcile import reconcile

    try:
        with engine.connect() as conn:
            footprint = pipeline_footprint(conn, pipeline)
            if consumer_group is None and len(footprint) > 1:
                return ()
            group = consumer_group or choose_group(pipeline, footprint)
            current = gens.current_generation(conn, pipeline, group, offsets=False)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the current generation") from exc
    if current is None:
        return ()
    done = reconcile(engine, current.location, pipeline=pipeline, consumer_group=group,
                     expected_query_id=current.query_id)
    return done.findings


def _decide_under_lock(
    engine: Engine, plan: RestartPlan, ledger: LedgerView, cluster: ClusterView, *, pipeline: str,
    consumer_group: str | None, checkpoint_root: str, app_version: str | None, new_checkpoint: bool,
    defaulted_group: bool,
) -> RestartPlan | list[str]:
    """Under the pipeline lock: the final plan (a new generation written, or the current one reused),
    or what changed since ``ledger`` was read (nothing written; the caller plans again).

    The lock is the one resets and the recorder take: no batch, reset or other restart can commit
    between the check that the plan's inputs still hold and the generation written from them. So a
    reset is consumed only by the generation whose positions carry it.
    """
    group = ledger.consumer_group
    try:
        with engine.begin() as conn:
            lock_pipeline(conn, pipeline, group)
            now = read_ledger_on(conn, pipeline, consumer_group, list(cluster.topics))
            changes = ledger_changes(ledger, now, cluster.topics)
            if changes:
                return changes
            current = ledger.generation
            reason = new_generation_reason(
                has_current=current is not None,
                current_app_version=current.app_version if current else None,
                current_checkpoint_root=current.checkpoint_root if current else None,
                app_version=app_version, checkpoint_root=checkpoint_root,
                # A rewind only takes effect on an empty checkpoint (the old one holds the state it replaces).
                pending_resets=bool(ledger.pending_reset_ids), requested=new_checkpoint,
                data_loss=any(f.kind == "data_loss" for f in plan.findings))
            if reason is None:
                assert current is not None
                log.info("resuming checkpoint generation %s of %s at %s; Spark ignores startingOffsets",
                         current.generation, pipeline, current.location)
                return replace(plan, checkpoint_location=current.location, fresh_checkpoint=False,
                               generation=current.generation)
            dropped = [(f.topic, f.partition) for f in plan.findings
                       if f.kind == "removed_partition" and f.topic is not None and f.partition is not None]
            consumed_findings = [
                Finding("reset_consumed", f"pending reset {rid} applied through a fresh checkpoint generation",
                        details={"reset_id": rid}) for rid in ledger.pending_reset_ids]
            generation, consumed = gens.create_generation(
                conn, pipeline=pipeline, consumer_group=group, checkpoint_root=checkpoint_root,
                app_version=app_version if app_version is not None else (current.app_version if current else None),
                reason=reason, starting_offsets=plan.starting_offsets,
                resolved_offsets=resolved_offsets(plan, cluster), topic_ids=cluster.topic_ids,
                watermarks=_watermarks_json(cluster), dropped_partitions=dropped,
                restart_findings=list(plan.findings) + consumed_findings,
                consume_reset_ids=ledger.pending_reset_ids, stateful=ledger.next_stateful,
                group_defaulted=defaulted_group)
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
                   findings=tuple(findings), generation=generation.generation)


def _mirrored(plan: RestartPlan, engine: Any, servers: str, options: Mapping[str, Any], pipeline: str,
              group: str) -> RestartPlan:
    """The plan after mirroring the ledger's positions into the Kafka group; problems become findings."""
    from offset_ledger.errors import KafkaError, MirrorRefused
    from offset_ledger.mirror import record_refusal, sync_group

    try:
        with KafkaAdapter(servers, options) as adapter:
            sync_group(engine, adapter, pipeline, group)
        return plan
    except MirrorRefused as exc:
        log.error("offset-ledger mirror: %s", exc.message)
        record_refusal(engine, pipeline, group, exc.message, exc.members)
        extra = Finding("mirror_refused", exc.message, details={"consumer_group": group})
    except KafkaError as exc:
        # The generation is recorded; a listener with commit_to_kafka (or `offset-ledger mirror`) catches up.
        log.warning("offset-ledger mirror: consumer group %s not synced: %s", group, exc.message)
        extra = Finding("mirror_pending", f"consumer group {group!r} not synced: {exc.message}",
                        details={"consumer_group": group})
    return replace(plan, findings=tuple(plan.findings) + (extra,))
