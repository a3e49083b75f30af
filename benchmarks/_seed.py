"""Positions seeded as the ledger keeps them since 0024: one ``topic_positions`` row per topic, written by
``ledger.position_store`` (the path every writer but the listener's one statement takes, and the shape that
statement keeps: partitions ascending, one mover, ``stamps`` NULL).

A raw ``INSERT INTO positions`` (the per-partition table kept for the previous release) fires its
compatibility trigger instead, and the rows it leaves there turn on the mirroring of every later write
into ``positions``: the benchmark would then measure a ledger in the middle of a rolling upgrade, not the
layout users run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.engine import Connection

from offset_ledger.ledger import position_store
from offset_ledger.ledger.position_store import Placed


def seed_positions(conn: Connection, pipelines: Iterable[str], topic_of, partitions: int, next_offset: int,
                   at: datetime, query_of, batch_id: int | None) -> int:
    """Every partition ``0..partitions-1`` of ``topic_of(pipeline)`` at ``next_offset``, placed by batch
    ``batch_id`` of query ``query_of(pipeline)`` at ``at``; the consumer group is the pipeline's name (as the
    benches name them). Returns the positions written."""
    n = 0
    for pipeline in pipelines:
        placed = Placed(next_offset, at, query_of(pipeline), batch_id)
        changes = {(topic_of(pipeline), p): placed for p in range(partitions)}
        position_store.write(conn, pipeline, pipeline, changes, current={})
        n += len(changes)
    return n


def seed_rows(conn: Connection, rows: Iterable[dict]) -> int:
    """Positions given per partition (the per-partition table's columns), grouped per pipeline and group."""
    groups: dict[tuple[str, str], dict[tuple[str, int], Placed]] = defaultdict(dict)
    for r in rows:
        groups[(r["pipeline"], r["consumer_group"])][(r["topic"], r["partition"])] = Placed(
            r["next_offset"], r["updated_at"], r.get("query_id"), r.get("batch_id"), r.get("reset_id"),
            r.get("generation_id"))
    for (pipeline, group), changes in groups.items():
        position_store.write(conn, pipeline, group, changes, current={})
    return sum(len(c) for c in groups.values())
