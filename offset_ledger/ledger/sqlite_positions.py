"""SQLite's ``offset_ledger_position_set`` (0024): what ``v_positions``' INSTEAD OF triggers call there.

Kept apart from ``ledger.position_store`` (which it mirrors for JSON text) so that ``ledger.engine``,
which registers it on every SQLite connection, imports nothing of the schema.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

_MOVER_COLUMNS = ("moved_at", "moved_batch_ids", "moved_reset_ids", "moved_generation_ids", "moved_query_ids")


@dataclass(frozen=True)
class PositionSet:
    """The 15 arguments of one ``offset_ledger_position_set`` call, in the SQL function's order: a topic row's
    JSON columns as stored, then the partition to set and what moved it."""

    partitions: str
    stamps: str | None
    next_offsets: str
    moved_at: str
    moved_batch_ids: str
    moved_reset_ids: str
    moved_generation_ids: str
    moved_query_ids: str
    partition: int
    next_offset: int | None  # None: drop the partition
    updated_at: str | None
    batch_id: int | None
    reset_id: int | None
    generation_id: int | None
    query_id: str | None


#: The SQL function's arity (``ledger.engine`` registers it with this many arguments).
ARITY = len(fields(PositionSet))


def sqlite_set(*columns: Any) -> str:
    """SQLite's ``offset_ledger_position_set``: a topic row's JSON columns with one partition set (or dropped:
    ``next_offset`` None), as a JSON object of the new columns. ``v_positions``' INSTEAD OF triggers call it
    (a single-row write to the view: tools, tests) with the ``PositionSet`` columns in order;
    ``ledger.engine`` registers it on each connection. Times stay the text SQLAlchemy's SQLite DateTime wrote."""
    call = PositionSet(*columns)
    load_ = json.loads
    parts = load_(call.partitions)
    st = load_(call.stamps) if call.stamps else [1] * len(parts)
    movers = list(zip(*(load_(c) for c in (call.moved_at, call.moved_batch_ids, call.moved_reset_ids,
                                            call.moved_generation_ids, call.moved_query_ids))))
    by_partition = {p: (o, movers[s - 1]) for p, s, o in zip(parts, st, load_(call.next_offsets))}
    if call.next_offset is None:
        by_partition.pop(call.partition, None)
    else:
        by_partition[call.partition] = (call.next_offset, (call.updated_at, call.batch_id, call.reset_id,
                                                           call.generation_id, call.query_id))
    order = sorted(by_partition)
    numbered: dict[Any, int] = {}
    new_stamps = [numbered.setdefault(by_partition[p][1], len(numbered) + 1) for p in order]
    cols = list(zip(*numbered)) if numbered else [()] * 5
    return json.dumps({
        "partitions": order, "stamps": None if len(numbered) <= 1 else new_stamps,
        "next_offsets": [by_partition[p][0] for p in order],
        **{name: list(values) for name, values in zip(_MOVER_COLUMNS, cols)}}, separators=(",", ":"))
