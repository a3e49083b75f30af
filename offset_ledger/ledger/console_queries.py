"""Read-only queries the web console needs beyond ``ledger.queries``: runs, generations, findings.

Kept apart from ``queries`` so the console can grow without touching the shared read path.
Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import checkpoint_generations, findings, runs


def finding_counts(conn: Connection, *, except_kinds: Collection[str] = ()) -> dict[tuple[str, str], int]:
    """Findings per (pipeline, consumer group), leaving out the kinds in ``except_kinds``.

    The ledger has no "resolved" flag on findings, so every recorded finding counts.
    """
    stmt = select(findings.c.pipeline, findings.c.consumer_group, func.count().label("n")).group_by(
        findings.c.pipeline, findings.c.consumer_group)
    if except_kinds:
        stmt = stmt.where(findings.c.kind.not_in(sorted(except_kinds)))
    return {(r.pipeline, r.consumer_group): int(r.n) for r in conn.execute(stmt)}


def latest_runs(conn: Connection) -> dict[tuple[str, str], dict[str, Any]]:
    """The most recently started run of every (pipeline, consumer group)."""
    newest = select(runs.c.pipeline, runs.c.consumer_group, func.max(runs.c.started_at).label("started_at")).group_by(
        runs.c.pipeline, runs.c.consumer_group).subquery("n")
    stmt = select(runs.c.pipeline, runs.c.consumer_group, runs.c.run_id, runs.c.app_version,
                  runs.c.checkpoint_location, runs.c.started_at).join(
        newest, (newest.c.pipeline == runs.c.pipeline) & (newest.c.consumer_group == runs.c.consumer_group)
        & (newest.c.started_at == runs.c.started_at))
    return {(r.pipeline, r.consumer_group): dict(r._mapping) for r in conn.execute(stmt)}


def pipeline_runs(conn: Connection, pipeline: str, consumer_group: str, *, limit: int = 50) -> list[dict[str, Any]]:
    """The pipeline's runs, newest first."""
    stmt = select(
        runs.c.run_id, runs.c.query_id, runs.c.query_name, runs.c.app_version, runs.c.checkpoint_location,
        runs.c.started_at, runs.c.terminated_at, runs.c.exception, runs.c.last_heartbeat_at,
        runs.c.last_batch_id, runs.c.generation_id,
    ).where(runs.c.pipeline == pipeline, runs.c.consumer_group == consumer_group)
    rows = conn.execute(stmt.order_by(runs.c.started_at.desc(), runs.c.run_id).limit(limit))
    return [dict(r._mapping) for r in rows]


def pipeline_generations(
    conn: Connection, pipeline: str, consumer_group: str, *, limit: int = 50,
) -> list[dict[str, Any]]:
    """The pipeline's checkpoint generations, newest first."""
    g = checkpoint_generations
    stmt = select(g.c.id, g.c.generation, g.c.checkpoint_root, g.c.location, g.c.app_version, g.c.reason,
                  g.c.created_at, g.c.starting_offsets).where(
        g.c.pipeline == pipeline, g.c.consumer_group == consumer_group)
    return [dict(r._mapping) for r in conn.execute(stmt.order_by(g.c.generation.desc()).limit(limit))]


def pipeline_findings(
    conn: Connection, pipeline: str, consumer_group: str, *, limit: int = 100,
) -> list[dict[str, Any]]:
    """The pipeline's findings, most recently seen first (a repeated finding is one row with a count)."""
    f = findings
    last_seen = func.coalesce(f.c.last_seen_at, f.c.created_at)
    stmt = select(f.c.id, f.c.kind, f.c.topic, f.c.partition, f.c.query_id, f.c.batch_id,
                  f.c.expected_offset, f.c.actual_offset, f.c.message, f.c.created_at,
                  func.coalesce(f.c.occurrences, 1).label("occurrences"), last_seen.label("last_seen_at")).where(
        f.c.pipeline == pipeline, f.c.consumer_group == consumer_group)
    return [dict(r._mapping) for r in conn.execute(stmt.order_by(last_seen.desc(), f.c.id.desc()).limit(limit))]
