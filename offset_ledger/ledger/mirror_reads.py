"""What the Kafka group mirror (``kafka.mirror``) reads of the ledger: one group's positions and epoch."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import checkpoint_generations, positions, resets


def mirror_positions(conn: Connection, pipeline: str, group: str) -> tuple[int, list[Any]]:
    """(the ledger epoch: the group's newest checkpoint-generation id, 0 without one; its positions).

    Each position row: ``topic``, ``partition``, ``next_offset``, ``query_id``, ``batch_id`` and
    ``status``, the status of the reset that placed it (None: a batch placed it).
    """
    epoch = conn.execute(select(func.max(checkpoint_generations.c.id)).where(
        checkpoint_generations.c.pipeline == pipeline, checkpoint_generations.c.consumer_group == group)).scalar()
    rows = conn.execute(
        select(positions.c.topic, positions.c.partition, positions.c.next_offset, positions.c.query_id,
               positions.c.batch_id, resets.c.status)
        .select_from(positions.outerjoin(resets, resets.c.id == positions.c.reset_id))
        .where(positions.c.pipeline == pipeline, positions.c.consumer_group == group))
    return int(epoch or 0), list(rows)
