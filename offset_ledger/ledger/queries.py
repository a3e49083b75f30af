"""Read-side queries over the ledger shared by the restart helper, the API and the CLI."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import positions, runs
from offset_ledger.model import Position


def current_positions(
    conn: Connection, pipeline: str, consumer_group: str | None = None,
    topics: Sequence[str] | None = None,
) -> list[Position]:
    """The pipeline's current position per partition (next offset to read), sorted."""
    stmt = select(positions.c.topic, positions.c.partition, positions.c.next_offset).where(
        positions.c.pipeline == pipeline,
        positions.c.consumer_group == (consumer_group or pipeline),
    )
    if topics is not None:
        stmt = stmt.where(positions.c.topic.in_(list(topics)))
    rows = conn.execute(stmt.order_by(positions.c.topic, positions.c.partition))
    return [Position(r.topic, r.partition, r.next_offset) for r in rows]


def active_run_ids(conn: Connection, pipeline: str, consumer_group: str | None = None) -> list[str]:
    """Runs that started and have not reported termination."""
    stmt = select(runs.c.run_id).where(
        runs.c.pipeline == pipeline,
        runs.c.consumer_group == (consumer_group or pipeline),
        runs.c.terminated_at.is_(None),
    ).order_by(runs.c.started_at)
    return [r.run_id for r in conn.execute(stmt)]
