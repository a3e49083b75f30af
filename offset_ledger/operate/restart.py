"""start_from_ledger: reconcile with the checkpoint, plan once, and write under the pipeline lock.

``start_from_ledger`` (and ``Pipeline``) turn their arguments into a ``RestartRequest``
(``rules.restart_request``) and two addresses (``offset_ledger.addresses``), open the context
(``Operations.open``) and call the one verb, ``restart(ops, request)``: reconcile the job's sinks
and the current generation with its checkpoint, plan (read-only, ``operate.restart_plan``: the
reads once, and the requirements the plan rests on), and under the lock check the requirements
(``rules.restart_requirements``) and write the new checkpoint generation and the resets it consumes
in one transaction, or plan again when the ledger moved.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.capture.reconcile import CurrentGeneration, reconcile
from offset_ledger.errors import ConfigError, KafkaError, MirrorRefused, PlanConflict
from offset_ledger.kafka.mirror import record_refusal, sync_group
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger import reconcile_store, sink_store
from offset_ledger.ledger.engine import ensure_schema, translate_db_error
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.policy_store import current_policies
from offset_ledger.ledger.restart_state import ledger_now
from offset_ledger.operate.adopt import adopt_if_unknown
from offset_ledger.operate.gc_pause import gc_paused
from offset_ledger.operate.move_cost import plan_cost
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart_plan import (
    LedgerView,
    PlanInputs,
    compose,
    read_inputs,
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
from offset_ledger.rules.restart_request import RestartRequest
from offset_ledger.rules.restart_requirements import unmet
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
    # The arguments as values, each checked once (bad input raises here, before any connection).
    named = tuple(topics) if topics is not None and not isinstance(topics, str) else topics
    request = RestartRequest(
        PipelineRef(pipeline, consumer_group),
        RestartOptions(topics=named, topic_pattern=topic_pattern, checkpoint_root=absolute_root(checkpoint_root),
                       app_version=app_version, new_checkpoint=new_checkpoint, allow_first_run=allow_first_run,
                       adopt_checkpoint=adopt_checkpoint),
        Policies(first_run=first_run, on_data_loss=on_data_loss, window=window, slide=slide,  # type: ignore[arg-type]
                 watermark_delay=watermark_delay, event_time_is_kafka_timestamp=event_time_is_kafka_timestamp,
                 commit_to_kafka=commit_to_kafka),
        sinks=sink_names(sinks))
    return restart_at(LedgerAddress.resolve(dsn), KafkaAddress.resolve(bootstrap_servers, kafka_options), request,
                      tuple(sinks))


def restart_at(ledger: LedgerAddress, kafka: KafkaAddress, request: RestartRequest,
               sinks: Sequence[Sink] = ()) -> RestartPlan:
    """``restart(ops, request, sinks)`` in a context opened over the two addresses and closed after:
    the last step of ``start_from_ledger`` and of ``Pipeline.plan``/``start``."""
    kafka.require()
    # The collector paused for the call: 10,000 partitions' reads and writes make ~100,000
    # short-lived objects, and collections walking the caller's whole heap would each scan it all.
    with gc_paused():
        started = time.perf_counter()
        ops = Operations.open(ledger, kafka)
        try:
            # The Kafka handshake (connect, API versions) overlaps the schema check and the ledger
            # reads; the cluster is only asked after the ledger was read (the plan's order).
            ops.kafka.connect_in_background()
            ensure_schema(ops.engine)
            done = restart(ops, request, sinks)
        finally:
            ops.close()
        log.debug("start_from_ledger(%s): %.1f ms", request.pipeline, (time.perf_counter() - started) * 1000)
        return done


def absolute_root(checkpoint_root: str | None) -> str:
    """``checkpoint_root`` as Spark reports it: a relative local root is where this process runs."""
    if not checkpoint_root or not str(checkpoint_root).strip():
        raise ConfigError("checkpoint_root is required")
    root = str(checkpoint_root)
    return root if "://" in root or root.startswith(("/", "file:")) else os.path.abspath(root)


def sink_names(sinks: Sequence[Any]) -> tuple[str, ...] | None:
    """The names of the job's sinks (None: none passed); refused before the ledger is touched when one is
    not a sink (a missing ``reconcile`` would fail half way)."""
    if not sinks:
        return None

    strays = [type(s).__name__ for s in sinks if not isinstance(s, Sink)]
    if strays:
        raise ConfigError(f"sinks: {', '.join(strays)} is not a sink (offset_ledger.sinks.Sink: spec, bind, "
                          f"write, reconcile); pass the sink objects the query writes with")
    return tuple(s.spec.sink for s in sinks)


def restart(ops: Operations, request: RestartRequest, sinks: Sequence[Sink] = ()) -> RestartPlan:
    """The verb of ``start_from_ledger`` and ``Pipeline`` over the context's ledger and Kafka cluster.

    In order: each of ``sinks`` (the objects ``request.sinks`` names) reconciles its target with the
    ledger; ``adopt_checkpoint`` is imported when the ledger does not know the pipeline; the current
    generation is reconciled with its checkpoint; then the plan is computed once and written under the
    lock when its requirements hold, else planned again (``PlanConflict`` after ``PLAN_ATTEMPTS``).
    ``request.given`` takes the pipeline's stored policies where not given, then the defaults; one
    given where a stored policy differs is used for this call and reported (``policy_override``).
    """
    reconciled = tuple(f for sink in sinks for f in sink.reconcile(ops.engine))
    if request.options.adopt_checkpoint is not None:
        adopt_if_unknown(ops, request.ref, request.options)
    use, overrides = policies_in_effect(ops, request.pipeline, request.given)
    # Ground truth first: what the current generation's checkpoint committed and the
    # listener never delivered is recorded before anything is planned from the ledger.
    truth = reconcile_current(ops.engine, request.ref)
    plan, inputs, written = plan_and_write(ops, request, use, truth)
    # What starting away from the ledger's positions costs; Spark ignores startingOffsets
    # when it resumes a checkpoint, so only a fresh one moves anything.
    cost = plan_cost(ops.kafka, plan.starting_offsets, inputs.ledger.positions, inputs.cluster.watermarks) \
        if written.fresh else None
    group = plan.consumer_group or request.pipeline
    policies = use.as_dict()
    mirrored = mirror(ops, request.pipeline, group) if policies.get("commit_to_kafka") else ()
    # Reconciliation findings were stored when found; the plan shows them too.
    return replace(plan, checkpoint_location=written.location, fresh_checkpoint=written.fresh,
                   generation=written.generation, policies=policies, cost=cost,
                   findings=(*reconciled, *truth.findings, *overrides, *plan.findings, *written.findings,
                             *mirrored))


def plan_and_write(ops: Operations, request: RestartRequest, use: Policies,
                   truth: CheckpointTruth) -> tuple[RestartPlan, PlanInputs, Written]:
    """The plan, computed once per attempt, and what the write step under the lock made of it; planned
    again (up to ``PLAN_ATTEMPTS``) while a requirement fails: the ledger moved since it was read."""
    window = use.window_spec()
    group = truth.group
    changes: list[str] = []
    for attempt in range(1, PLAN_ATTEMPTS + 1):
        if attempt > 1 and not group.named:
            group = resolve_ref(ops.engine, request.ref)  # what moved may be the pipeline's groups
        inputs = read_inputs(ops, group, request.options, use, request.sinks)
        rewind = request.window_asked
        plan, ledger = compose(ops, inputs, use, window if rewind else None)
        if window is not None and not rewind and not ledger.pending_reset_ids and generation_reason(
                plan, ledger, request.options, truth) not in (None, "first"):
            # The stored window applies to this upgrade: the rewind needs the fresh generation anyway.
            # The same reads: only the rewind and the pure resolve run again.
            rewind = True
            plan, ledger = compose(ops, inputs, use, window)
        written = write_under_lock(ops.engine, plan, ledger, inputs, request.options, truth, rewind=rewind)
        if isinstance(written, Written):
            return plan, inputs, written
        changes = written
        log.info("start_from_ledger(%s): the ledger changed while planning (%s); planning again (%d/%d)",
                 request.pipeline, "; ".join(changes), attempt, PLAN_ATTEMPTS)
    raise PlanConflict(request.pipeline, PLAN_ATTEMPTS, changes)


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


def generation_reason(plan: RestartPlan, ledger: LedgerView, options: RestartOptions, truth: CheckpointTruth,
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
PLAN_ATTEMPTS = 3


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


@dataclass(frozen=True)
class Written:
    """What the write step made of a plan under the lock: the generation it runs on, fresh or resumed, and
    the ``reset_consumed`` findings of the resets a fresh one consumed."""

    location: str
    generation: int
    fresh: bool
    findings: tuple[Finding, ...] = ()


def write_under_lock(
    engine: Engine, plan: RestartPlan, ledger: LedgerView, inputs: PlanInputs, options: RestartOptions,
    truth: CheckpointTruth, *, rewind: bool,
) -> Written | list[str]:
    """Under the pipeline lock: the generation the plan runs on (a new one written, or the current one
    reused), or what changed since the plan's inputs were read (its failed requirements; nothing written,
    the caller plans again).

    The lock is the one resets, the recorder and the sinks take: no batch, reset, sink commit or other
    restart can commit between the check that the plan's requirements hold and the generation written
    from them. So a reset is consumed only by the generation whose positions carry it. A rewind only
    takes effect on an empty checkpoint (the old one holds the state it replaces): ``rewind`` asks for
    a fresh one. ``ledger``: the view ``compose`` returned (with the stateful inputs to store).
    """
    pipeline, group = ledger.group.pipeline, ledger.consumer_group
    requirements = inputs.requirements()
    # Nobody named the group: it stays the helper's guess until a run reports its own.
    defaulted_group = not ledger.group.named and (
        not ledger.footprint or bool(ledger.generation and ledger.generation.group_defaulted))
    t0 = time.perf_counter()
    try:
        with engine.begin() as conn:
            lock_pipeline(conn, pipeline, group)
            changes = unmet(requirements, ledger_now(conn, pipeline, group, requirements))
            t1 = time.perf_counter()
            if changes:
                return changes
            current = ledger.generation
            reason = generation_reason(plan, ledger, options, truth, new_checkpoint=rewind)
            if reason is None:
                assert current is not None
                log.info("resuming checkpoint generation %s of %s at %s; Spark ignores startingOffsets",
                         current.generation, pipeline, current.location)
                return Written(current.location, current.generation, fresh=False)
            dropped = [(f.topic, f.partition) for f in plan.findings
                       if f.kind == "removed_partition" and f.topic is not None and f.partition is not None]
            consumed_findings = [
                Finding("reset_consumed", f"pending reset {rid} applied through a fresh checkpoint generation",
                        details={"reset_id": rid}) for rid in ledger.pending_reset_ids]
            generation, consumed = gens.create_generation(conn, gens.NewGeneration(
                pipeline=pipeline, consumer_group=group, checkpoint_root=str(options.checkpoint_root),
                app_version=options.app_version if options.app_version is not None else (
                    current.app_version if current else None),
                reason=reason, starting_offsets=plan.starting_offsets,
                resolved_offsets=resolved_offsets(plan, inputs.cluster), topic_ids=inputs.cluster.topic_ids,
                watermarks=watermarks_json(inputs.cluster), dropped_partitions=dropped,
                restart_findings=list(plan.findings) + consumed_findings,
                consume_reset_ids=ledger.pending_reset_ids, stateful=ledger.next_stateful,
                group_defaulted=defaulted_group))
            t2 = time.perf_counter()
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "recording the checkpoint generation") from exc
    log.debug("new generation of %s under the lock: requirements %.1f ms, generation and baseline %.1f ms, "
              "commit %.1f ms", pipeline, (t1 - t0) * 1000, (t2 - t1) * 1000, (time.perf_counter() - t2) * 1000)
    return Written(generation.location, generation.generation, fresh=True, findings=tuple(
        Finding("reset_consumed",
                f"pending reset {rid} applied through fresh checkpoint generation {generation.generation}",
                details={"reset_id": rid, "generation": generation.generation,
                         "checkpoint_location": generation.location})
        for rid in consumed))


def mirror(ops: Operations, pipeline: str, group: str) -> tuple[Finding, ...]:
    """Mirror the ledger's positions into the Kafka group (``commit_to_kafka``); problems become findings."""
    try:
        sync_group(ops.engine, ops.kafka, pipeline, group)
        return ()
    except MirrorRefused as exc:
        log.error("offset-ledger mirror: %s", exc.message)
        record_refusal(ops.engine, pipeline, group, exc.message, exc.members)
        return (Finding("mirror_refused", exc.message, details={"consumer_group": group}),)
    except KafkaError as exc:
        # The generation is recorded; a listener with commit_to_kafka (or `offset-ledger mirror`) catches up.
        log.warning("offset-ledger mirror: consumer group %s not synced: %s", group, exc.message)
        return (Finding("mirror_pending", f"consumer group {group!r} not synced: {exc.message}",
                        details={"consumer_group": group}),)
