"""Retention: delete old batch history in small transactions, keeping what the ledger promises.

Always kept, whatever their age: every position (the ``positions`` table is never touched), every
reset, every finding, every run and checkpoint generation, and these batches with all their
partition rows: the latest batch of each (pipeline, consumer group, topic, partition), the batch
that placed each current position, every batch a finding refers to, and the whole history of each
pipeline's live windowed query (``live_stateful_queries``: a stateful restart rewinds through it).
Only ``batches`` and ``batch_offsets`` rows lose history, and what they lose is recorded first as
islands in ``pruned_ranges`` (``ledger.prune_record``): ``verify`` sweeps them as the reads they
were, with the run that read them (a finding that flags a run still explains its pruned extra
reads), so its answer is the same before and after a prune; a restart's ``reconcile`` knows their
batch ids were pruned, not missed.

How the rows go: on PostgreSQL from 0018 ``offset_ranges`` is partitioned by batch id
(``ledger.partitions``); a whole-ledger prune replaces each aged partition (wholly below the newest
batch) by the rows it keeps and drops it, then deletes those partitions' old ``batches`` rows (one per
batch; from 0020 no foreign key probes ``offset_ranges`` for each, and ranges are always removed by
prune itself, never by a cascade). What is left older than the cutoff (the newest partitions, the
DEFAULT one, a partition whose lock stayed busy, SQLite, a ``--pipeline`` prune) is deleted batch by
batch in chunks. Either way the same rows go and the same stay.

A team's database role (``db grant``) prunes its own pipelines, one ``--pipeline`` at a time: row
security limits what it reads and deletes to them, and its grant includes the DELETE of batches and
ranges and the INSERT of islands this needs. A whole-ledger prune (partition swaps: DDL) is the
owner's, and refused for a scoped role with that reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import DateTime, Table, and_, bindparam, func, select, text, tuple_
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import ColumnElement

from offset_ledger.errors import InvalidDuration, InvalidInput, LedgerError
from offset_ledger.ledger.engine import PERMISSION_DENIED, permission_denied, translate_db_error
from offset_ledger.ledger.partitions import ensure_ahead, partitioned, swap_out, swappable
from offset_ledger.ledger.prune_record import record_pruned
from offset_ledger.ledger.row_security import scoped_self
from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    findings,
    offset_ranges,
    positions,
)

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 20_000
# Tuple-IN lists stay well under SQLite's bound-parameter limit.
_KEYS_PER_QUERY = 400

#: ``progress(table, deleted_so_far, to_delete)`` after each committed chunk.
ProgressCallback = Callable[[str, int, int], None]
BatchKey = tuple[str, int]  # (query_id, batch_id)


@dataclass(frozen=True)
class TableCounts:
    """For one table: rows older than the cutoff, of those kept (protected), and deleted."""

    older: int
    kept: int
    deleted: int


@dataclass(frozen=True)
class PruneReport:
    """What a prune found and did (``executed`` False: a dry run, ``deleted`` = would delete)."""

    cutoff: datetime
    pipeline: str | None
    executed: bool
    batches: TableCounts
    batch_offsets: TableCounts
    protected_batches: int
    seconds: float
    #: live windowed queries whose whole history was kept
    protected_queries: tuple[str, ...] = ()
    #: islands of deleted ranges recorded in ``pruned_ranges`` (verify explains their gaps by them)
    islands: int = 0
    #: of ``seconds``, the time spent reading the doomed ranges and writing their islands
    islands_seconds: float = 0.0
    #: PostgreSQL: ``offset_ranges`` partitions replaced by the rows they keep (0018), and the time it took
    partitions_swapped: int = 0
    swap_seconds: float = 0.0


def _tune(conn: Connection) -> None:
    """PostgreSQL: this transaction's statements without JIT and with room to hash.

    Prune's statements are one-off scans of a day or more of history: JIT costs them more than it saves,
    and the default ``work_mem`` makes the planner sort on disk what a hash of the groups holds in
    memory (figures: docs/benchmarks.md)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL jit = off"))
        conn.execute(text("SET LOCAL work_mem = '64MB'"))


def _pipeline_filter(table: Table, pipeline: str | None) -> list[ColumnElement[bool]]:
    return [table.c.pipeline == pipeline] if pipeline is not None else []


def _chunks(items: Sequence[BatchKey], size: int) -> Iterable[Sequence[BatchKey]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def protected_batch_keys(conn: Connection, cutoff: datetime, pipeline: str | None = None) -> set[BatchKey]:
    """The (query_id, batch_id) of every old batch that prune must keep."""
    keys = latest_old_batches_by_row(conn, cutoff, pipeline) if conn.dialect.name == "postgresql" else \
        latest_old_batches_by_partition(conn, cutoff, pipeline)
    for table in (positions, findings):
        rows = conn.execute(
            select(table.c.query_id, table.c.batch_id).distinct().where(
                table.c.query_id.is_not(None), table.c.batch_id.is_not(None),
                *_pipeline_filter(table, pipeline))
        )
        keys.update((r.query_id, r.batch_id) for r in rows)
    return keys


# The same answer as latest_old_batches_by_partition, read a row per (batch, source, topic) instead of one
# per partition-offset: the latest time per distinct partition list first (a pipeline has few), then per
# partition over those lists, then the batches of that time holding the partition.
_LATEST_OLD_PG = """
WITH lists AS (
    SELECT b.pipeline, b.consumer_group, r.topic, r.partitions, MAX(b.batch_time) AS latest
    FROM offset_ranges r JOIN batches b ON b.id = r.batch_pk {where}
    GROUP BY b.pipeline, b.consumer_group, r.topic, r.partitions
), latest AS (
    SELECT l.pipeline, l.consumer_group, l.topic, u.p, MAX(l.latest) AS latest
    FROM lists l CROSS JOIN LATERAL unnest(l.partitions) AS u (p)
    GROUP BY l.pipeline, l.consumer_group, l.topic, u.p
    HAVING MAX(l.latest) < :cutoff
)
SELECT DISTINCT b.query_id, b.batch_id
FROM latest l
JOIN batches b ON b.pipeline = l.pipeline AND b.consumer_group = l.consumer_group AND b.batch_time = l.latest
JOIN offset_ranges r ON r.batch_pk = b.id AND r.topic = l.topic AND l.p = ANY (r.partitions)
"""


def latest_old_batches_by_row(conn: Connection, cutoff: datetime, pipeline: str | None) -> set[BatchKey]:
    """PostgreSQL: each partition's latest batch where that is older than the cutoff, from the compact rows."""
    stmt = text(_LATEST_OLD_PG.format(where="WHERE b.pipeline = :pipeline" if pipeline is not None else ""))
    stmt = stmt.bindparams(bindparam("cutoff", cutoff, type_=DateTime(timezone=True)))
    params = {"pipeline": pipeline} if pipeline is not None else {}
    return {(r.query_id, r.batch_id) for r in conn.execute(stmt, params)}


def latest_old_batches_by_partition(conn: Connection, cutoff: datetime, pipeline: str | None) -> set[BatchKey]:
    """Each partition's latest batch where that is older than the cutoff (per partition-offset)."""
    bo = batch_offsets
    keys_cols = (bo.c.pipeline, bo.c.consumer_group, bo.c.topic, bo.c.partition)
    # Latest batch per partition; partitions whose latest batch is recent need nothing kept.
    latest = (
        select(*keys_cols, func.max(bo.c.batch_time).label("latest_time"))
        .where(*_pipeline_filter(bo, pipeline))
        .group_by(*keys_cols)
        .having(func.max(bo.c.batch_time) < cutoff)
        .subquery()
    )
    stmt = select(bo.c.query_id, bo.c.batch_id).distinct().join(
        latest,
        and_(bo.c.pipeline == latest.c.pipeline, bo.c.consumer_group == latest.c.consumer_group,
             bo.c.topic == latest.c.topic, bo.c.partition == latest.c.partition,
             bo.c.batch_time == latest.c.latest_time),
    )
    return {(r.query_id, r.batch_id) for r in conn.execute(stmt)}


# ``queries.live_query_id`` for every (pipeline, group) at once: the query of the newest batch a run on
# the group's newest generation recorded, else of the group's newest batch; kept when one of its
# batches carries a watermark. One statement instead of four round trips per group (docs/benchmarks.md).
# Correlated subqueries, no LATERAL: SQLite runs the same text.
_LIVE_STATEFUL = """
SELECT DISTINCT live.query_id FROM (
    SELECT COALESCE(
        (SELECT b.query_id FROM batches b JOIN runs r ON r.run_id = b.run_id
         WHERE b.pipeline = g.pipeline AND b.consumer_group = g.consumer_group
           AND r.generation_id = (SELECT MAX(c.id) FROM checkpoint_generations c
                                  WHERE c.pipeline = g.pipeline AND c.consumer_group = g.consumer_group)
         ORDER BY b.batch_time DESC, b.batch_id DESC LIMIT 1),
        (SELECT b.query_id FROM batches b WHERE b.pipeline = g.pipeline AND b.consumer_group = g.consumer_group
         ORDER BY b.batch_time DESC, b.batch_id DESC LIMIT 1)) AS query_id
    FROM (SELECT DISTINCT pipeline, consumer_group FROM batches {where}) g
) live
WHERE EXISTS (SELECT 1 FROM batches w WHERE w.query_id = live.query_id AND w.watermark IS NOT NULL)
"""


def live_stateful_queries(conn: Connection, pipeline: str | None = None) -> set[str]:
    """Each pipeline's live query (``queries.checkpoint_batches``' choice) when it carries a watermark.

    A windowed restart rewinds through the live query's batches back to the earliest one that saw
    an open window's records, which no age bounds: all of that query's history is kept until a new
    generation replaces it (then it is ordinary history again).
    """
    where, params = ("WHERE pipeline = :pipeline", {"pipeline": pipeline}) if pipeline is not None else ("", {})
    return {q for (q,) in conn.execute(text(_LIVE_STATEFUL.format(where=where)), params) if q is not None}


def _protected_row_ids(conn: Connection, table: Table, keys: set[BatchKey], cutoff: datetime,
                       pipeline: str | None, queries: set[str] = frozenset()) -> set[int]:  # type: ignore[assignment]
    """Ids of ``table`` rows older than the cutoff that belong to a protected batch or query."""
    ids: set[int] = set()
    for query_id in sorted(queries):
        ids.update(conn.execute(select(table.c.id).where(
            table.c.query_id == query_id, table.c.batch_time < cutoff)).scalars())
    for chunk in _chunks(sorted(keys), _KEYS_PER_QUERY):
        rows = conn.execute(
            select(table.c.id).where(
                tuple_(table.c.query_id, table.c.batch_id).in_(list(chunk)),
                table.c.batch_time < cutoff, *_pipeline_filter(table, pipeline))
        )
        ids.update(r.id for r in rows)
    return ids


def _count_older(conn: Connection, table: Table, cutoff: datetime, pipeline: str | None) -> int:
    stmt = select(func.count()).select_from(table).where(
        table.c.batch_time < cutoff, *_pipeline_filter(table, pipeline))
    return int(conn.execute(stmt).scalar_one())


def _count_older_ranges(conn: Connection, cutoff: datetime, pipeline: str | None) -> int:
    """Partition-offsets of batches older than the cutoff: summed per compact row, not unnested."""
    n = (func.cardinality(offset_ranges.c.partitions) if conn.dialect.name == "postgresql"
         else func.json_array_length(offset_ranges.c.partitions))
    stmt = select(func.coalesce(func.sum(n), 0)).select_from(
        offset_ranges.join(batches, batches.c.id == offset_ranges.c.batch_pk)).where(
        batches.c.batch_time < cutoff, *_pipeline_filter(batches, pipeline))
    return int(conn.execute(stmt).scalar_one())


def _partitions_of(conn: Connection, batch_pks: Iterable[int]) -> int:
    """How many partition-offsets (``batch_offsets`` rows) the batches ``batch_pks`` recorded."""
    n = (func.cardinality(offset_ranges.c.partitions) if conn.dialect.name == "postgresql"
         else func.json_array_length(offset_ranges.c.partitions))
    ids, total = sorted(batch_pks), 0
    for i in range(0, len(ids), _KEYS_PER_QUERY):
        total += int(conn.execute(select(func.coalesce(func.sum(n), 0)).where(
            offset_ranges.c.batch_pk.in_(ids[i:i + _KEYS_PER_QUERY]))).scalar_one())
    return total


def _delete_batches_in_chunks(engine: Engine, cutoff: datetime, pipeline: str | None, keep_ids: set[int],
                              to_delete: tuple[int, int], chunk_size: int,
                              progress: ProgressCallback | None) -> tuple[int, int]:
    """Delete old, unprotected batches with their ranges walking ``batches.id``, one transaction per
    chunk of whole batches holding at most ``chunk_size`` partition-offsets (at least one batch);
    returns (partition-offsets, batches) deleted."""
    sizes = (func.cardinality(offset_ranges.c.partitions) if engine.dialect.name == "postgresql"
             else func.json_array_length(offset_ranges.c.partitions))
    per_batch = (select(offset_ranges.c.batch_pk, func.sum(sizes).label("n"))
                 .group_by(offset_ranges.c.batch_pk).subquery())
    old = [batches.c.batch_time < cutoff, *_pipeline_filter(batches, pipeline)]
    done_bo = done_b = 0
    last_id = -1
    while True:
        with engine.begin() as conn:
            rows = conn.execute(
                select(batches.c.id, func.coalesce(per_batch.c.n, 0))
                .select_from(batches.outerjoin(per_batch, per_batch.c.batch_pk == batches.c.id))
                .where(batches.c.id > last_id, *old).order_by(batches.c.id).limit(chunk_size)).all()
            if not rows:
                break
            gone: list[int] = []
            ranges = 0
            for pk, n in rows:
                if gone and ranges + n > chunk_size:
                    break
                last_id = pk
                if pk not in keep_ids:
                    gone.append(pk)
                    ranges += int(n)
            if gone:
                # Ranges first (no reliance on ON DELETE CASCADE: SQLite enforces it only with its pragma).
                conn.execute(offset_ranges.delete().where(offset_ranges.c.batch_pk.in_(gone)))
                done_b += conn.execute(batches.delete().where(batches.c.id.in_(gone))).rowcount or 0
                done_bo += ranges
        log.debug("pruned %d/%d batches (%d/%d ranges)", done_b, to_delete[1], done_bo, to_delete[0])
        if progress is not None:
            progress("batch_offsets", done_bo, to_delete[0])
            progress("batches", done_b, to_delete[1])
    return done_bo, done_b


def _swap_aged_partitions(engine: Engine, cutoff: datetime, keep_ids: set[int], to_delete: tuple[int, int],
                          chunk_size: int, progress: ProgressCallback | None) -> tuple[int, int, int]:
    """PostgreSQL from 0018: each aged partition swapped for the rows it keeps, then its old batches
    deleted (a chunk of ids a transaction); returns (partition-offsets, batches removed, partitions)."""
    with engine.connect() as conn:
        if not partitioned(conn):
            return 0, 0, 0
        _tune(conn)
        todo = swappable(conn, cutoff, keep_ids)
    done_bo = done_b = swaps = 0
    for part, protected in todo:  # the old batches it keeps (the recent ones are told by their time)
        swapped = swap_out(engine, part, protected, cutoff)
        if swapped is None:
            continue  # its lock stayed busy: the chunked DELETE below takes its rows
        swaps += 1
        done_bo += swapped.removed_ranges
        log.info("prune: partition %s kept %d rows, removed %d partition-offsets in %.2f s (%.3f s locked)",
                 swapped.name, swapped.kept_rows, swapped.removed_ranges, swapped.seconds, swapped.locked_seconds)
        lo = -(2 ** 63) if part.lo is None else part.lo
        first = lo
        with engine.connect() as conn:  # the lowest batch id of the range (MINVALUE: no walk from -2^63)
            first = int(conn.execute(text("SELECT COALESCE(MIN(id), :hi) FROM batches WHERE id >= :lo AND id < :hi"),
                                     {"lo": lo, "hi": part.hi}).scalar_one())
        step = max(chunk_size // 10, 1_000)  # ids a transaction: ~100 partition-offsets a batch
        for start in range(first, part.hi, step):
            stop = min(start + step, part.hi)
            kept = [i for i in protected if start <= i < stop]
            # The batches whose ranges the swap removed: old and not protected (a recent batch, whatever
            # its id, kept its ranges and stays); no foreign key probes offset_ranges for each (0020).
            delete = text("DELETE FROM batches WHERE id >= :a AND id < :b AND batch_time < :cutoff "
                          "AND id <> ALL(:keep)")
            with engine.begin() as conn:
                done_b += conn.execute(delete.bindparams(bindparam("cutoff", cutoff, type_=DateTime(timezone=True))),
                                       {"a": start, "b": stop, "keep": kept}).rowcount or 0
            if progress is not None:
                progress("batch_offsets", done_bo, to_delete[0])
                progress("batches", done_b, to_delete[1])
    return done_bo, done_b, swaps


def _scoped_role(engine: Engine) -> str | None:
    """The role when a grant scopes it to its team's pipelines (``row_security``), else None."""
    try:
        with engine.connect() as conn:
            return scoped_self(conn)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "pruning") from exc


def prune(engine: Engine, older_than: timedelta, *, pipeline: str | None = None,
          execute: bool = False, chunk_size: int = DEFAULT_CHUNK_SIZE, now: datetime | None = None,
          progress: ProgressCallback | None = None) -> PruneReport:
    """Remove batch history older than ``older_than`` (dry run unless ``execute``).

    Findings are never deleted, whatever their age: they are the audit's evidence, and a repeated
    finding is one counted row (``ledger.finding_store``), so their number grows with distinct
    problems, not with batches. The batch a finding names (its latest sighting) keeps its rows.
    """
    if older_than <= timedelta(0):
        raise InvalidDuration(str(older_than), "older_than", "must be longer than zero")
    started = time.perf_counter()
    cutoff = (now or datetime.now(timezone.utc)) - older_than
    role = _scoped_role(engine)
    if role is not None and pipeline is None:
        raise InvalidInput(f"ledger role {role!r} reaches only its team's pipelines: prune them one at a time "
                           "with --pipeline (a whole-ledger prune swaps partitions: the owner's task)",
                           option="--pipeline")
    try:
        with engine.connect() as conn:
            _tune(conn)
            keys = protected_batch_keys(conn, cutoff, pipeline)
            live = live_stateful_queries(conn, pipeline)
            keep_b = _protected_row_ids(conn, batches, keys, cutoff, pipeline, live)
            keep_bo = _partitions_of(conn, keep_b)
            older_bo = _count_older_ranges(conn, cutoff, pipeline)
            older_b = _count_older(conn, batches, cutoff, pipeline)
        todo_bo, todo_b = older_bo - keep_bo, older_b - len(keep_b)
        done_bo, done_b = todo_bo, todo_b
        islands, islands_started = 0, time.perf_counter()
        if execute and todo_bo > 0:
            with engine.begin() as conn:
                _tune(conn)
                islands = record_pruned(conn, cutoff, pipeline, keep_b, datetime.now(timezone.utc))
        islands_seconds = time.perf_counter() - islands_started
        swaps, swap_started = 0, time.perf_counter()
        if execute:
            swapped_bo = swapped_b = 0
            if pipeline is None and engine.dialect.name == "postgresql" and todo_b > 0:
                ensure_ahead(engine)
                swapped_bo, swapped_b, swaps = _swap_aged_partitions(engine, cutoff, keep_b, (todo_bo, todo_b),
                                                                     chunk_size, progress)
            swap_seconds = time.perf_counter() - swap_started
            def after_swaps(table: str, done: int, total: int) -> None:  # counts go on from the swaps'
                assert progress is not None
                progress(table, done + (swapped_bo if table == "batch_offsets" else swapped_b), total)
            done_bo, done_b = _delete_batches_in_chunks(engine, cutoff, pipeline, keep_b, (todo_bo, todo_b),
                                                        chunk_size, after_swaps if progress is not None else None)
            done_bo, done_b = done_bo + swapped_bo, done_b + swapped_b
        else:
            swap_seconds = 0.0
    except SQLAlchemyError as exc:
        if role is not None and permission_denied(exc):  # the right it lacks, named (not a later symptom)
            detail = " ".join(str(getattr(exc, "orig", None) or exc).split())
            raise LedgerError(f"ledger role {role!r} may not prune pipeline {pipeline!r}: {detail}",
                              sqlstate=PERMISSION_DENIED) from exc
        raise translate_db_error(exc, "pruning") from exc
    report = PruneReport(
        cutoff=cutoff, pipeline=pipeline, executed=execute,
        batches=TableCounts(older_b, len(keep_b), done_b),
        batch_offsets=TableCounts(older_bo, keep_bo, done_bo),
        protected_batches=len(keys), seconds=time.perf_counter() - started, protected_queries=tuple(sorted(live)),
        islands=islands, islands_seconds=islands_seconds, partitions_swapped=swaps, swap_seconds=swap_seconds,
    )
    log.info("prune %s: %s", "executed" if execute else "dry run", report)
    return report
