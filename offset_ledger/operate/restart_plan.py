"""The read-only half of a restart: read the ledger and the cluster, resolve startingOffsets.

``read_ledger`` (one connection) -> ``read_cluster`` (the Kafka adapter), joined by ``read_inputs``;
then ``compose`` (the stateful rewind, ``resolver.resolve``, pure) and the inputs' ``requirements``
(``rules.restart_requirements``): what the plan rests on. ``plan_restart(ops, ...)`` is both steps
over the ``Operations`` context (its ledger and its Kafka); the CLI's ``resolve`` calls it, the
benchmarks time its steps. ``offset_ledger.operate.restart`` decides and writes under the pipeline
lock, once the requirements still hold.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.errors import FirstRunRefused, InvalidRestartOptions
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.queries import current_positions, pipeline_footprint
from offset_ledger.ledger.restart_state import sink_fences
from offset_ledger.ledger.sink_store import generation_start, registered_sinks, sink_commits_in_window
from offset_ledger.operate.restart_stateful import state_rewind, stateful_record, stored_stateful
from offset_ledger.rules.model import (
    EARLIEST,
    LATEST,
    OnDataLoss,
    Position,
    TopicPartition,
    Watermarks,
)
from offset_ledger.rules.plan import RestartPlan
from offset_ledger.rules.policies import Policies
from offset_ledger.rules.resolver import TopicIncarnation, is_first_run, resolve
from offset_ledger.rules.restart_requirements import (
    GenerationUnchanged,
    GroupsUnchanged,
    PendingResetsUnchanged,
    PositionsUnchanged,
    Requirement,
    SinkFence,
)
from offset_ledger.rules.restart_options import (
    FirstRun,
    FirstRunTimestamp,
    GroupRef,
    PipelineRef,
    RestartOptions,
    parse_on_data_loss,
)
from offset_ledger.rules.sink_ahead import SinkPlan, sink_plan
from offset_ledger.rules.stateful import WindowSpec

if TYPE_CHECKING:
    from offset_ledger.operate.operations import Operations

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LedgerView:
    """What the restart reads from the ledger, read in an order that makes consuming resets safe."""

    group: GroupRef
    positions: tuple[Position, ...]
    pending_reset_ids: tuple[int, ...]
    generation: gens.CheckpointGeneration | None
    #: everything the ledger holds for the pipeline, per consumer group (``queries.pipeline_footprint``)
    footprint: Mapping[str, Mapping[str, Any]] | None = None
    #: set by ``compose``: the stateful inputs a generation opened from this plan stores
    next_stateful: Mapping[str, Any] | None = None
    #: each of the pipeline's sinks' fence, its last committed sequence (``ledger.restart_state.sink_fences``)
    sink_fences: Mapping[str, int] = field(default_factory=dict)

    @property
    def consumer_group(self) -> str:
        return self.group.consumer_group


@dataclass(frozen=True)
class ClusterView:
    """The requested topics as resolved on the cluster, their watermarks and any time look-ups."""

    topics: tuple[str, ...]
    watermarks: Mapping[TopicPartition, Watermarks]
    offsets_for_time: Mapping[TopicPartition, int | None] | None
    topic_ids: Mapping[str, str] = ()  # type: ignore[assignment]


def resolve_ref(engine: Engine, ref: PipelineRef) -> GroupRef:
    """``ref`` resolved against the groups the ledger holds for the pipeline (``PipelineRef.resolve``)."""
    try:
        with engine.connect() as conn:
            return resolve_ref_on(conn, ref)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the pipeline's consumer groups") from exc


def resolve_ref_on(conn: Connection, ref: PipelineRef) -> GroupRef:
    """``resolve_ref`` on an open connection."""
    if ref.consumer_group is not None:
        return ref.resolve(())  # named: nothing to read
    return ref.resolve(pipeline_footprint(conn, ref.pipeline))


def read_ledger(engine: Engine, group: GroupRef, topics: Sequence[str] | None) -> LedgerView:
    """Pending resets, then positions, then the current generation of ``group`` (``topics=None``: every topic)."""
    try:
        with engine.connect() as conn:
            return read_ledger_on(conn, group, topics)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading positions") from exc


def read_ledger_on(conn: Connection, group: GroupRef, topics: Sequence[str] | None) -> LedgerView:
    """``read_ledger`` on an open connection."""
    pipeline, name = group.pipeline, group.consumer_group
    footprint = pipeline_footprint(conn, pipeline)
    # The sinks' fences before their commits are read (``sink_plan_of``): a commit in between then
    # fails its fence under the lock (the restart plans again) instead of hiding behind it.
    fences = sink_fences(conn, pipeline, name)
    # Resets are read before positions: a reset committed in between then stays pending
    # (a later restart applies it again, harmlessly) instead of being marked consumed
    # without its positions being in this plan.
    pending = gens.pending_reset_ids(conn, pipeline, name)
    positions = current_positions(conn, pipeline, name, topics)
    generation = gens.current_generation(conn, pipeline, name, offsets=False)
    return LedgerView(group, tuple(positions), tuple(pending), generation, footprint, sink_fences=fences)


def choose_group(pipeline: str, footprint: Mapping[str, Any]) -> str:
    """The consumer group of a pipeline nobody named one for (``PipelineRef.resolve``)."""
    return PipelineRef(pipeline).resolve(footprint).consumer_group


def select_topics(adapter: KafkaAdapter, options: RestartOptions, ledger_topics: Sequence[str] = ()) -> list[str]:
    """The requested topics: the list, or the pattern resolved on the cluster plus ledger topics it matches.

    Ledger topics matching the pattern are included so a deleted topic's positions are reported as
    removed rather than silently forgotten.
    """
    if options.topics is not None:
        return list(options.topics)
    assert options.topic_pattern is not None  # RestartOptions holds exactly one
    matched = adapter.topics_matching(options.topic_pattern)
    regex = re.compile(options.topic_pattern)
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


@dataclass(frozen=True)
class PlanInputs:
    """What a plan is computed from, read once: the ledger, the requested topics, where the job's sinks
    stand, and the cluster. ``positions``: the ledger's on the requested topics, moved to where the sink
    furthest behind stopped (``sink_ahead``)."""

    ledger: LedgerView
    requested: tuple[str, ...]
    positions: tuple[Position, ...]
    ahead: SinkPlan
    first: bool
    cluster: ClusterView
    #: the sinks the plan weighed (``sink_plan_of``), with their fences: None when none were weighed
    sinks: tuple[str, ...] | None = None

    def requirements(self) -> tuple[Requirement, ...]:
        """What the plan rests on, checked under the lock before its generation is written."""
        ledger = self.ledger
        out: list[Requirement] = []
        if not ledger.group.named:
            out.append(GroupsUnchanged(tuple(sorted(ledger.footprint or ()))))
        out += [GenerationUnchanged(ledger.generation.id if ledger.generation else None),
                PendingResetsUnchanged(ledger.pending_reset_ids),
                PositionsUnchanged.of(self.cluster.topics, ledger.positions)]
        if self.sinks is not None:
            out += [SinkFence(name, ledger.sink_fences.get(name, 0)) for name in self.sinks]
        return tuple(out)


def read_inputs(
    ops: Operations, group: GroupRef, options: RestartOptions, policies: Policies,
    sinks: Sequence[str] | None = None,
) -> PlanInputs:
    """The reads of a plan, in the plan's order: the ledger (resets before positions), the sinks' commits,
    then the cluster. Refuses (FirstRunRefused) to treat a pipeline the ledger knows as a first run,
    unless ``first_run`` is given and ``allow_first_run`` is True."""
    engine, adapter = ops.engine, ops.kafka
    pipeline = group.pipeline
    policy: FirstRun = policies.first_run_policy
    if options.allow_first_run and policies.first_run is None:
        raise InvalidRestartOptions("allow_first_run needs first_run too: say where the pipeline starts over",
                                    option="allow_first_run")
    t0 = time.perf_counter()
    if options.topics is not None:
        requested = select_topics(adapter, options)
        ledger = read_ledger(engine, group, requested)
    else:
        ledger = read_ledger(engine, group, None)
        requested = select_topics(adapter, options, sorted({p.topic for p in ledger.positions}))
    wanted = set(requested)
    positions = [p for p in ledger.positions if p.topic in wanted]
    ahead = sink_plan_of(engine, pipeline, ledger, sinks)
    if ahead.starts:  # each sink judged on its own commits: the plan starts where the one furthest behind stopped
        positions = [replace(p, next_offset=ahead.starts.get((p.topic, p.partition), p.next_offset))
                     for p in positions]
    first = is_first_run(positions, requested)
    if first and ledger.footprint and not options.allow_first_run:
        raise FirstRunRefused(pipeline, ledger.consumer_group, requested, ledger.footprint)
    timestamp_ms = policy.timestamp_ms if isinstance(policy, FirstRunTimestamp) and first else None
    t1 = time.perf_counter()
    cluster = read_cluster(adapter, requested, timestamp_ms=timestamp_ms)
    log.debug("reads for %s over %d partitions: ledger %.1f ms, cluster %.1f ms", pipeline,
              len(cluster.watermarks), (t1 - t0) * 1000, (time.perf_counter() - t1) * 1000)
    # The sinks sink_plan_of weighed (none with a reset pending or no generation yet): their fences hold.
    weighed = None if ledger.pending_reset_ids or ledger.generation is None else (
        tuple(sorted(set(sinks))) if sinks is not None else tuple(sorted(ledger.sink_fences)))
    return PlanInputs(ledger, tuple(requested), tuple(positions), ahead, first, cluster, weighed)


def compose(
    ops: Operations, inputs: PlanInputs, policies: Policies, window: WindowSpec | None = None,
) -> tuple[RestartPlan, LedgerView]:
    """The plan from ``inputs`` (read-only, ``checkpoint_location=None``), and the ledger view with the
    stateful inputs a generation opened from it stores. With ``window`` the positions are rewound for a
    windowed pipeline (``offset_ledger.rules.stateful``) and the plan carries the event-time floor."""
    engine, ledger, cluster = ops.engine, inputs.ledger, inputs.cluster
    group, pipeline = ledger.group, ledger.group.pipeline
    wanted = set(inputs.requested)
    positions = list(inputs.positions)
    t0 = time.perf_counter()
    rewind = None
    stored = stored_stateful(ledger.generation)
    if window is not None and not inputs.first:  # a first run has no windows open yet: nothing to rewind
        rewind = state_rewind(engine, ops.kafka, group, ledger.generation, ledger.pending_reset_ids, positions,
                              window, stored)
        positions = [Position(tp.topic, tp.partition, o) for tp, o in sorted(rewind[1].offsets.items())
                     if o >= 0 and tp.topic in wanted]

    def watermarks_of(generation_id: int) -> Any:
        with engine.connect() as conn:
            return gens.generation_watermarks(conn, generation_id)

    loss: OnDataLoss = parse_on_data_loss(policies.on_data_loss or "fail")
    plan = resolve(pipeline, list(inputs.requested), positions, cluster.watermarks,
                   first_run=policies.first_run_policy, on_data_loss=loss, offsets_for_time=cluster.offsets_for_time,
                   recreated=recreated_topics(ledger.generation, cluster, watermarks_of))
    findings = (*inputs.ahead.findings, *plan.findings)
    floor = plan.event_time_floor
    if rewind is not None:
        findings, floor = (*findings, rewind[1].finding(rewind[0])), rewind[1].event_time_floor
    elif stored is not None and stored.event_time_floor is not None:
        # The generation was opened by a stateful restart: its floor holds for every later start,
        # with or without window= (records before it were emitted in windows already).
        findings, floor = (*findings, stored.kept_finding()), stored.event_time_floor
    log.debug("plan for %s: resolve %.1f ms", pipeline, (time.perf_counter() - t0) * 1000)
    return (replace(plan, findings=findings, event_time_floor=floor, consumer_group=ledger.consumer_group),
            replace(ledger, next_stateful=stateful_record(rewind, stored, window)))


def plan_restart(
    ops: Operations, group: GroupRef, options: RestartOptions, policies: Policies, window: WindowSpec | None = None,
    sinks: Sequence[str] | None = None,
) -> tuple[RestartPlan, LedgerView, ClusterView]:
    """The read-only plan (``checkpoint_location=None``) over the context's ledger and Kafka cluster, and
    the ledger and cluster views it was built from: ``read_inputs`` then ``compose``.

    ``policies`` are the ones in effect (``Policies.over``). ``sinks``: the names of the sinks the job
    writes with (None: every sink that committed since the last deliberate start); the plan starts each
    partition where the sink furthest behind stopped (``rules.sink_ahead.sink_plan``).
    """
    inputs = read_inputs(ops, group, options, policies, sinks)
    plan, ledger = compose(ops, inputs, policies, window)
    return plan, ledger, inputs.cluster


def sink_plan_of(engine: Engine, pipeline: str, ledger: LedgerView, sinks: Sequence[str] | None = None) -> SinkPlan:
    """``rules.sink_ahead.sink_plan`` over the sinks' commits since the last deliberate start (nothing with a
    reset pending: a reset says where every sink reads)."""
    if ledger.pending_reset_ids or ledger.generation is None:
        return SinkPlan()
    registered: list[str] = []
    started: dict[tuple[str, int], int] = {}
    try:
        with engine.connect() as conn:
            ranges, unranged = sink_commits_in_window(conn, pipeline, ledger.consumer_group, sinks)
            if sinks is not None:  # the job's sinks, named: one that holds nothing since is judged too
                registered = registered_sinks(conn, pipeline, ledger.consumer_group)
                started = generation_start(conn, ledger.generation.id)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the sinks' commits") from exc
    return sink_plan(ranges, unranged=unranged, pipeline=pipeline, sinks=sinks, registered=registered,
                     generation_start=started, positions={(p.topic, p.partition): p.next_offset
                                                          for p in ledger.positions})


def resolved_offsets(plan: RestartPlan, cluster: ClusterView) -> dict[str, dict[str, int]]:
    """The plan's starting offsets as numbers: earliest as log-start, latest as log-end, seen now."""
    marks = _marks_by_topic(cluster)
    out: dict[str, dict[str, int]] = {}
    for topic, parts in plan.starting_offsets.items():
        seen = marks.get(topic, {})
        for partition, offset in parts.items():
            w = seen.get(int(partition))
            if offset == EARLIEST:
                offset = w.log_start_offset if w else 0
            elif offset == LATEST:
                if w is None:
                    continue
                offset = w.log_end_offset
            out.setdefault(topic, {})[partition] = int(offset)
    return out


def _marks_by_topic(cluster: ClusterView) -> dict[str, dict[int, Watermarks]]:
    """topic -> partition -> watermarks: plain keys, not a ``TopicPartition`` built and hashed per look-up
    (docs/benchmarks.md, "The restart's steps")."""
    out: dict[str, dict[int, Watermarks]] = {}
    for tp, w in cluster.watermarks.items():
        out.setdefault(tp.topic, {})[tp.partition] = w
    return out


def watermarks_json(cluster: ClusterView) -> dict[str, dict[str, list[int]]]:
    # Sorted by topic, then partition number, on plain keys (not TopicPartition's generated __lt__).
    return {topic: {str(p): [w.log_start_offset, w.log_end_offset] for p, w in sorted(parts.items())}
            for topic, parts in sorted(_marks_by_topic(cluster).items())}
