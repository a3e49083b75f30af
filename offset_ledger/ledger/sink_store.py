"""A transactional sink's rows in the ledger: the fence row and the batches it committed (read back by
``sink_outputs``).

Everything here runs on the caller's connection, inside the caller's transaction: the Postgres sink
moves its staged rows into the target, records the batch (``sink_batches``, and the batch and its
positions through the ``Recorder``'s rules) and advances the fence row in *one* transaction, so
output, ledger and offsets commit or roll back together. The decisions are
``offset_ledger.rules.sink_identity``'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.engine import Connection

from offset_ledger.errors import SinkTargetChanged
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.recorder import record_in_transaction
from offset_ledger.ledger.records import Record, RecordOutcome, utc
from offset_ledger.ledger.tables import (
    batch_offsets,
    checkpoint_generations,
    findings,
    positions,
    sink_batches,
    sinks,
)
from offset_ledger.rules.authority import same_location
from offset_ledger.rules.sink_ahead import SinkCommitRange, window_start
from offset_ledger.rules.sink_identity import SinkState, SinkTarget, describe_target, target_change


@dataclass(frozen=True)
class SinkSpec:
    """Which sink, for which pipeline, writing where."""

    sink: str
    pipeline: str
    consumer_group: str
    kind: str  # postgres | delta
    target: str
    target_database: str | None = None  # None: the ledger's own database

    @property
    def bound_to(self) -> SinkTarget:
        return SinkTarget(self.pipeline, self.consumer_group, self.kind, self.target, self.target_database)


def _insert(conn: Connection) -> Any:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    return insert


def generation_of(conn: Connection, pipeline: str, consumer_group: str, location: str,
                  query_id: str | None = None) -> int | None:
    """The id of the pipeline's checkpoint generation at ``location`` (None: not one the ledger handed out).

    ``query_id``: the query whose batch this is (the id in the checkpoint's ``metadata``). A
    checkpoint re-created in place holds another query than the one that claimed the generation:
    that query is a new incarnation with a generation of its own (``generations.open_incarnation``),
    so its batch ids never match the old query's commits.
    """
    rows = conn.execute(select(checkpoint_generations.c.id, checkpoint_generations.c.location,
                               checkpoint_generations.c.query_id)
                        .where(checkpoint_generations.c.pipeline == pipeline,
                               checkpoint_generations.c.consumer_group == consumer_group)
                        .order_by(checkpoint_generations.c.generation.desc())).all()
    here = [r for r in rows if same_location(location, r.location)]
    if not here:
        return None
    if query_id is None:
        return int(here[0].id)
    for r in here:
        if r.query_id == query_id:
            return int(r.id)
    if here[0].query_id is None:
        # The first query on the generation claims it (as a run does), also without a listener: a
        # later query on a re-created checkpoint is then told apart.
        gens.claim_generation(conn, int(here[0].id), query_id)
        return int(here[0].id)
    found = gens.open_incarnation(conn, pipeline=pipeline, consumer_group=consumer_group, query_id=query_id,
                                  location=location)
    return int(here[0].id) if found is None else found


def current_generation_id(conn: Connection, pipeline: str, consumer_group: str) -> int | None:
    current = gens.current_generation(conn, pipeline, consumer_group, offsets=False)
    return None if current is None else current.id


def lock_sink(conn: Connection, spec: SinkSpec, now: datetime) -> SinkState:
    """Hold the pipeline and the sink's row until the transaction ends; the sink's last commit.

    The pipeline lock is the one a restart takes to open a generation: a commit and a new
    generation never interleave, so once the newer generation exists the old one is fenced.
    """
    lock_pipeline(conn, spec.pipeline, spec.consumer_group)
    _register(conn, spec, now)
    query = select(sinks).where(sinks.c.sink == spec.sink)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    row = conn.execute(query).one()
    _refuse_another_target(spec, row)
    return SinkState(int(row.last_sequence), row.generation_id, row.batch_id)


def bind_target(conn: Connection, spec: SinkSpec, now: datetime | None) -> None:
    """Register the sink's target on its first write; refuse (``SinkTargetChanged``) another one.

    Called before a batch writes anything (staging included), and with ``now=None`` (check only,
    nothing registered: planning alone binds nothing) before a restart reconciles. The name is
    bound to its target from the first write on: a changed ``target_dsn``, table or path fails
    loudly instead of committing to the new target under the old target's sequences.
    """
    if now is not None:
        _register(conn, spec, now)
    row = conn.execute(select(sinks).where(sinks.c.sink == spec.sink)).first()
    if row is not None:
        _refuse_another_target(spec, row)


def _register(conn: Connection, spec: SinkSpec, now: datetime) -> None:
    conn.execute(_insert(conn)(sinks).values(
        sink=spec.sink, pipeline=spec.pipeline, consumer_group=spec.consumer_group, kind=spec.kind,
        target=spec.target, target_database=spec.target_database, last_sequence=0, updated_at=utc(now),
    ).on_conflict_do_nothing(index_elements=[sinks.c.sink]))


def _refuse_another_target(spec: SinkSpec, row: Any) -> None:
    registered = SinkTarget(row.pipeline, row.consumer_group, row.kind, row.target, row.target_database)
    why = target_change(spec.sink, registered, spec.bound_to,
                        same_path=row.kind == "delta" and same_location(row.target, spec.target))
    if why is not None:
        raise SinkTargetChanged(why, sink=spec.sink, bound_to=describe_target(registered),
                                wanted=describe_target(spec.bound_to))


def committed_sequence(conn: Connection, sink: str, generation_id: int, batch_id: int) -> int | None:
    """The sequence the sink gave (generation, batch), if it committed that batch."""
    value = conn.execute(select(sink_batches.c.sequence).where(
        sink_batches.c.sink == sink, sink_batches.c.generation_id == generation_id,
        sink_batches.c.batch_id == batch_id)).scalar()
    return None if value is None else int(value)


def last_sequence(conn: Connection, sink: str) -> int:
    """The highest sequence the ledger recorded for ``sink`` (0: none yet)."""
    return int(conn.execute(select(func.coalesce(func.max(sink_batches.c.sequence), 0))
                            .where(sink_batches.c.sink == sink)).scalar_one())


@dataclass(frozen=True)
class SinkCommit:
    """One batch a sink committed, as ``sink_batches`` records it: under which sequence, on which generation
    and query, and what the target says it wrote (rows; Delta's table version, Iceberg's snapshot id)."""

    sequence: int
    generation_id: int
    query_id: str
    batch_id: int
    row_count: int | None = None
    table_version: int | None = None


def record_commit(
    conn: Connection, spec: SinkSpec, commit: SinkCommit, *, committed_at: datetime, now: datetime,
    records: Sequence[Record] = (),
) -> RecordOutcome | None:
    """Record one committed batch of the sink, advance its fence row, and write ``records`` (the batch).

    ``records`` go through the recorder's own rules (``recorder.record_in_transaction``: authority,
    forward-only positions, gaps) on this connection, so they commit with the sink's rows or not at all.
    """
    sequence, generation_id, batch_id = commit.sequence, commit.generation_id, commit.batch_id
    conn.execute(_insert(conn)(sink_batches).values(
        sink=spec.sink, pipeline=spec.pipeline, consumer_group=spec.consumer_group, sequence=sequence,
        generation_id=generation_id, query_id=commit.query_id, batch_id=batch_id, target=spec.target,
        row_count=commit.row_count, table_version=commit.table_version, committed_at=utc(committed_at),
        recorded_at=utc(now)))
    conn.execute(update(sinks).where(sinks.c.sink == spec.sink, sinks.c.last_sequence < sequence).values(
        last_sequence=sequence, generation_id=generation_id, batch_id=batch_id, updated_at=utc(now)))
    if not records:
        return None

    return record_in_transaction(conn, records, now=now)


def _window(conn: Connection, pipeline: str, consumer_group: str) -> tuple[Any, dict[int, int]]:
    """(the current generation's row, {id: number} of the older generations whose commits a plan weighs:
    from the last deliberate start, ``sink_ahead.window_start``, up to, not including, the current one)."""
    g = checkpoint_generations
    rows = conn.execute(select(g.c.id, g.c.generation, g.c.reason, g.c.stateful, g.c.created_at,
                               g.c.sink_batch_floor).where(
        g.c.pipeline == pipeline, g.c.consumer_group == consumer_group)).all()
    if len(rows) < 2:
        return None, {}
    current = max(rows, key=lambda r: r.generation)
    start = window_start([(r.generation, r.reason, bool(r.stateful) and "inherited_from_generation" not in r.stateful)
                          for r in rows], current.generation)
    return current, {r.id: r.generation for r in rows if start <= r.generation < current.generation}


def unrecorded_commits_ahead(conn: Connection, pipeline: str, consumer_group: str, sink: str,
                             commits: Sequence[Any]) -> list[SinkCommitRange]:
    """The partition ranges past the ledger's positions of ``commits`` of ``sink`` that a remote target's own
    log holds and the ledger lacks (``ledger.sink_target.commits_after``: sequence, generation_id, batch_id,
    batch).

    The target's log is the truth of what committed there: a zombie that committed after this
    generation opened and died before telling the ledger left its records only there. Commits of
    generations outside ``_window`` (the current one's own, or older than a deliberate start) are no
    late commits.
    """
    _, number_of = _window(conn, pipeline, consumer_group)
    found = [(c, number_of[int(c.generation_id)]) for c in commits if int(c.generation_id) in number_of]
    if not found:
        return []
    held = {(r.topic, int(r.partition)): r.next_offset for r in conn.execute(
        select(positions.c.topic, positions.c.partition, positions.c.next_offset).where(
            positions.c.pipeline == pipeline, positions.c.consumer_group == consumer_group))}
    out: list[SinkCommitRange] = []
    for c, number in found:
        doc = c.batch if isinstance(c.batch, dict) else json.loads(c.batch)
        for source in doc.get("sources") or ():
            for topic, partition, from_offset, until_offset in source["ranges"]:
                position = held.get((topic, int(partition)))
                if position is None or int(until_offset) > position:
                    out.append(SinkCommitRange(sink, int(c.sequence), number, int(c.batch_id), None, topic,
                                               int(partition), from_offset, int(until_offset), position))
    return out


#: How far the clocks that stamp ``sink_batches.recorded_at`` and a generation's ``created_at`` may disagree:
#: only for a generation opened by a release before 0019 (no ``sink_batch_floor``).
CLOCK_SLACK = timedelta(hours=1)


def older_commits_ahead(conn: Connection, pipeline: str, consumer_group: str
                        ) -> tuple[list[SinkCommitRange], list[str]]:
    """What ``rules.sink_ahead`` weighs before a plan: sink commits of older generations past the positions.

    Generations from the last deliberate start (``sink_ahead.window_start``) up to, not including,
    the current one, and commits the ledger learned after the current generation opened (a higher
    ``sink_batches.id`` than its ``sink_batch_floor``). Returns their partition ranges that end past the ledger's position there (or
    where it has none), and those commits it holds no ranges of (named), which nothing can place.
    """
    current, number_of = _window(conn, pipeline, consumer_group)
    if current is None or not number_of:
        return [], []
    sb, bo, p = sink_batches, batch_offsets, positions
    # Only commits the ledger learned after the current generation opened can lie past its start
    # unaccounted: an earlier one moved the positions, or the restart that opened it planned past
    # it. "After" is the ledger's own order: a higher sink_batches id than the generation's floor
    # (0019), so no clock (a zombie driver's, the database's) can hide or invent a commit, and the
    # read is a range of the primary key: the recent rows of a long history.
    if current.sink_batch_floor is not None:
        learned_after = sb.c.id > current.sink_batch_floor
    else:  # opened by a release before 0019: the clock, with the slack it had
        learned_after = sb.c.recorded_at >= current.created_at - CLOCK_SLACK
    mine = (sb.c.pipeline == pipeline, sb.c.consumer_group == consumer_group,
            sb.c.generation_id.in_(sorted(number_of)), learned_after)
    same_batch = and_(bo.c.query_id == sb.c.query_id, bo.c.batch_id == sb.c.batch_id,
                      bo.c.pipeline == sb.c.pipeline, bo.c.consumer_group == sb.c.consumer_group)
    found = conn.execute(
        select(sb.c.sink, sb.c.sequence, sb.c.generation_id, sb.c.batch_id, sb.c.table_version, bo.c.topic,
               bo.c.partition, bo.c.from_offset, bo.c.until_offset, p.c.next_offset)
        .join(bo, same_batch)
        .outerjoin(p, and_(p.c.pipeline == sb.c.pipeline, p.c.consumer_group == sb.c.consumer_group,
                           p.c.topic == bo.c.topic, p.c.partition == bo.c.partition))
        .where(*mine, or_(p.c.next_offset.is_(None), bo.c.until_offset > p.c.next_offset))).all()
    ranges = [SinkCommitRange(r.sink, int(r.sequence), number_of[r.generation_id], int(r.batch_id), r.table_version,
                              r.topic, int(r.partition), r.from_offset, int(r.until_offset), r.next_offset)
              for r in found]
    # Ranges pruned away are no evidence of anything; a commit the ledger learned after the current
    # generation opened (a reconcile) and holds no ranges of is.
    unranged = conn.execute(select(sb.c.sink, sb.c.sequence, sb.c.generation_id, sb.c.batch_id, sb.c.table_version)
                            .where(*mine,
                                   func.coalesce(sb.c.row_count, 1) > 0, ~exists().where(same_batch))).all()
    return ranges, [SinkCommitRange(r.sink, int(r.sequence), number_of[r.generation_id], int(r.batch_id),
                                    r.table_version, "", 0, None, 0, None).named() for r in unranged]


def _window_with_current(conn: Connection, pipeline: str, consumer_group: str) -> tuple[Any, dict[int, int]]:
    """(the current generation's row, {id: number} of the generations from the last deliberate start up to
    and including the current one): whose commits a sink's reach is judged on (``rules.sink_ahead.sink_plan``)."""
    g = checkpoint_generations
    rows = conn.execute(select(g.c.id, g.c.generation, g.c.reason, g.c.stateful, g.c.created_at,
                               g.c.sink_batch_floor).where(
        g.c.pipeline == pipeline, g.c.consumer_group == consumer_group)).all()
    if not rows:
        return None, {}
    current = max(rows, key=lambda r: r.generation)
    start = window_start([(r.generation, r.reason, bool(r.stateful) and "inherited_from_generation" not in r.stateful)
                          for r in rows], current.generation)
    return current, {r.id: r.generation for r in rows if start <= r.generation <= current.generation}


def sink_commits_in_window(conn: Connection, pipeline: str, consumer_group: str,
                           sinks: Sequence[str] | None = None) -> tuple[list[SinkCommitRange], list[str]]:
    """What ``rules.sink_ahead.sink_plan`` judges each sink on: its commits since the last deliberate start.

    Per sink and partition, the ranges that end past the ledger's position (or where it has none),
    whole, and one range standing for the rest, ending where the sink's last commit not past the
    position ends (sequence 0, start unknown: only its end counts), so that a long history is
    aggregated in the database. ``sinks``: only these (None: every sink of the pipeline). The
    second list: commits of older generations the ledger learned after the current generation opened
    and holds no ranges of (named; ``sink_ahead`` refuses them).
    """
    current, number_of = _window_with_current(conn, pipeline, consumer_group)
    if current is None:
        return [], []
    sb, bo, p = sink_batches, batch_offsets, positions
    mine = [sb.c.pipeline == pipeline, sb.c.consumer_group == consumer_group,
            sb.c.generation_id.in_(sorted(number_of))]
    if sinks is not None:
        mine.append(sb.c.sink.in_(sorted(set(sinks))))
    same_batch = and_(bo.c.query_id == sb.c.query_id, bo.c.batch_id == sb.c.batch_id,
                      bo.c.pipeline == sb.c.pipeline, bo.c.consumer_group == sb.c.consumer_group)
    at_position = and_(p.c.pipeline == sb.c.pipeline, p.c.consumer_group == sb.c.consumer_group,
                       p.c.topic == bo.c.topic, p.c.partition == bo.c.partition)
    older = sorted(i for i, n in number_of.items() if n < current.generation)
    if current.sink_batch_floor is not None:
        learned_after = sb.c.id > current.sink_batch_floor
    else:  # opened by a release before 0019: the clock, with the slack it had
        learned_after = sb.c.recorded_at >= current.created_at - CLOCK_SLACK
    # A partition without a position (dropped with its topic) weighs only where sink_ahead weighed it: an
    # older generation's commit learned after the current one opened (refused: nothing to continue from).
    unplaced = and_(p.c.next_offset.is_(None), sb.c.generation_id.in_(older), learned_after)
    past = conn.execute(
        select(sb.c.sink, sb.c.sequence, sb.c.generation_id, sb.c.batch_id, sb.c.table_version, bo.c.topic,
               bo.c.partition, bo.c.from_offset, bo.c.until_offset, p.c.next_offset)
        .join(bo, same_batch).outerjoin(p, at_position)
        .where(*mine, or_(unplaced, bo.c.until_offset > p.c.next_offset))).all()
    ranges = [SinkCommitRange(r.sink, int(r.sequence), number_of[r.generation_id], int(r.batch_id), r.table_version,
                              r.topic, int(r.partition), r.from_offset, int(r.until_offset), r.next_offset)
              for r in past]
    behind = conn.execute(
        select(sb.c.sink, bo.c.topic, bo.c.partition, func.max(bo.c.until_offset).label("until"), p.c.next_offset)
        .join(bo, same_batch).join(p, at_position)
        .where(*mine, bo.c.until_offset <= p.c.next_offset)
        .group_by(sb.c.sink, bo.c.topic, bo.c.partition, p.c.next_offset)).all()
    ranges += [SinkCommitRange(r.sink, 0, 0, -1, None, r.topic, int(r.partition), None, int(r.until), r.next_offset)
               for r in behind]
    if not older:
        return ranges, []
    unranged = conn.execute(select(sb.c.sink, sb.c.sequence, sb.c.generation_id, sb.c.batch_id, sb.c.table_version)
                            .where(*mine, sb.c.generation_id.in_(sorted(older)), learned_after,
                                   func.coalesce(sb.c.row_count, 1) > 0, ~exists().where(same_batch))).all()
    return ranges, [SinkCommitRange(r.sink, int(r.sequence), number_of[r.generation_id], int(r.batch_id),
                                    r.table_version, "", 0, None, 0, None).named() for r in unranged]


def planned_reach(conn: Connection, generation_id: int, sink: str) -> dict[tuple[str, int], int]:
    """Where ``sink`` holds output past the start of generation ``generation_id``, per partition: what the
    restart that opened it planned the sink to skip (its ``sink_behind`` finding; empty: nothing)."""
    out: dict[tuple[str, int], int] = {}
    # Not by the generation's reason: a plan whose sinks stand apart may open it for a weightier one
    # (a clamp after data loss, a lost checkpoint), and its sinks still hold what they hold.
    for details in conn.execute(select(findings.c.details).where(
            findings.c.generation_id == generation_id, findings.c.kind == "sink_behind")).scalars():
        doc = details if isinstance(details, dict) else json.loads(details or "{}")
        for topic, partition, _start, end in (doc.get("skips") or {}).get(sink, ()):
            out[(str(topic), int(partition))] = int(end)
    return out


def registered_sinks(conn: Connection, pipeline: str, consumer_group: str) -> list[str]:
    """The sinks that ever wrote for the pipeline (a sink registers on its first batch, before it stages)."""
    return list(conn.execute(select(sinks.c.sink).where(sinks.c.pipeline == pipeline,
                                                       sinks.c.consumer_group == consumer_group)).scalars())


def generation_start(conn: Connection, generation_id: int) -> dict[tuple[str, int], int]:
    """Where generation ``generation_id`` started, per partition (its resolved starting offsets)."""
    raw = conn.execute(select(checkpoint_generations.c.resolved_offsets)
                       .where(checkpoint_generations.c.id == generation_id)).scalar() or {}
    if isinstance(raw, str):
        raw = json.loads(raw)
    return {(t, int(p)): int(o) for t, parts in raw.items() for p, o in parts.items()}


def sink_held_ranges(conn: Connection, pipeline: str, consumer_group: str, topic: str | None = None) -> Any:
    """Every range the pipeline's sinks committed (sink, topic, partition, from, until), ordered by partition:
    streamed (``rules.sink_ahead.sink_gaps`` takes one partition at a time). Ranges of an unknown start
    are left out: nothing can be said of what they hold."""
    sb, bo = sink_batches, batch_offsets
    same_batch = and_(bo.c.query_id == sb.c.query_id, bo.c.batch_id == sb.c.batch_id,
                      bo.c.pipeline == sb.c.pipeline, bo.c.consumer_group == sb.c.consumer_group)
    query = (select(sb.c.sink, bo.c.topic, bo.c.partition, bo.c.from_offset, bo.c.until_offset)
             .join(bo, same_batch)
             .where(sb.c.pipeline == pipeline, sb.c.consumer_group == consumer_group, bo.c.from_offset.is_not(None))
             .order_by(bo.c.topic, bo.c.partition, sb.c.sink, bo.c.from_offset))
    if topic is not None:
        query = query.where(bo.c.topic == topic)
    return conn.execution_options(yield_per=2000).execute(query)
