"""start_from_ledger: reconcile with the checkpoint, plan, and decide under the pipeline lock.

Planning is read-only (``offset_ledger.operate.restart_plan``); the verb ``restart_with(ops, ...)``
reconciles the current generation with its checkpoint first, and writes the new checkpoint
generation and the resets it consumes in one transaction, under the lock, only when what the plan
read still holds. ``start_from_ledger`` is the user's entry: its arguments become values
(``rules.restart_options``, ``rules.policies``) and a context (``operate.operations.Operations``)
over its ledger and Kafka cluster, and it calls the verb.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

# Imported with this module, not on a restart's first call (it was 26 ms of a 10,000-partition
# restart there, issue 27): `from offset_ledger import start_from_ledger` pays it before timing matters.
from offset_ledger.capture.reconcile import CurrentGeneration, reconcile
from offset_ledger.config import settings
from offset_ledger.errors import ConfigError, PlanConflict
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger import reconcile_store, sink_store
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.policy_store import current_policies
from offset_ledger.ledger.position_check import positions_moved
from offset_ledger.operate.gc_pause import gc_paused
from offset_ledger.operate.move_cost import plan_cost
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart_plan import (
    ClusterView,
    LedgerView,
    ledger_changes,
    plan_restart,
    read_ledger_on,
    resolve_ref,
    resolve_ref_on,
    resolved_offsets,
    watermarks_json,
)
from offset_ledger.rules.incarnation import Incarnation
from offset_ledger.rules.model import Finding
from offset_ledger.rules.plan import RestartPlan
from offset_ledger.rules.policies import Policies
from offset_ledger.rules.resolver import new_generation_reason
from offset_ledger.rules.restart_options import GroupRef, PipelineRef, RestartOptions

if TYPE_CHECKING:  # the annotation only: a restart imports no sink code until a sink is passed
    from offset_ledger.sinks.protocol import Sink

log = logging.getLogger(__name__)


def start_from_ledger(
    pipeline: str,
    topics: Sequence[str] | None = None,
    *,
    topic_pattern: str | None = None,
    bootstrap_servers: str | None = None,
    checkpoint_root: str,
    app_version: str | None = None,
    first_run: str | int | datetime | Mapping[str, Any] | None = None,
    on_data_loss: str | None = None,
    dsn: str | None = None,
    consumer_group: str | None = None,
    new_checkpoint: bool = False,
    kafka_options: Mapping[str, Any] | None = None,
    allow_first_run: bool = False,
    commit_to_kafka: bool | None = None,
    window: str | None = None,
    slide: str | None = None,
    watermark_delay: str | None = None,
    event_time_is_kafka_timestamp: bool | None = None,
    adopt_checkpoint: str | None = None,
    sinks: Sequence[Sink] = (),
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
    or after it, and at the log-end offset seen at planning when no record is that new), or explicit offsets (dict or JSON;
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
    backwards, after a reset: see ``offset_ledger.kafka.mirror``); a group with active members is left
    alone and a ``mirror_refused`` finding says so, a Kafka failure only a ``mirror_pending`` one.

    Windowed (append-mode) pipelines: ``window`` (``"10 minutes"``, as in Spark's ``window()``),
    ``slide`` for sliding windows and ``watermark_delay`` (the ``withWatermark`` delay; read back
    from the recorded watermarks when omitted) rewind the starting offsets to where the windows the
    old checkpoint still held open begin (``offset_ledger.rules.stateful``), always on a fresh checkpoint
    generation. ``plan.event_time_floor`` is then the event time before which the new query must
    drop records right after parsing; a ``state_rewind`` finding says what is read again and why.
    With ``event_time_is_kafka_timestamp=True`` the rewind uses the brokers' offsets-for-times at
    the floor (tighter). Refused (StatefulRestartRefused) when the ledger has no watermark.

    ``adopt_checkpoint``: the checkpoint a pipeline ran on before it used the ledger. When the
    ledger has nothing for the pipeline, that checkpoint's last committed batch is imported first
    (``offset_ledger.operate.adopt``) as a generation at that very location, recording ``app_version`` and
    ``checkpoint_root``: the plan then resumes the adopted checkpoint (Spark continues from its own
    files), or, with a different ``app_version`` later, starts a fresh generation at its positions.
    Once the ledger knows the pipeline the argument is ignored, so it can stay in the code. The
    import is its own transaction: when the plan then fails (say, ``DataLossError``), the adopted
    positions stay, exactly as ``offset-ledger import-checkpoint --execute`` would have left them.

    ``sinks``: the pipeline's transactional sinks (``offset_ledger.sinks``). One whose target lives
    in another database than the ledger is reconciled first: batches the target committed and the
    ledger lacks (a driver lost between the two commits) are recorded, so the plan starts from what
    the sink committed (a ``sink_reconciled`` finding says so).
    """
    # The arguments as values, each checked once (bad input raises here, before any connection):
    # everything below takes these (``offset_ledger.rules.restart_options``, ``rules.policies``).
    if not checkpoint_root or not str(checkpoint_root).strip():
        raise ConfigError("checkpoint_root is required")
    root = str(checkpoint_root)
    if "://" not in root and not root.startswith(("/", "file:")):
        # A relative local root is where this process runs; Spark reports the absolute location.
        root = os.path.abspath(root)
    ref = PipelineRef(pipeline, consumer_group)
    restart = RestartOptions(
        topics=tuple(topics) if topics is not None and not isinstance(topics, str) else topics,  # type: ignore[arg-type]
        topic_pattern=topic_pattern, checkpoint_root=root, app_version=app_version, new_checkpoint=new_checkpoint,
        allow_first_run=allow_first_run, adopt_checkpoint=adopt_checkpoint)
    given = Policies(first_run=first_run, on_data_loss=on_data_loss, window=window, slide=slide,  # type: ignore[arg-type]
                     watermark_delay=watermark_delay, event_time_is_kafka_timestamp=event_time_is_kafka_timestamp,
                     commit_to_kafka=commit_to_kafka)
    targets = tuple(sinks)
    if targets:
        from offset_ledger.sinks.protocol import Sink

        strays = [type(s).__name__ for s in targets if not isinstance(s, Sink)]
        if strays:
            # Refused before the ledger is touched (a missing reconcile would fail half way).
            raise ConfigError(f"sinks: {', '.join(strays)} is not a sink (offset_ledger.sinks.Sink: spec, bind, "
                              f"write, reconcile); pass the sink objects the query writes with")
    options = dict(kafka_options or {})
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers") or settings().bootstrap_servers
    if not servers:
        raise ConfigError("no Kafka bootstrap servers (bootstrap_servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")

    from offset_ledger.ledger.engine import ensure_schema, make_engine

    # The collector paused for the call: 10,000 partitions' reads and writes make ~100,000
    # short-lived objects, and collections walking the caller's whole heap cost tens of ms each
    # (``offset_ledger.operate.gc_pause``).
    with gc_paused():
        started = time.perf_counter()
        adapter = KafkaAdapter(servers, options)
        # The Kafka handshake (connect, API versions) overlaps the engine, the schema check and the
        # ledger reads; the cluster is only asked after the ledger was read (the plan's order).
        adapter.connect_in_background()
        ops = Operations(make_engine(dsn), kafka=adapter)
        try:
            ensure_schema(ops.engine)
            sink_findings = tuple(f for sink in targets for f in sink.reconcile(ops.engine))
            with adapter:
                if restart.adopt_checkpoint is not None:
                    from offset_ledger.operate.adopt import adopt_if_unknown

                    adopt_if_unknown(ops, ref, restart)
                # The job's sinks, by name: each is judged on its own commits (rules.sink_ahead.sink_plan).
                named = [s.spec.sink for s in targets] if targets else None
                done = restart_with(ops, ref, restart, given, sinks=named)
            if sink_findings:
                done = replace(done, findings=(*sink_findings, *done.findings))
            log.debug("start_from_ledger(%s): %.1f ms", pipeline, (time.perf_counter() - started) * 1000)
            return _mirrored(done, ops.engine, servers, options, pipeline, done.consumer_group or pipeline) \
                if done.policies.get("commit_to_kafka") else done
        finally:
            # The adapter is closed already unless the schema check failed (it waits for the handshake).
            ops.close()


def restart_with(
    ops: Operations, ref: PipelineRef, options: RestartOptions, given: Policies = Policies(),
    sinks: Sequence[str] | None = None,
) -> RestartPlan:
    """The verb of ``start_from_ledger`` over the context's ledger and Kafka cluster: reconcile, plan,
    decide under the lock.

    ``given``: the policies the call gave (None: not given); they take the pipeline's stored
    policies (``offset_ledger.rules.policies``) where not given, then the defaults; one given where
    a stored policy differs is used for this call and reported (``policy_override``). A stored
    window applies when a fresh generation is opened anyway (an upgrade); ``window=`` given in the
    call asks for one, as before. ``sinks``: the names of the sinks the job writes with (None: every sink
    that committed since the last deliberate start); each is judged on its own commits
    (``rules.sink_ahead.sink_plan``).
    """
    if options.checkpoint_root is None:
        raise ConfigError("checkpoint_root is required")
    engine = ops.engine
    use, overrides = policies_in_effect(ops, ref.pipeline, given)
    window = use.window_spec()
    asked = given.window is not None
    # Ground truth first: what the current generation's checkpoint committed and the
    # listener never delivered is recorded before anything is planned from the ledger.
    t0 = time.perf_counter()
    truth = reconcile_current(engine, ref)
    log.debug("reconciled %s with its checkpoint in %.1f ms", ref.pipeline, (time.perf_counter() - t0) * 1000)
    group = truth.group
    changes: list[str] = []
    for attempt in range(1, _PLAN_ATTEMPTS + 1):
        if attempt > 1 and not group.named:
            group = resolve_ref(engine, ref)  # what moved may be the pipeline's groups
        rewind = asked
        plan, ledger, cluster = plan_restart(ops, group, options, use, window if rewind else None, sinks)
        if window is not None and not asked and not ledger.pending_reset_ids and _generation_reason(
                plan, ledger, options, truth) not in (None, "first"):
            # The stored window applies to this upgrade: the rewind needs the fresh generation anyway.
            rewind = True
            plan, ledger, cluster = plan_restart(ops, group, options, use, window, sinks)
        done = _decide_under_lock(engine, plan, ledger, cluster, options, truth, rewind=rewind)
        if isinstance(done, RestartPlan):
            # What starting away from the ledger's positions costs; Spark ignores startingOffsets
            # when it resumes a checkpoint, so only a fresh one moves anything.
            cost = plan_cost(ops.kafka, done.starting_offsets, ledger.positions, cluster.watermarks) \
                if done.fresh_checkpoint else None
            # Reconciliation findings were stored when found; the plan shows them too.
            return replace(done, findings=(*truth.findings, *overrides, *done.findings), policies=use.as_dict(),
                           cost=cost)
        changes = done
        log.info("start_from_ledger(%s): the ledger changed while planning (%s); planning again (%d/%d)",
                 ref.pipeline, "; ".join(changes), attempt, _PLAN_ATTEMPTS)
    raise PlanConflict(ref.pipeline, _PLAN_ATTEMPTS, changes)


def policies_in_effect(ops: Operations, pipeline: str, given: Policies) -> tuple[Policies, tuple[Finding, ...]]:
    """The policies a restart of ``pipeline`` uses: ``given`` over the stored ones over the defaults,
    and a ``policy_override`` finding per given one that differs from a stored one (``Policies.over``)."""
    try:
        with ops.engine.connect() as conn:
            stored = Policies.stored(current_policies(conn, pipeline))
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the pipeline's policies") from exc
    return given.over(stored)


@dataclass(frozen=True)
class CheckpointTruth:
    """What reconciling the current generation with its checkpoint found, before anything is planned."""

    #: the pipeline's group, resolved once (``PipelineRef.resolve``) for the whole restart
    group: GroupRef
    findings: tuple[Finding, ...] = ()
    #: the generation whose checkpoint is no longer the one that ran on it, and what it is now
    #: (gone, empty, re-created: ``rules.incarnation``); None and "same" when it still is
    lost_generation_id: int | None = None
    incarnation: Incarnation = "same"


def _generation_reason(plan: RestartPlan, ledger: LedgerView, options: RestartOptions, truth: CheckpointTruth,
                       *, new_checkpoint: bool = False) -> str | None:
    """Why this plan needs a fresh checkpoint generation (``resolver.new_generation_reason``), or None.

    A lost checkpoint (``truth``) counts while its generation is the current one.
    """
    current = ledger.generation
    lost = current is not None and truth.lost_generation_id == current.id
    return new_generation_reason(
        checkpoint_incarnation=truth.incarnation if lost else None,
        has_current=current is not None, current_app_version=current.app_version if current else None,
        current_checkpoint_root=current.checkpoint_root if current else None, app_version=options.app_version,
        checkpoint_root=str(options.checkpoint_root), pending_resets=bool(ledger.pending_reset_ids),
        requested=options.new_checkpoint or new_checkpoint,
        data_loss=any(f.kind == "data_loss" for f in plan.findings),
        sink_ahead=any(f.kind in ("sink_ahead", "sink_behind") for f in plan.findings))


#: How often a restart plans again when the ledger moved under it before it gives up (PlanConflict).
_PLAN_ATTEMPTS = 3


def reconcile_current(engine: Engine, ref: PipelineRef) -> CheckpointTruth:
    """Resolve the pipeline's group and reconcile its current generation with its checkpoint.

    Nothing to reconcile for a pipeline without a generation (no checkpoint location is known).
    """
    try:
        with engine.connect() as conn:
            group = resolve_ref_on(conn, ref)
            current = gens.current_generation(conn, group.pipeline, group.consumer_group, offsets=False)
            # A sink's commit names the generation too: a query ran there even if no listener said so.
            ran = current is not None and (current.query_id is not None
                                           or reconcile_store.generation_has_sink_commits(conn, current.id))
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the current generation") from exc
    if current is None:
        return CheckpointTruth(group)
    def baseline() -> dict[tuple[str, int], int]:
        with engine.connect() as conn:
            return sink_store.generation_start(conn, current.id)

    done = reconcile(engine, current.location, pipeline=group.pipeline, consumer_group=group.consumer_group,
                     current=CurrentGeneration(current.generation, current.query_id, ran, baseline))
    if done.incarnation == "same":
        return CheckpointTruth(group, done.findings)
    return CheckpointTruth(group, done.findings, current.id, done.incarnation)


def _decide_under_lock(
    engine: Engine, plan: RestartPlan, ledger: LedgerView, cluster: ClusterView, options: RestartOptions,
    truth: CheckpointTruth, *, rewind: bool,
) -> RestartPlan | list[str]:
    """Under the pipeline lock: the final plan (a new generation written, or the current one reused),
    or what changed since ``ledger`` was read (nothing written; the caller plans again).

    The lock is the one resets and the recorder take: no batch, reset or other restart can commit
    between the check that the plan's inputs still hold and the generation written from them. So a
    reset is consumed only by the generation whose positions carry it. A rewind only takes effect on
    an empty checkpoint (the old one holds the state it replaces): ``rewind`` asks for a fresh one.
    """
    pipeline, group = ledger.group.pipeline, ledger.consumer_group
    app_version = options.app_version
    # Nobody named the group: it stays the helper's guess until a run reports its own.
    defaulted_group = not ledger.group.named and (
        not ledger.footprint or bool(ledger.generation and ledger.generation.group_defaulted))
    t0 = time.perf_counter()
    try:
        with engine.begin() as conn:
            lock_pipeline(conn, pipeline, group)
            now = read_ledger_on(conn, ledger.group, list(cluster.topics), with_positions=False)
            moved = positions_moved(conn, pipeline, now.consumer_group, cluster.topics, ledger.positions)
            changes = ledger_changes(ledger, now, cluster.topics, moved=moved)
            t1 = time.perf_counter()
            if changes:
                return changes
            current = ledger.generation
            reason = _generation_reason(plan, ledger, options, truth, new_checkpoint=rewind)
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
                conn, pipeline=pipeline, consumer_group=group, checkpoint_root=str(options.checkpoint_root),
                app_version=app_version if app_version is not None else (current.app_version if current else None),
                reason=reason, starting_offsets=plan.starting_offsets,
                resolved_offsets=resolved_offsets(plan, cluster), topic_ids=cluster.topic_ids,
                watermarks=watermarks_json(cluster), dropped_partitions=dropped,
                restart_findings=list(plan.findings) + consumed_findings,
                consume_reset_ids=ledger.pending_reset_ids, stateful=ledger.next_stateful,
                group_defaulted=defaulted_group)
            t2 = time.perf_counter()
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "recording the checkpoint generation") from exc
    log.debug("new generation of %s under the lock: re-read and compare %.1f ms, generation and baseline %.1f ms, "
              "commit %.1f ms", pipeline, (t1 - t0) * 1000, (t2 - t1) * 1000, (time.perf_counter() - t2) * 1000)
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
    from offset_ledger.kafka.mirror import record_refusal, sync_group

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


#: The fresh-or-resume decision, public for ``operate.restart_preview`` (``offset-ledger plan``), which
#: previews it without writing: one decision, never a second copy of it.
generation_reason = _generation_reason
