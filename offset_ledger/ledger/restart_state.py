"""What a restart's requirements name, read from the ledger: the state a plan rests on, and the same state
again under the pipeline lock before its generation is written (``rules.restart_requirements``).

Only what the requirements name is read: the consumer groups when the plan chose the group, the
current generation, the pending resets, the positions (compared by the database:
``ledger.position_check``) and the fences of the sinks the plan weighed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.position_check import positions_moved
from offset_ledger.ledger.queries import pipeline_footprint
from offset_ledger.ledger.tables import sinks
from offset_ledger.rules.restart_requirements import (
    GroupsUnchanged,
    LedgerNow,
    Requirement,
    fenced_sinks,
    positions_requirement,
)


def sink_fences(conn: Connection, pipeline: str, consumer_group: str,
                names: Sequence[str] | None = None) -> dict[str, int]:
    """Each sink's fence: its last committed sequence (``names``: only these; None: every sink of the pipeline)."""
    query = select(sinks.c.sink, sinks.c.last_sequence).where(
        sinks.c.pipeline == pipeline, sinks.c.consumer_group == consumer_group)
    if names is not None:
        query = query.where(sinks.c.sink.in_(sorted(set(names))))
    return {str(sink): int(seq) for sink, seq in conn.execute(query)}


def ledger_now(conn: Connection, pipeline: str, consumer_group: str,
               requirements: Sequence[Requirement]) -> LedgerNow:
    """The ledger as ``requirements`` name it, read on ``conn`` (under the pipeline lock the caller holds)."""
    groups: tuple[str, ...] = ()
    if any(isinstance(r, GroupsUnchanged) for r in requirements):
        groups = tuple(sorted(pipeline_footprint(conn, pipeline)))
    current = gens.current_generation(conn, pipeline, consumer_group, offsets=False)
    pending = tuple(gens.pending_reset_ids(conn, pipeline, consumer_group))
    moved = 0
    seen = positions_requirement(requirements)
    if seen is not None:
        moved = positions_moved(conn, pipeline, consumer_group, seen.topics, seen.positions)
    fenced = fenced_sinks(requirements)
    fences = sink_fences(conn, pipeline, consumer_group, fenced) if fenced else {}
    return LedgerNow(groups, current.id if current else None, current.generation if current else None, pending,
                     moved, fences)
