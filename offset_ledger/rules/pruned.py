"""What prune deletes, as islands: the record that lets verify tell pruned history from lost history.

Within one query, Spark reads each partition contiguously: batch N+1 starts where batch N ended.
Prune deletes old ``batch_offsets`` rows; afterwards a stretch between two kept batches looks
exactly like one the listener never recorded. So before deleting, prune keeps the *islands* of the
rows it deletes: per (pipeline, group, query, topic, partition), consecutive ranges whose offsets
tile (``from_offset`` of one == ``until_offset`` of the one before). Verify explains a gap only
where an island covers it. A hole *among* the deleted ranges (a batch never recorded, a skip) ends
one island and starts the next, so it stays an unexplained gap after the prune as it was before.

Offsets: ``from_offset`` inclusive, ``until_offset`` exclusive (next offset to read), as in
``batch_offsets``. A range whose start Spark did not report (``from_offset`` None) is taken to
continue the island, the recorder's and verify's rule too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple


class DeletedRange(NamedTuple):
    """One ``batch_offsets`` row prune is about to delete."""

    pipeline: str
    consumer_group: str
    query_id: str
    topic: str
    partition: int
    batch_id: int
    from_offset: int | None
    until_offset: int
    batch_time: datetime


@dataclass
class Island:
    """Deleted ranges of one query on one partition that tile ``[from_offset, until_offset)``."""

    pipeline: str
    consumer_group: str
    query_id: str
    topic: str
    partition: int
    from_batch_id: int
    until_batch_id: int  # inclusive
    from_offset: int
    until_offset: int
    batches: int
    first_batch_time: datetime  # the island's first batch: which generation (incarnation) it belongs to


def _key(r: DeletedRange) -> tuple[str, str, str, str, int]:
    return (r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition)


def islands(rows: Iterable[DeletedRange]) -> Iterator[Island]:
    """Islands of ``rows`` ordered by (pipeline, group, query, topic, partition, batch id).

    Raises ValueError on rows out of that order (an island would then swallow a hole).
    """
    cur: Island | None = None
    key: tuple[str, str, str, str, int] | None = None
    last_batch = -1
    for r in rows:
        k = _key(r)
        if key is not None and (k < key or (k == key and r.batch_id <= last_batch)):
            raise ValueError(f"deleted ranges out of order: {k} batch {r.batch_id} after {key} batch {last_batch}")
        start = r.from_offset
        if cur is not None and k == key and (start is None or start == cur.until_offset) \
                and r.until_offset >= cur.until_offset:
            cur.until_offset = r.until_offset
            cur.until_batch_id = r.batch_id
            cur.batches += 1
        else:
            if cur is not None:
                yield cur
            first = start if start is not None else r.until_offset
            cur = Island(r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id, r.batch_id,
                         first, r.until_offset, 1, r.batch_time)
        key, last_batch = k, r.batch_id
    if cur is not None:
        yield cur
