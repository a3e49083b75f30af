"""Checkpoint generations and the pending resets they consume.

A generation is a checkpoint location ``<checkpoint_root>/gen-<n>-<short uuid>`` handed out by the
restart helper. Locations are built by joining strings and recorded here; nothing is ever listed or
deleted, so any location Spark accepts works (``s3a://``, ``hdfs://``, ``abfss://``, local paths).
The unique suffix keeps a generation empty even if an older run left files at a similar path.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from offset_ledger.errors import LedgerError
from offset_ledger.ledger import position_store
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.records import pg_int_array, pg_text_array
from offset_ledger.ledger.tables import checkpoint_generations, findings, resets, sink_batches
from offset_ledger.rules.authority import same_location
from offset_ledger.rules.model import Finding

log = logging.getLogger(__name__)

_BASELINE_CHUNK = 2000  # rows per upsert: 10 parameters each, under SQLite's 32766 and Postgres' 65535


@dataclass(frozen=True)
class CheckpointGeneration:
    """One checkpoint generation of a pipeline, as recorded in the ledger."""

    id: int
    pipeline: str
    consumer_group: str
    generation: int
    checkpoint_root: str
    location: str
    app_version: str | None
    reason: str
    created_at: datetime
    starting_offsets: Mapping[str, Mapping[str, int]] | None
    resolved_offsets: Mapping[str, Mapping[str, int]] | None = None
    topic_ids: Mapping[str, str] | None = None
    watermarks: Mapping[str, Mapping[str, list[int]]] | None = None  # topic -> partition -> [start, end]
    query_id: str | None = None
    #: A windowed generation's inputs (``window_ms``, ``slide_ms``, ``delay_ms``, ``event_time_floor``
    #: ISO text, ``kafka_timestamp``, ``basis_query_id``): later restarts never lower its floor.
    stateful: Mapping[str, Any] | None = None
    #: The restart helper chose the consumer group (nobody named one): the group the generation's
    #: runs report takes it over (``adopt_defaulted_group``).
    group_defaulted: bool = False


def generation_location(checkpoint_root: str, generation: int, suffix: str) -> str:
    """``<root>/gen-<n>-<suffix>`` by string joining (a URI's scheme and authority are kept as is)."""
    root = checkpoint_root.rstrip("/") or "/"
    sep = "" if root.endswith("/") else "/"
    return f"{root}{sep}gen-{generation}-{suffix}"


def _row(r: Any) -> CheckpointGeneration:
    created_at = r.created_at
    if created_at.tzinfo is None:  # SQLite drops the zone; everything is written in UTC
        created_at = created_at.replace(tzinfo=timezone.utc)
    m = r._mapping
    return CheckpointGeneration(
        id=r.id, pipeline=r.pipeline, consumer_group=r.consumer_group, generation=r.generation,
        checkpoint_root=r.checkpoint_root, location=r.location, app_version=r.app_version,
        reason=r.reason, created_at=created_at, starting_offsets=m.get("starting_offsets"),
        resolved_offsets=m.get("resolved_offsets"), topic_ids=r.topic_ids, watermarks=m.get("watermarks"),
        query_id=r.query_id, stateful=m.get("stateful"), group_defaulted=bool(m.get("group_defaulted")))


# Per-partition JSON a restart does not read: left undecoded (its cost: docs/benchmarks.md).
_BULKY = ("starting_offsets", "resolved_offsets", "watermarks")


def current_generation(conn: Connection, pipeline: str, consumer_group: str, *,
                       offsets: bool = True) -> CheckpointGeneration | None:
    """The newest generation of the pipeline, or None before its first restart through the helper.

    ``offsets=False`` leaves ``starting_offsets``, ``resolved_offsets`` and ``watermarks`` None
    (``generation_watermarks`` fetches the last when needed).
    """
    columns = checkpoint_generations.c if offsets else [
        c for c in checkpoint_generations.c if c.name not in _BULKY]
    row = conn.execute(
        select(*columns)
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group == consumer_group)
        .order_by(checkpoint_generations.c.generation.desc())
        .limit(1)
    ).first()
    return None if row is None else _row(row)


def generation_watermarks(conn: Connection, generation_id: int) -> Mapping[str, Mapping[str, list[int]]] | None:
    """The watermarks a generation recorded when it was opened (topic -> partition -> [start, end])."""
    return conn.execute(select(checkpoint_generations.c.watermarks)
                        .where(checkpoint_generations.c.id == generation_id)).scalar_one_or_none()


def generations(conn: Connection, pipeline: str, consumer_group: str) -> list[CheckpointGeneration]:
    """Every generation of the pipeline, oldest first."""
    rows = conn.execute(
        select(checkpoint_generations)
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group == consumer_group)
        .order_by(checkpoint_generations.c.generation)
    )
    return [_row(r) for r in rows]


def pending_reset_ids(conn: Connection, pipeline: str, consumer_group: str) -> list[int]:
    """Executed resets the restart helper has not yet applied through a fresh checkpoint."""
    rows = conn.execute(
        select(resets.c.id)
        .where(resets.c.pipeline == pipeline, resets.c.consumer_group == consumer_group,
               resets.c.status == "pending")
        .order_by(resets.c.id)
    )
    return [r.id for r in rows]


def sink_batch_floor(conn: Connection) -> int:
    """The highest ``sink_batches.id`` now (0: none), which a generation opened now stores: which sink
    commits the ledger learned after it opened is then an order the ledger owns, not a clock's.

    Read under the pipeline lock, which every sink commit of the pipeline holds while it inserts its
    row: none is in flight, so each of the pipeline's rows recorded later gets a higher id. The
    highest id of the whole table is that bound too, and one step down the primary key.
    """
    return int(conn.execute(select(func.coalesce(func.max(sink_batches.c.id), 0))).scalar_one())


@dataclass(frozen=True)
class NewGeneration:
    """Generation n+1 of a pipeline as ``create_generation`` records it (n is the ledger's, under the lock).

    ``resolved_offsets`` (numbers, no sentinels) become the pipeline's positions; ``dropped_partitions``
    (gone from the cluster) lose theirs; ``restart_findings`` are stored with the generation;
    ``consume_reset_ids`` are the pending resets it applies. ``location`` overrides the fresh
    ``<root>/gen-<n>-<id>`` path and ``query_id`` binds the generation to a query up front: both for
    adopting an existing checkpoint (``offset_ledger.operate.adopt``), whose running query's runs must
    match the generation by that checkpoint's path.
    """

    pipeline: str
    consumer_group: str
    checkpoint_root: str
    app_version: str | None
    reason: str
    starting_offsets: Mapping[str, Mapping[str, int]]
    resolved_offsets: Mapping[str, Mapping[str, int]] | None = None
    topic_ids: Mapping[str, str] | None = None
    watermarks: Mapping[str, Mapping[str, list[int]]] | None = None
    dropped_partitions: Sequence[tuple[str, int]] = ()
    restart_findings: Sequence[Finding] = ()
    consume_reset_ids: Sequence[int] = ()
    now: datetime | None = None
    location: str | None = None
    query_id: str | None = None
    stateful: Mapping[str, Any] | None = None
    group_defaulted: bool = False


def create_generation(conn: Connection, new: NewGeneration) -> tuple[CheckpointGeneration, list[int]]:
    """Record generation n+1 (``new``), make it the pipeline's authority, and consume ``new.consume_reset_ids``.

    Call inside one transaction. The generation's ``resolved_offsets`` become the pipeline's
    positions, also where they are lower than before (a clamp, a reset, a re-created topic): from now
    on only runs on this generation's checkpoint move them. Returns the generation and the reset ids
    actually consumed (a reset another restart consumed meanwhile is left alone). Only resets the
    caller read *before* reading positions may be passed: their moves are then guaranteed to be in the
    plan being recorded.
    """
    pipeline, consumer_group, checkpoint_root = new.pipeline, new.consumer_group, new.checkpoint_root
    at = new.now or datetime.now(timezone.utc)
    # Two restarts of one pipeline at once must not both take generation n+1, and a reset or a
    # recorder must not move positions between our read of them and the baseline written here.
    lock_pipeline(conn, pipeline, consumer_group)
    latest = conn.execute(
        select(func.max(checkpoint_generations.c.generation))
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group == consumer_group)
    ).scalar()
    number = (latest or 0) + 1
    location = new.location
    if location is None:
        location = generation_location(checkpoint_root, number, uuid.uuid4().hex[:8])
    offsets = {t: dict(parts) for t, parts in new.starting_offsets.items()}
    resolved = {t: dict(parts) for t, parts in (new.resolved_offsets or {}).items()}
    topic_ids = dict(new.topic_ids) if new.topic_ids else None
    watermarks = {t: dict(p) for t, p in new.watermarks.items()} if new.watermarks else None
    stateful = dict(new.stateful) if new.stateful else None
    try:
        gen_id = conn.execute(insert(checkpoint_generations).values(
            pipeline=pipeline, consumer_group=consumer_group, generation=number,
            checkpoint_root=checkpoint_root, location=location, app_version=new.app_version,
            reason=new.reason, created_at=at, starting_offsets=offsets, resolved_offsets=resolved or None,
            topic_ids=topic_ids, watermarks=watermarks, query_id=new.query_id, stateful=stateful,
            group_defaulted=True if new.group_defaulted else None,
            sink_batch_floor=sink_batch_floor(conn),
        ).returning(checkpoint_generations.c.id)).scalar_one()
    except IntegrityError as exc:  # SQLite has no advisory lock: a concurrent restart won
        raise LedgerError(f"another restart of {pipeline!r} created generation {number} concurrently; retry",
                          pipeline=pipeline) from exc
    consumed: list[int] = []
    if new.consume_reset_ids:
        done = conn.execute(
            update(resets)
            .where(resets.c.id.in_(list(new.consume_reset_ids)), resets.c.status == "pending")
            .values(status="consumed", consumed_at=at, consumed_by_generation=gen_id)
            .returning(resets.c.id)
        )
        consumed = sorted(r.id for r in done)
    _write_baseline(conn, pipeline, consumer_group, gen_id, resolved, new.dropped_partitions, at)
    if new.restart_findings:
        conn.execute(insert(findings), [{
            "pipeline": pipeline, "consumer_group": consumer_group, "kind": f.kind, "topic": f.topic,
            "partition": f.partition, "message": f.message, "details": dict(f.details), "created_at": at,
            "generation_id": gen_id, "expected_offset": _int_or_none(f.details.get("next_offset")),
            "actual_offset": _int_or_none(f.details.get("resumed_at")),
        } for f in new.restart_findings])
    log.info("checkpoint generation %s of %s/%s at %s (reason %s, resets consumed %s)",
             number, pipeline, consumer_group, location, new.reason, consumed)
    return CheckpointGeneration(gen_id, pipeline, consumer_group, number, checkpoint_root, location,
                                new.app_version, new.reason, at, offsets, resolved or None, topic_ids,
                                new.watermarks, new.query_id, stateful, new.group_defaulted), consumed


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# A restart's baseline on PostgreSQL in one statement (three array parameters, one text literal each):
# a topic row whose partitions are all in the baseline becomes the baseline (one mover: the generation);
# a topic without a row gets one. The topics it returns are done; any other (a row with partitions the
# baseline does not name) is merged in Python: cheaper than per-partition rows or a merge of every
# position in Python (docs/benchmarks.md).
_PG_BASELINE = text("""
    WITH u AS (
        SELECT topic, array_agg(part ORDER BY part) AS parts, array_agg(next_offset ORDER BY part) AS offs
        FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS integer[]), CAST(:offsets AS bigint[]))
             AS u (topic, part, next_offset)
        GROUP BY topic
    ), moved AS (
        UPDATE topic_positions AS t SET partitions = u.parts, stamps = NULL, next_offsets = u.offs,
               moved_at = ARRAY[CAST(:at AS timestamptz)], moved_batch_ids = '{NULL}', moved_reset_ids = '{NULL}',
               moved_generation_ids = ARRAY[CAST(:generation_id AS bigint)], moved_query_ids = '{NULL}'
        FROM u
        WHERE t.pipeline = :pipeline AND t.consumer_group = :consumer_group AND t.topic = u.topic
          AND t.partitions <@ u.parts
        RETURNING t.topic
    ), added AS (
        INSERT INTO topic_positions (pipeline, consumer_group, topic, partitions, stamps, next_offsets, moved_at,
                                     moved_batch_ids, moved_reset_ids, moved_generation_ids, moved_query_ids)
        SELECT :pipeline, :consumer_group, u.topic, u.parts, NULL, u.offs, ARRAY[CAST(:at AS timestamptz)], '{NULL}',
               '{NULL}', ARRAY[CAST(:generation_id AS bigint)], '{NULL}'
        FROM u
        WHERE NOT EXISTS (SELECT FROM topic_positions t WHERE t.pipeline = :pipeline
                          AND t.consumer_group = :consumer_group AND t.topic = u.topic)
        ORDER BY u.topic COLLATE "C"
        ON CONFLICT DO NOTHING
        RETURNING topic
    )
    SELECT topic FROM moved UNION ALL SELECT topic FROM added
""")


def _write_baseline(
    conn: Connection, pipeline: str, consumer_group: str, generation_id: int,
    resolved: Mapping[str, Mapping[str, int]], dropped: Sequence[tuple[str, int]], at: datetime,
) -> None:
    """The generation's resolved starting offsets as positions (moved, or added when new), ``dropped`` gone:
    one write per topic row (0024), under the pipeline's exclusive lock the caller holds."""
    changes: dict[tuple[str, int], Placed | None] = {(t, int(p)): None for t, p in dropped}
    if dropped:
        position_store.write(conn, pipeline, consumer_group, changes)
        changes = {}
    for t, parts in resolved.items():
        for p, o in parts.items():
            changes[(t, int(p))] = Placed(int(o), at, None, None, None, generation_id)
    if conn.dialect.name == "postgresql" and changes:
        ordered = sorted((t, p, c.next_offset) for (t, p), c in changes.items() if c is not None)
        done = set(conn.execute(_PG_BASELINE, {
            "pipeline": pipeline, "consumer_group": consumer_group, "at": at, "generation_id": generation_id,
            "topics": pg_text_array([t for t, _, _ in ordered]), "partitions": pg_int_array([p for _, p, _ in ordered]),
            "offsets": pg_int_array([o for _, _, o in ordered])}).scalars())
        changes = {k: v for k, v in changes.items() if k[0] not in done}
    position_store.write(conn, pipeline, consumer_group, changes)


def defaulted_generations(conn: Connection, pipeline: str, other_than_group: str) -> list[CheckpointGeneration]:
    """Generations of ``pipeline`` under a consumer group the restart helper only defaulted (not this one)."""
    rows = conn.execute(
        select(*[c for c in checkpoint_generations.c if c.name not in _BULKY])
        .where(checkpoint_generations.c.pipeline == pipeline,
               checkpoint_generations.c.consumer_group != other_than_group,
               checkpoint_generations.c.group_defaulted.is_(True))
        .order_by(checkpoint_generations.c.id))
    return [_row(r) for r in rows]


def adopt_defaulted_group(conn: Connection, pipeline: str, from_group: str, to_group: str,
                          at: datetime | None = None) -> int:
    """Move everything the helper wrote under a defaulted group to the group the runs report.

    ``start_from_ledger`` without ``consumer_group`` on a new pipeline names the group after the
    pipeline; a listener created with ``consumer_group=...`` then records its runs under that one.
    The group the helper only guessed yields: its generations, positions, pending resets and findings
    move to ``to_group`` (nothing moves when ``to_group`` already has generations of its own), and a
    ``group_adopted`` finding says so. Returns the number of generations moved.
    """
    lock_pipeline(conn, pipeline, from_group)
    lock_pipeline(conn, pipeline, to_group)
    own = conn.execute(select(func.count()).select_from(checkpoint_generations).where(
        checkpoint_generations.c.pipeline == pipeline, checkpoint_generations.c.consumer_group == to_group)).scalar()
    defaulted = conn.execute(select(func.count()).select_from(checkpoint_generations).where(
        checkpoint_generations.c.pipeline == pipeline, checkpoint_generations.c.consumer_group == from_group,
        checkpoint_generations.c.group_defaulted.is_(True))).scalar()
    named = conn.execute(select(func.count()).select_from(checkpoint_generations).where(
        checkpoint_generations.c.pipeline == pipeline, checkpoint_generations.c.consumer_group == from_group,
        checkpoint_generations.c.group_defaulted.is_not(True))).scalar()
    if own or not defaulted or named:
        return 0
    # Positions the runs already moved under their own group (before any generation matched) are
    # newer than the helper's baseline only if they are ahead of it: keep the furthest.
    theirs = position_store.load(conn, pipeline, to_group, lock=True)
    guessed = position_store.load(conn, pipeline, from_group, lock=True)
    position_store.write(conn, pipeline, to_group, {
        (topic, p): placed for topic, parts in guessed.items() for p, placed in parts.items()
        if p not in theirs.get(topic, {})}, current=theirs)
    position_store.drop_group(conn, pipeline, from_group)
    for table in (resets, findings):
        conn.execute(update(table).where(table.c.pipeline == pipeline, table.c.consumer_group == from_group)
                     .values(consumer_group=to_group))
    moved = conn.execute(update(checkpoint_generations).where(
        checkpoint_generations.c.pipeline == pipeline, checkpoint_generations.c.consumer_group == from_group)
        .values(consumer_group=to_group, group_defaulted=None)).rowcount
    conn.execute(insert(findings).values(
        pipeline=pipeline, consumer_group=to_group, kind="group_adopted",
        message=(f"consumer group {from_group!r} was only defaulted by the restart helper; the runs on its "
                 f"checkpoint report {to_group!r}, which takes over its {moved} generation(s), positions and resets"),
        details={"from_group": from_group, "to_group": to_group, "generations": moved},
        created_at=at or datetime.now(timezone.utc)))
    log.info("pipeline %s: defaulted consumer group %s adopted by %s (%d generations)", pipeline, from_group,
             to_group, moved)
    return int(moved or 0)


def claim_generation(conn: Connection, generation_id: int, query_id: str) -> None:
    """Bind an unclaimed generation to the first query that runs on it (a no-op once one has).

    A later query on the same checkpoint location is then told apart (``open_incarnation``).
    """
    g = checkpoint_generations
    conn.execute(update(g).where(g.c.id == generation_id, g.c.query_id.is_(None)).values(query_id=query_id))


def open_incarnation(conn: Connection, *, pipeline: str, consumer_group: str, query_id: str, location: str,
                     now: datetime | None = None) -> int | None:
    """The generation of a query that re-created the current generation's checkpoint in place.

    Someone started the job by hand on the current generation's location after its checkpoint was
    lost: Spark began a new query there (a new id, batch ids from 0). It runs at the pipeline's
    authoritative location, but it is not the query that claimed the generation, so it gets a
    generation of its own at the same location (reason ``checkpoint_recreated``, claimed by it, with
    a finding): its batches never match the old query's anywhere (sinks, positions, verify). Called
    by the recorder and the sinks, whichever sees the query first; under the pipeline lock, so both
    get the one generation. None when the newest generation is not at ``location`` (a run on an old
    generation's location stays foreign there).
    """
    lock_pipeline(conn, pipeline, consumer_group)
    g = checkpoint_generations
    mine = conn.execute(select(g.c.id).where(g.c.pipeline == pipeline, g.c.consumer_group == consumer_group,
                                             g.c.query_id == query_id)
                        .order_by(g.c.generation.desc()).limit(1)).scalar()
    if mine is not None:
        return int(mine)
    current = current_generation(conn, pipeline, consumer_group, offsets=False)
    if current is None or not same_location(location, current.location):
        return None
    if current.query_id is None:  # nobody claimed it after all: this query is its first
        claim_generation(conn, current.id, query_id)
        return current.id
    at = now or datetime.now(timezone.utc)
    number = current.generation + 1
    gen_id = conn.execute(insert(g).values(
        pipeline=pipeline, consumer_group=consumer_group, generation=number, checkpoint_root=current.checkpoint_root,
        location=current.location, app_version=current.app_version, reason="checkpoint_recreated", created_at=at,
        starting_offsets=None, resolved_offsets=None, topic_ids=dict(current.topic_ids) if current.topic_ids else None,
        query_id=query_id, group_defaulted=True if current.group_defaulted else None,
        sink_batch_floor=sink_batch_floor(conn),
    ).returning(g.c.id)).scalar_one()
    text_ = (f"query {query_id} re-created the checkpoint of generation {current.generation} at {current.location} "
             f"(query {current.query_id} ran on it; was the directory deleted and the job started by hand?): "
             f"recorded as generation {number}, a new incarnation at the same location whose batch ids never "
             f"match generation {current.generation}'s; its first batch starts where Spark says it did")
    conn.execute(insert(findings).values(
        pipeline=pipeline, consumer_group=consumer_group, kind="checkpoint_recreated", message=text_,
        details={"generation": number, "replaces_generation": current.generation, "checkpoint_location": location,
                 "query_id": current.query_id, "found_query_id": query_id},
        created_at=at, generation_id=gen_id))
    log.warning("offset-ledger: %s", text_)
    return int(gen_id)
