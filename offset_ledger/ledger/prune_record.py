"""Before prune deletes ranges, record their islands in ``pruned_ranges`` (``rules.pruned``).

Written in one transaction before the first delete: an interrupted prune then has recorded more
than it deleted, which explains nothing wrongly (a range still in the ledger leaves no gap to
explain), where the reverse order could leave a deleted stretch nobody accounts for.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import batch_offsets, pruned_ranges
from offset_ledger.rules.pruned import DeletedRange, islands

_STREAM_ROWS = 10_000
_INSERT_ROWS = 1_000


def _deleted_rows(conn: Connection, cutoff: datetime, pipeline: str | None, keep_ids: set[int]) -> Iterator[DeletedRange]:
    bo = batch_offsets
    stmt = (select(bo.c.id, bo.c.pipeline, bo.c.consumer_group, bo.c.query_id, bo.c.topic, bo.c.partition,
                   bo.c.batch_id, bo.c.from_offset, bo.c.until_offset, bo.c.batch_time)
            .where(bo.c.batch_time < cutoff, *([bo.c.pipeline == pipeline] if pipeline is not None else []))
            .order_by(bo.c.pipeline, bo.c.consumer_group, bo.c.query_id, bo.c.topic, bo.c.partition, bo.c.batch_id,
                      bo.c.id)
            # On the statement, not the connection: Connection.execution_options changes the connection
            # in place, and the inserts on it would then be declared as server-side cursors too.
            .execution_options(yield_per=_STREAM_ROWS))
    last: tuple[object, ...] | None = None
    for r in conn.execute(stmt):
        if r.id in keep_ids:
            continue
        key = (r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id)
        if key == last:  # one batch, two sources on the same partition: one read of its range
            continue
        last = key
        yield DeletedRange(r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id,
                           r.from_offset, r.until_offset, r.batch_time)


def record_pruned(conn: Connection, cutoff: datetime, pipeline: str | None, keep_ids: set[int],
                  pruned_at: datetime) -> int:
    """Insert the islands of the rows about to be deleted; returns how many."""
    pending: list[dict[str, object]] = []
    written = 0
    for island in islands(_deleted_rows(conn, cutoff, pipeline, keep_ids)):
        pending.append({**island.__dict__, "cutoff": cutoff, "pruned_at": pruned_at})
        if len(pending) >= _INSERT_ROWS:
            conn.execute(pruned_ranges.insert(), pending)
            written += len(pending)
            pending = []
    if pending:
        conn.execute(pruned_ranges.insert(), pending)
        written += len(pending)
    return written
