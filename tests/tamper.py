"""The one place tests change recorded ranges by hand, as a bug or an operator editing the ledger would.

Verify's tests need a gap or an overlap that no batch, reset or finding explains; making one means
writing the ledger behind the recorder's back. Keeping every such write here means a change to how
ranges are stored (a compact per-batch layout, say) is one edit, not one per test.
"""

from __future__ import annotations

from sqlalchemy import and_, select, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.tables import batch_offsets


def shift_recorded_start(engine: Engine, *, partition: int, by: int, batch_id: int,
                         query_id: str | None = None, topic: str | None = None) -> int:
    """Move the recorded start (inclusive from-offset) of one partition's range of one batch by ``by``.

    A positive ``by`` opens a gap of ``by`` records before the range, a negative one makes it
    re-read ``-by`` records of the range before it. ``query_id``/``topic`` narrow the batch when
    several queries or topics share the id. Returns the range's new start; exactly one range must
    match, so a test cannot silently tamper with nothing (or with more than it meant).
    """
    where = [batch_offsets.c.batch_id == batch_id, batch_offsets.c.partition == partition]
    if query_id is not None:
        where.append(batch_offsets.c.query_id == query_id)
    if topic is not None:
        where.append(batch_offsets.c.topic == topic)
    with engine.begin() as conn:
        starts = conn.execute(select(batch_offsets.c.from_offset).where(and_(*where))).scalars().all()
        if len(starts) != 1 or starts[0] is None:
            raise AssertionError(f"expected one recorded range with a known start to shift, found {starts}")
        conn.execute(update(batch_offsets).where(and_(*where)).values(from_offset=batch_offsets.c.from_offset + by))
    return int(starts[0]) + by
