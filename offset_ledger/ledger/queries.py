"""Read-side queries over the ledger shared by the restart helper, the API and the CLI."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from functools import cache
from typing import Any

from sqlalchemy import Select, String, and_, case, exists, func, literal, or_, select, text, union, union_all
from sqlalchemy.engine import Connection

from offset_ledger.ledger.activity import open_runs
from offset_ledger.ledger.batch_ranges import expand
from offset_ledger.ledger.tables import (
    batches,
    checkpoint_generations,
    findings,
    listener_health,
    offset_ranges,
    positions,
    reset_partitions,
    resets,
    runs,
    topic_positions,
)
from offset_ledger.rules.model import Position, TopicPartition
from offset_ledger.rules.stateful import BatchFigures


def current_positions(
    conn: Connection, pipeline: str, consumer_group: str | None = None,
    topics: Sequence[str] | None = None,
) -> list[Position]:
    """The pipeline's current position per partition (next offset to read), sorted."""
    # Read from the rows per topic (0024), not through ``v_positions``: the view unnests every topic's
    # arrays into rows and sorts them in Postgres, and the driver then builds a row per partition; here
    # Postgres sends one row a topic (two arrays) and the positions are made from the arrays, already in
    # partition order (``tables.topic_positions`` keeps them ascending); figures in docs/benchmarks.md.
    t = topic_positions
    stmt = select(t.c.topic, t.c.partitions, t.c.next_offsets).where(
        t.c.pipeline == pipeline, t.c.consumer_group == (consumer_group or pipeline))
    if topics is not None:
        stmt = stmt.where(t.c.topic.in_(list(topics)))
    out: list[Position] = []
    for topic, parts, offsets in conn.execute(stmt.order_by(t.c.topic)).all():
        pairs = zip(parts, offsets)
        if any(a >= b for a, b in zip(parts, parts[1:])):  # a row some writer left unsorted: sort it
            pairs = sorted(pairs)
        out += [Position(topic, partition, offset) for partition, offset in pairs]
    return out


#: The default ``OFFSET_LEDGER_RUN_TIMEOUT`` (``ledger.activity``, ``rules.liveness``): how long a run
#: without listener heartbeats (a sink's or the watcher's) counts as running after its last batch.
#: Runs the listener watches are judged on their own heartbeats (a 60 s floor).
RUN_STALENESS = timedelta(minutes=10)

_CONFIGURED: Any = object()


def active_run_ids(
    conn: Connection, pipeline: str, consumer_group: str | None = None, *,
    stale_after: timedelta | None = _CONFIGURED, now: datetime | None = None,
) -> list[str]:
    """Runs that are active (``ledger.activity``): not terminated and heard from within their timeout.

    ``stale_after`` overrides the configured run timeout; ``None`` counts every unterminated run.
    """
    if stale_after is None:
        stmt = select(runs.c.run_id).where(
            runs.c.pipeline == pipeline, runs.c.consumer_group == (consumer_group or pipeline),
            runs.c.terminated_at.is_(None))
        return [r.run_id for r in conn.execute(stmt.order_by(runs.c.started_at))]
    timeout = None if stale_after is _CONFIGURED else stale_after
    found = open_runs(conn, pipeline, consumer_group or pipeline, now=now, timeout=timeout)
    return [a.run_id for acts in found.values() for a in acts if a.state == "active"]


def consumer_groups(conn: Connection, pipeline: str) -> list[str]:
    """The consumer groups the ledger knows for a pipeline (from positions and runs), sorted."""
    stmt = union(
        select(positions.c.consumer_group).where(positions.c.pipeline == pipeline),
        select(runs.c.consumer_group).where(runs.c.pipeline == pipeline),
    )
    return sorted(r[0] for r in conn.execute(stmt))


# The pipeline's (group, topic) pairs: one row each in topic_positions (0024), read by its primary key.
_PG_GROUP_TOPICS = text("""
    SELECT consumer_group, topic FROM topic_positions WHERE pipeline = :pipeline ORDER BY consumer_group, topic
""")


def pipeline_footprint(conn: Connection, pipeline: str) -> dict[str, dict[str, Any]]:
    """Everything the ledger holds for a pipeline, per consumer group: topics with positions and
    counts of batches, runs and checkpoint generations (empty: the ledger never saw it)."""
    out: dict[str, dict[str, Any]] = {}

    def entry(group: str) -> dict[str, Any]:
        return out.setdefault(group, {"topics": [], "batches": 0, "runs": 0, "generations": 0})

    if conn.dialect.name == "postgresql":
        rows = conn.execute(_PG_GROUP_TOPICS, {"pipeline": pipeline})
    else:
        rows = conn.execute(select(positions.c.consumer_group, positions.c.topic).distinct()
                            .where(positions.c.pipeline == pipeline)
                            .order_by(positions.c.consumer_group, positions.c.topic))
    for group, topic in rows:
        entry(group)["topics"].append(topic)
    for table, key in ((batches, "batches"), (runs, "runs"), (checkpoint_generations, "generations")):
        for r in conn.execute(select(table.c.consumer_group, func.count().label("n"))
                              .where(table.c.pipeline == pipeline).group_by(table.c.consumer_group)):
            entry(r.consumer_group)[key] = int(r.n)
    return out


def pipeline_summaries(conn: Connection) -> list[dict[str, Any]]:
    """One row per (pipeline, consumer group): partition count, last batch time and id, current generation.

    Built from the small tables and index-backed scalar subqueries, so its cost does not grow with
    the batch history.
    """
    return [dict(r._mapping) for r in conn.execute(_pipeline_summaries_stmt(conn.dialect.name == "postgresql"))]


@cache
def _pipeline_summaries_stmt(postgres: bool = True) -> Select[Any]:
    # Built once per dialect: constructing this statement cost as much as running it on every pipelines list.
    # The groups and their partition counts come from the rows per topic (0024), a row each, not from
    # ``v_positions``, which would unnest every position of every pipeline to count them.
    t = topic_positions
    groups = union(
        select(t.c.pipeline, t.c.consumer_group),
        select(runs.c.pipeline, runs.c.consumer_group),
    ).subquery("g")
    # One index probe per group finds the newest batch's row id; its time and id come by primary key.
    last_id = (
        select(batches.c.id)
        .where(batches.c.pipeline == groups.c.pipeline, batches.c.consumer_group == groups.c.consumer_group)
        .order_by(batches.c.batch_time.desc(), batches.c.id.desc()).limit(1).scalar_subquery()
    )
    latest = select(groups.c.pipeline, groups.c.consumer_group, last_id.label("last_id")).subquery("l")
    # A row's partitions: an array on PostgreSQL, a JSON array's text on SQLite (``tables.PackedInts``).
    width = func.cardinality(t.c.partitions) if postgres else func.json_array_length(t.c.partitions)
    counts = select(t.c.pipeline, t.c.consumer_group, func.sum(width).label("n")).group_by(
        t.c.pipeline, t.c.consumer_group).subquery("c")
    gen = _current_generations_stmt().subquery("gen")  # in the same round trip: one fewer per list
    return select(
        latest.c.pipeline, latest.c.consumer_group,
        func.coalesce(counts.c.n, 0).label("partitions"),
        batches.c.batch_time.label("last_batch_time"),
        batches.c.batch_id.label("last_batch_id"),
        gen.c.id.label("generation_id"), gen.c.generation.label("generation_number"),
        gen.c.app_version.label("generation_app_version"), gen.c.location.label("generation_location"),
    ).select_from(
        latest.outerjoin(batches, batches.c.id == latest.c.last_id).outerjoin(
            counts, and_(counts.c.pipeline == latest.c.pipeline, counts.c.consumer_group == latest.c.consumer_group)
        ).outerjoin(gen, and_(gen.c.pipeline == latest.c.pipeline, gen.c.consumer_group == latest.c.consumer_group))
    ).order_by(latest.c.pipeline, latest.c.consumer_group)


@cache
def _current_generations_stmt() -> Select[Any]:
    """The newest checkpoint generation of every pipeline that has one."""
    newest = (select(checkpoint_generations.c.pipeline, checkpoint_generations.c.consumer_group,
                     func.max(checkpoint_generations.c.generation).label("n"))
              .group_by(checkpoint_generations.c.pipeline, checkpoint_generations.c.consumer_group).subquery())
    return select(checkpoint_generations.c.pipeline, checkpoint_generations.c.consumer_group,
                  checkpoint_generations.c.id, checkpoint_generations.c.generation,
                  checkpoint_generations.c.app_version, checkpoint_generations.c.location).join(
        newest, and_(newest.c.pipeline == checkpoint_generations.c.pipeline,
                     newest.c.consumer_group == checkpoint_generations.c.consumer_group,
                     newest.c.n == checkpoint_generations.c.generation))


def position_details(conn: Connection, pipeline: str, consumer_group: str) -> list[dict[str, Any]]:
    """Positions with what placed them (batch or reset) and when, sorted by topic and partition."""
    stmt = select(
        positions.c.topic, positions.c.partition, positions.c.next_offset, positions.c.updated_at,
        positions.c.query_id, positions.c.batch_id, positions.c.reset_id, positions.c.generation_id,
    ).where(positions.c.pipeline == pipeline, positions.c.consumer_group == consumer_group)
    rows = conn.execute(stmt.order_by(positions.c.topic, positions.c.partition))
    return [dict(r._mapping) for r in rows]


def batch_history(
    conn: Connection, pipeline: str, consumer_group: str, *, topic: str | None = None,
    since: datetime | None = None, until: datetime | None = None, limit: int = 100,
    after: tuple[datetime, int] | None = None,
) -> list[dict[str, Any]]:
    """Committed batches, newest first, each with its partition ranges; keyset-paged.

    ``after`` is the (batch_time, id) of the last batch of the previous page; ``since`` is
    inclusive and ``until`` exclusive. With ``topic``, only batches (and ranges) of that topic.
    """
    stmt = select(
        batches.c.id, batches.c.query_id, batches.c.run_id, batches.c.batch_id,
        batches.c.batch_time, batches.c.recorded_at, batches.c.input_rows,
        batches.c.watermark, batches.c.event_time_min, batches.c.event_time_max,
        batches.c.state_rows_total, batches.c.state_rows_updated, batches.c.state_rows_dropped_by_watermark,
    ).where(batches.c.pipeline == pipeline, batches.c.consumer_group == consumer_group)
    if since is not None:
        stmt = stmt.where(batches.c.batch_time >= since)
    if until is not None:
        stmt = stmt.where(batches.c.batch_time < until)
    if topic is not None:
        stmt = stmt.where(exists().where(offset_ranges.c.batch_pk == batches.c.id, offset_ranges.c.topic == topic))
    if after is not None:
        t, i = after
        stmt = stmt.where(or_(batches.c.batch_time < t, and_(batches.c.batch_time == t, batches.c.id < i)))
    rows = [dict(r._mapping) for r in conn.execute(
        stmt.order_by(batches.c.batch_time.desc(), batches.c.id.desc()).limit(limit))]
    if not rows:
        return rows
    # The page's compact rows by primary key, expanded here: a row per (batch, source, topic), where the
    # per-partition view unnested every row and joined ``batches`` back by (query id, batch id).
    r = offset_ranges
    ranges = select(r.c.batch_pk, r.c.source_index, r.c.topic, r.c.partitions, r.c.from_offsets,
                    r.c.until_offsets).where(r.c.batch_pk.in_([row["id"] for row in rows]))
    if topic is not None:
        ranges = ranges.where(r.c.topic == topic)
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for pk, source, t, parts, froms, untils in conn.execute(ranges.order_by(r.c.batch_pk, r.c.source_index, r.c.topic)):
        by_batch.setdefault(pk, []).extend(
            {"source_index": source, "topic": t, "partition": p, "from_offset": f, "until_offset": u}
            for p, f, u in expand(parts, froms, untils))
    for row in rows:
        row["ranges"] = by_batch.get(row["id"], [])
    return rows


def reset_history(
    conn: Connection, pipeline: str, consumer_group: str, *, limit: int = 50, dry_runs: bool = True,
) -> list[dict[str, Any]]:
    """The pipeline's resets (dry runs included unless ``dry_runs=False``), newest first, each with its
    partitions."""
    stmt = select(resets).where(
        resets.c.pipeline == pipeline, resets.c.consumer_group == consumer_group,
        *(() if dry_runs else (resets.c.dry_run.is_(False),)),
    ).order_by(resets.c.created_at.desc(), resets.c.id.desc()).limit(limit)
    rows = [dict(r._mapping) for r in conn.execute(stmt)]
    if not rows:
        return rows
    parts: dict[int, list[dict[str, Any]]] = {}
    stmt_p = select(reset_partitions).where(reset_partitions.c.reset_id.in_([r["id"] for r in rows]))
    for r in conn.execute(stmt_p.order_by(reset_partitions.c.topic, reset_partitions.c.partition)):
        parts.setdefault(r.reset_id, []).append(dict(r._mapping))
    for row in rows:
        row["partitions"] = parts.get(row["id"], [])
    return rows


def resets_and_findings(conn: Connection) -> tuple[list[tuple[str, str, int, datetime | None]],
                                                     list[tuple[str, str, str, int]]]:
    """For /metrics, in one round trip: (pipeline, group, executed resets still pending, when the newest executed
    reset was made) per pipeline that ever executed one (dry runs are audit only: they move nothing), and
    (pipeline, group, kind, findings recorded) — a repeated finding counts once, as the pipelines list counts."""
    executed = select(resets.c.pipeline, resets.c.consumer_group, literal(None, String).label("kind"),
                      func.sum(case((resets.c.status == "pending", 1), else_=0)).label("n"),
                      func.max(resets.c.created_at).label("at")).where(
        resets.c.dry_run.is_(False)).group_by(resets.c.pipeline, resets.c.consumer_group)
    kinds = select(findings.c.pipeline, findings.c.consumer_group, findings.c.kind, func.count(),
                   literal(None, resets.c.created_at.type)).group_by(
        findings.c.pipeline, findings.c.consumer_group, findings.c.kind)
    pending: list[tuple[str, str, int, datetime | None]] = []
    found: list[tuple[str, str, str, int]] = []
    for p, g, kind, n, at in conn.execute(union_all(executed, kinds)):
        if kind is None:
            pending.append((p, g, int(n or 0), at))
        else:
            found.append((p, g, kind, int(n)))
    return pending, found


def listener_health_rows(conn: Connection) -> list[dict[str, Any]]:
    """Every listener's last health report."""
    stmt = select(listener_health).order_by(listener_health.c.pipeline, listener_health.c.listener_id)
    return [dict(r._mapping) for r in conn.execute(stmt)]


def live_query_id(conn: Connection, pipeline: str, consumer_group: str, generation_id: int | None) -> str | None:
    """The query of the pipeline's live checkpoint: of the newest batch a run on the current generation
    recorded, else (that generation never ran) of the pipeline's newest batch; None without batches."""
    newest = select(batches.c.query_id).where(batches.c.pipeline == pipeline,
                                              batches.c.consumer_group == consumer_group)
    query_id = None
    if generation_id is not None:
        query_id = conn.execute(
            newest.join(runs, runs.c.run_id == batches.c.run_id).where(runs.c.generation_id == generation_id)
            .order_by(batches.c.batch_time.desc(), batches.c.batch_id.desc()).limit(1)).scalar()
    if query_id is None:
        query_id = conn.execute(newest.order_by(batches.c.batch_time.desc(), batches.c.batch_id.desc())
                                .limit(1)).scalar()
    return query_id


def checkpoint_batches(
    conn: Connection, pipeline: str, consumer_group: str, generation_id: int | None,
) -> tuple[str | None, list[BatchFigures]]:
    """(query id, its batches with event-time figures and ranges) of the pipeline's live checkpoint.

    One checkpoint is one Spark query id. It is the query of the newest batch recorded by a run on
    the current generation; when that generation has no batch yet (planned, never started), the
    query of the pipeline's newest batch, so planning again gives the same answer.
    """
    query_id = live_query_id(conn, pipeline, consumer_group, generation_id)
    if query_id is None:
        return None, []
    ranges: dict[int, dict[TopicPartition, tuple[int | None, int]]] = {}
    r = offset_ranges
    for batch_id, topic, parts, froms, untils in conn.execute(
            select(batches.c.batch_id, r.c.topic, r.c.partitions, r.c.from_offsets, r.c.until_offsets)
            .select_from(batches.join(r, r.c.batch_pk == batches.c.id)).where(batches.c.query_id == query_id)):
        per = ranges.setdefault(batch_id, {})
        for partition, start, end in zip(parts, froms, untils):
            key = TopicPartition(topic, partition)
            old = per.get(key)
            # Two sources on one topic (a self-union): the lower start is the one neither skips from.
            if old is None or (start is not None and (old[0] is None or start < old[0])):
                per[key] = (start, end)

    def aware(value: datetime | None) -> datetime | None:
        return None if value is None else (value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value)

    out = [BatchFigures(r.batch_id, aware(r.watermark), aware(r.event_time_max), ranges.get(r.batch_id, {}))
           for r in conn.execute(select(batches.c.batch_id, batches.c.watermark, batches.c.event_time_max)
                                 .where(batches.c.query_id == query_id).order_by(batches.c.batch_id))]
    return query_id, out


# -- positions with their status window, a row per topic (PostgreSQL) --------------------------------------
# ``/metrics``, ``/lag`` and the pipelines list (``operate.lag_insight.positions_and_window``). Through
# ``v_positions`` the statement unnested every position into a row, numbered the (pipeline, group, topic)
# triples by a DISTINCT over those rows, joined each row back to its triple on three text keys, sorted all of
# them and sent them one by one: most of ``/metrics``' ledger read at 10,000 positions (docs/benchmarks.md).
# Here Postgres sends one row per topic: its partitions and next offsets as stored,
# which of its movers moved inside the window, and the window's lowest start and highest end per partition
# as three arrays; the positions are unrolled in Python, in the same order and the same tuples.
#
# One row per topic row. ``w``: the window's ranges per (topic row, partition) straight from
# ``offset_ranges`` (arrays unnested in the select list), the window's batches found from each topic row's
# (pipeline, consumer_group, batch_time) index range on ``batches``, as ``lag_insight._window_compact``.
# ``moved``: the movers (``stamps``' 1-based indexes) that placed positions inside the window by a batch.
_WINDOW_PG = """
WITH g AS MATERIALIZED (
    SELECT t.pipeline, t.consumer_group, t.topic, t.partitions, t.next_offsets, t.stamps, t.moved_at,
           t.moved_query_ids, row_number() OVER () AS n
    FROM topic_positions t {where}
), x AS (
    SELECT g.n, unnest(r.partitions) AS part, unnest(r.from_offsets) AS from_offset,
           unnest(r.until_offsets) AS until_offset
    FROM g JOIN batches b ON b.pipeline = g.pipeline AND b.consumer_group = g.consumer_group
                         AND b.batch_time >= :since
           JOIN offset_ranges r ON r.batch_pk = b.id AND r.topic = g.topic
), w AS (
    SELECT n, array_agg(part ORDER BY part) AS parts, array_agg(lo ORDER BY part) AS los,
           array_agg(hi ORDER BY part) AS his
    FROM (SELECT n, part, min(from_offset) AS lo, max(until_offset) AS hi FROM x GROUP BY n, part) y
    GROUP BY n
)
SELECT g.pipeline, g.consumer_group, g.topic, g.partitions, g.next_offsets, g.stamps,
       ARRAY(SELECT i FROM generate_subscripts(g.moved_at, 1) AS i
             WHERE g.moved_at[i] >= :since AND g.moved_query_ids[i] IS NOT NULL) AS moved,
       w.parts, w.los, w.his
FROM g LEFT JOIN w ON w.n = g.n
ORDER BY g.pipeline, g.consumer_group, g.topic
"""
_WINDOW_ALL = text(_WINDOW_PG.format(where=""))
_WINDOW_ONE = text(_WINDOW_PG.format(where="WHERE t.pipeline = :pipeline AND t.consumer_group = :consumer_group"))

WindowRow = tuple[str, str, str, int, int, int, "int | None", "int | None"]


def positions_and_window_pg(conn: Connection, since: datetime, pipeline: str | None = None,
                            consumer_group: str | None = None) -> Iterator[WindowRow]:
    """(pipeline, group, topic, partition, next offset, moved 0/1, window's lowest start or None, its highest
    end or None) per position, sorted by pipeline, group, topic and partition: the rows of the per-partition
    statement over ``v_positions`` (``ledger.lag_window``), PostgreSQL only."""
    params: dict[str, object] = {"since": since}
    if pipeline is not None:
        params.update(pipeline=pipeline, consumer_group=consumer_group)
    rows = conn.execute(_WINDOW_ONE if pipeline is not None else _WINDOW_ALL, params).all()
    for pipe, group, topic, parts, offsets, stamps, moved, wparts, los, his in rows:
        window = dict(zip(wparts, zip(los, his))) if wparts else {}
        moved_by = set(moved)
        if stamps is None:  # one mover placed them all (``tables.topic_positions``)
            flags = [1 if 1 in moved_by else 0] * len(parts)
        else:
            flags = [1 if s in moved_by else 0 for s in stamps]
        unrolled = zip(parts, offsets, flags)
        if any(a >= b for a, b in zip(parts, parts[1:])):  # a row some writer left unsorted
            unrolled = iter(sorted(unrolled))
        for part, offset, flag in unrolled:
            lo, hi = window.get(part, (None, None))
            yield pipe, group, topic, part, offset, flag, lo, hi
