"""What prune deletes, as islands: the record that lets verify tell pruned history from lost history.

Within one query, Spark reads each partition contiguously: batch N+1 starts where batch N ended.
Prune deletes old ``batch_offsets`` rows; afterwards a stretch between two kept batches looks
exactly like one the listener never recorded. So before deleting, prune keeps the *islands* of the
rows it deletes: per (pipeline, group, query, topic, partition), consecutive ranges whose offsets
tile (``from_offset`` of one == ``until_offset`` of the one before). Verify explains a gap only
where an island covers it. A hole *among* the deleted ranges (a batch never recorded, a skip) ends
one island and starts the next, so it stays an unexplained gap after the prune as it was before.

An island is the reads themselves, not an excuse for a gap: verify sweeps it as history (each offset
of it read once), so a stretch read twice, a hole before the first kept range and a query's start
read nowhere else give the same answer after the prune as before it.

Offsets: ``from_offset`` inclusive, ``until_offset`` exclusive (next offset to read), as in
``batch_offsets``. A range whose start Spark did not report (``from_offset`` None) starts an island
of its own with an unknown start and keeps its end (``first_until_offset``): verify then resolves it
exactly as it resolved the row (where it cannot be known, it stays unknown, never "continues").
Two sources of one batch reading the same partition are two reads (verify counts both): the second
starts an island of its own. An island is read by one run (a new run starts a new island), so a
finding that flags a run (a zombie, a foreign checkpoint) still accounts for its pruned reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from offset_ledger.rules.verify import RangeRow


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
    source_index: int = 0
    run_id: str | None = None  # the run that read it (``batches.run_id``)


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
    from_offset: int | None  # None: the first batch's start was not reported
    until_offset: int
    batches: int
    first_batch_time: datetime  # the island's first batch: which generation (incarnation) it belongs to
    first_until_offset: int = 0  # where the island's first batch ended (exclusive)
    last_batch_time: datetime | None = None
    run_id: str | None = None  # one run reads an island: a finding that flags the run covers its reads


def _key(r: DeletedRange) -> tuple[str, str, str, str, int]:
    return (r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition)


def islands(rows: Iterable[DeletedRange]) -> Iterator[Island]:
    """Islands of ``rows`` ordered by (pipeline, group, query, topic, partition, batch id, source index).

    Raises ValueError on rows out of that order (an island would then swallow a hole).
    """
    cur: Island | None = None
    key: tuple[str, str, str, str, int] | None = None
    last: tuple[int, int] = (-1, -1)
    for r in rows:
        k = _key(r)
        at = (r.batch_id, r.source_index)
        if key is not None and (k < key or (k == key and at <= last)):
            raise ValueError(f"deleted ranges out of order: {k} batch {r.batch_id} after {key} batch {last[0]}")
        start = r.from_offset
        if cur is not None and k == key and start is not None and start == cur.until_offset \
                and r.until_offset >= cur.until_offset and r.run_id == cur.run_id:
            cur.until_offset = r.until_offset
            cur.until_batch_id = r.batch_id
            cur.batches += 1
            cur.last_batch_time = r.batch_time
        else:
            if cur is not None:
                yield cur
            cur = Island(r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id, r.batch_id,
                         start, r.until_offset, 1, r.batch_time, r.until_offset, r.batch_time, r.run_id)
        key, last = k, at
    if cur is not None:
        yield cur


def island_reads(topic: str, partition: int, query_id: str, from_batch_id: int, until_batch_id: int,
                 from_offset: int | None, first_until_offset: int | None, until_offset: int) -> list[RangeRow]:
    """The reads an island stands for, as the range rows verify sweeps (``rules.verify.RangeRow``).

    Its ranges tiled, so one row ``[from, until)`` counts each offset once, as its batches did. An
    unknown start is given back as its first batch's own row ``[?, first_until)`` (the batch id it
    had), so verify resolves it as it resolved that row; the rest follows from ``first_until``.
    The last batch names the island where a stretch borders it.
    """
    if from_offset is not None or first_until_offset is None:
        start = from_offset if from_offset is not None else until_offset
        return [RangeRow(topic, partition, start, until_offset, query_id, until_batch_id)]
    rows = [RangeRow(topic, partition, None, first_until_offset, query_id, from_batch_id)]
    if until_offset > first_until_offset:
        rows.append(RangeRow(topic, partition, first_until_offset, until_offset, query_id, until_batch_id))
    return rows
