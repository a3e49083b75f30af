"""Positions as a row per topic (0024): the one place that reads and writes ``topic_positions``' arrays.

A position is still per partition (``Placed``: the next offset and who placed it); the table keeps a
topic's partitions in one row, their offsets as an array and who placed them as a short list of
*movers* the ``stamps`` array points into (``tables.topic_positions``). Readers read the view
``v_positions`` (``tables.positions``), one row per partition; every writer but the listener's
one-statement path (``ledger.fast_batch``, which writes the row in SQL) changes positions here: one
read of the topics' rows (locked on PostgreSQL) and one write per topic that changed, whatever the
number of partitions. Callers hold the pipeline lock (``ledger.locks``) as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from offset_ledger.ledger.records import utc
from offset_ledger.ledger.tables import topic_positions


@dataclass(frozen=True)
class Placed:
    """One partition's position: the next offset to read and who placed it (the per-partition columns)."""

    next_offset: int
    updated_at: datetime
    query_id: str | None = None
    batch_id: int | None = None
    reset_id: int | None = None
    generation_id: int | None = None

    def mover(self) -> tuple[datetime, int | None, int | None, int | None, str | None]:
        return (self.updated_at, self.batch_id, self.reset_id, self.generation_id, self.query_id)


_MOVER_COLUMNS = ("moved_at", "moved_batch_ids", "moved_reset_ids", "moved_generation_ids", "moved_query_ids")


def decode(row: Any) -> dict[int, Placed]:
    """A ``topic_positions`` row as partition -> Placed."""
    stamps = row.stamps or [1] * len(row.partitions)
    movers = list(zip(*(getattr(row, c) for c in _MOVER_COLUMNS)))
    out: dict[int, Placed] = {}
    for partition, stamp, offset in zip(row.partitions, stamps, row.next_offsets):
        at, batch_id, reset_id, generation_id, query_id = movers[stamp - 1]
        out[int(partition)] = Placed(int(offset), utc(at), query_id, batch_id, reset_id, generation_id)
    return out


def encode(parts: Mapping[int, Placed]) -> dict[str, Any]:
    """The array columns of ``parts`` (not empty), canonical: partitions ascending, movers in order of first
    use, ``stamps`` NULL when one mover placed them all (what the one-statement path requires)."""
    order = sorted(parts)
    movers: dict[tuple[Any, ...], int] = {}
    stamps = []
    for p in order:
        key = parts[p].mover()
        stamps.append(movers.setdefault(key, len(movers) + 1))
    cols: dict[str, Any] = {"partitions": order, "stamps": None if len(movers) == 1 else stamps,
                            "next_offsets": [parts[p].next_offset for p in order]}
    for i, name in enumerate(_MOVER_COLUMNS):
        cols[name] = [m[i] for m in movers]
    return cols


def load(conn: Connection, pipeline: str, consumer_group: str, topics: Iterable[str] | None = None,
         *, lock: bool = False) -> dict[str, dict[int, Placed]]:
    """topic -> partition -> Placed of one pipeline and group (``topics``: only those); ``lock``: FOR UPDATE
    of the rows, in topic order (the byte-wise order every writer keeps)."""
    t = topic_positions
    stmt = select(t).where(t.c.pipeline == pipeline, t.c.consumer_group == consumer_group)
    if topics is not None:
        stmt = stmt.where(t.c.topic.in_(sorted(set(topics))))
    if lock and conn.dialect.name == "postgresql":
        stmt = stmt.order_by(t.c.topic.collate("C")).with_for_update()
    return {r.topic: decode(r) for r in conn.execute(stmt)}


def lock(conn: Connection, pipeline: str, consumer_group: str, topics: Iterable[str]) -> None:
    """PostgreSQL: the rows of ``topics`` locked (FOR UPDATE) in byte-wise topic order, every writer's."""
    if conn.dialect.name != "postgresql":
        return
    t = topic_positions
    conn.execute(select(t.c.topic).where(t.c.pipeline == pipeline, t.c.consumer_group == consumer_group,
                                         t.c.topic.in_(sorted(set(topics))))
                 .order_by(t.c.topic.collate("C")).with_for_update())


def write(conn: Connection, pipeline: str, consumer_group: str,
          changes: Mapping[tuple[str, int], Placed | None], *, keep_generation: bool = False,
          current: Mapping[str, Mapping[int, Placed]] | None = None) -> None:
    """Apply ``changes`` ((topic, partition) -> the new position, None: drop it): one statement per topic
    that changed. ``keep_generation``: a partition keeps the generation id it had (a batch or a reset
    moving it; None when new), as the per-partition UPDATE that left the column alone did. ``current``:
    the rows as the caller just read them under the lock (else read here, locked)."""
    if not changes:
        return
    topics = sorted({t for t, _ in changes})
    held = current if current is not None else load(conn, pipeline, consumer_group, topics, lock=True)
    for topic in topics:
        mine = {k[1]: v for k, v in changes.items() if k[0] == topic}
        if not _write_topic(conn, pipeline, consumer_group, topic, held.get(topic), mine, keep_generation):
            # Another writer (a shared pipeline lock: two recorders of one pipeline) inserted the row
            # after we read none: apply ours over theirs, as the per-partition upsert did.
            again = load(conn, pipeline, consumer_group, [topic], lock=True).get(topic)
            _write_topic(conn, pipeline, consumer_group, topic, again, mine, keep_generation)


def _write_topic(conn: Connection, pipeline: str, consumer_group: str, topic: str,
                 before: Mapping[int, Placed] | None, mine: Mapping[int, Placed | None],
                 keep_generation: bool) -> bool:
    """One topic row written; False: it was not there when read and another writer inserted it since."""
    parts = dict(before or {})
    for partition, placed in mine.items():
        if placed is None:
            parts.pop(partition, None)
            continue
        if keep_generation:
            old = parts.get(partition)
            placed = replace(placed, generation_id=None if old is None else old.generation_id)
        parts[partition] = placed
    if parts == dict(before or {}):
        return True
    t = topic_positions
    key = (t.c.pipeline == pipeline, t.c.consumer_group == consumer_group, t.c.topic == topic)
    if not parts:
        conn.execute(delete(t).where(*key))
    elif before is None:
        values = {"pipeline": pipeline, "consumer_group": consumer_group, "topic": topic, **encode(parts)}
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            done = conn.execute(pg_insert(t).values(**values).on_conflict_do_nothing())
            return bool(done.rowcount)
        conn.execute(insert(t).values(**values))
    else:
        conn.execute(update(t).where(*key).values(**encode(parts)))
    return True


def drop_group(conn: Connection, pipeline: str, consumer_group: str) -> None:
    """Every position of one pipeline and group gone."""
    t = topic_positions
    conn.execute(delete(t).where(t.c.pipeline == pipeline, t.c.consumer_group == consumer_group))

