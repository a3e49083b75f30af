"""What the recorder writes, as values: the records a listener event becomes, what a transaction did,
and the pure helpers over a batch's offsets (ends, gaps, position ends, COPY rows) both write paths use.

Offsets follow Spark's convention (``offset_ledger.rules.model``): ``until_offset`` is an exclusive end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any, NamedTuple, Union

from offset_ledger.rules.model import BatchOffsets, Finding, PartitionRange, SourceProgress

_Ends = dict[tuple[int, str, int], int]


@dataclass(frozen=True)
class RunStart:
    """A query run began."""

    pipeline: str
    consumer_group: str
    query_id: str
    run_id: str
    query_name: str | None
    started_at: datetime
    app_version: str | None = None
    checkpoint_location: str | None = None


@dataclass(frozen=True)
class RunHeartbeat:
    """A run is alive (an idle event, or a progress report that moved nothing)."""

    pipeline: str
    consumer_group: str
    query_id: str
    run_id: str
    at: datetime
    max_gap_ms: int | None = None  # the longest silence between the run's events so far, when it grew


@dataclass(frozen=True)
class RunEnd:
    """A run ended; ``exception`` is Spark's text when it failed."""

    pipeline: str
    consumer_group: str
    query_id: str
    run_id: str
    at: datetime
    exception: str | None = None


@dataclass(frozen=True)
class BatchRecord:
    """A committed micro-batch of a pipeline."""

    pipeline: str
    consumer_group: str
    batch: BatchOffsets


Record = Union[RunStart, RunHeartbeat, RunEnd, BatchRecord]


@dataclass(frozen=True)
class RecordOutcome:
    """What one transaction did."""

    batches_written: int = 0
    duplicates: int = 0
    findings: tuple[Finding, ...] = ()
    # Positions this transaction moved (what a Kafka consumer-group mirror follows):
    # (pipeline, consumer group, topic, partition, next offset), in lock order.
    moved: tuple[MovedPosition, ...] = ()


class MovedPosition(NamedTuple):
    """A position a committed batch moved."""

    pipeline: str
    consumer_group: str
    topic: str
    partition: int
    next_offset: int


def utc(value: datetime) -> datetime:
    """Aware UTC (SQLite hands back naive datetimes; everything stored is UTC)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _csv_text(value: str) -> str:
    """One CSV field for COPY: quoted when it must be (an empty string too, or COPY reads NULL)."""
    if value == "" or any(c in value for c in ',"\n\r') or value != value.strip():
        return '"' + value.replace('"', '""') + '"'
    return value


def _csv_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[Any]:
    """Rows for COPY ... (FORMAT csv): None stays an unquoted empty field (NULL), datetimes ISO text."""
    get = itemgetter(*columns)
    data: list[Any] = [get(r) for r in rows] if len(columns) > 1 else [(get(r),) for r in rows]
    moments = [i for i, v in enumerate(data[0]) if isinstance(v, datetime)]
    if not moments:
        return data
    iso: dict[datetime, str] = {}  # a batch's rows share one batch_time: format it once
    out = []
    for row in data:
        row = list(row)
        for i in moments:
            value = row[i]
            if value is not None:
                text = iso.get(value)
                if text is None:
                    text = iso[value] = value.isoformat()
                row[i] = text
        out.append(row)
    return out


#: The batch's event-time and state figures, in this order on both write paths ($18..$23 above).
_STATEFUL_COLUMNS = ("watermark", "event_time_min", "event_time_max", "state_rows_total",
                     "state_rows_updated", "state_rows_dropped_by_watermark")


def _stateful_values(batch: BatchOffsets) -> tuple[Any, ...]:
    """The batch's watermark, min / max event time (UTC) and state row counts; None where not reported."""
    return (*(None if t is None else utc(t)
              for t in (batch.watermark, batch.event_time_min, batch.event_time_max)),
            batch.state_rows_total, batch.state_rows_updated, batch.state_rows_dropped_by_watermark)


def _ends(batch: BatchOffsets) -> _Ends:
    return {(s.source_index, r.topic, r.partition): r.until_offset for s in batch.sources for r in s.ranges}


def _offset_rows(batch: BatchOffsets) -> list[tuple[int, str, int, int | None, int]]:
    return sorted((s.source_index, r.topic, r.partition, r.from_offset, r.until_offset)
                  for s in batch.sources for r in s.ranges)


def _gaps(batch: BatchOffsets, prev_ends: _Ends) -> Iterator[tuple[SourceProgress, PartitionRange, int, int]]:
    """(source, range, from_offset, previous end) of each range not starting where the previous batch ended."""
    for s in batch.sources:
        for r in s.ranges:
            expected = prev_ends.get((s.source_index, r.topic, r.partition))
            if r.from_offset is not None and expected is not None and expected != r.from_offset:
                yield s, r, r.from_offset, expected


def _position_starts(batch: BatchOffsets) -> dict[tuple[str, int], int]:
    """(topic, partition) -> where the batch started reading it (the lower start of a self-union)."""
    out: dict[tuple[str, int], int] = {}
    for s in batch.sources:
        for r in s.ranges:
            if r.from_offset is not None:
                key = (r.topic, r.partition)
                out[key] = min(out.get(key, r.from_offset), r.from_offset)
    return out


def _position_ends(batch: BatchOffsets) -> list[tuple[str, int, int]]:
    """(topic, partition, until_offset) per partition the batch read, in lock order (sorted)."""
    if len(batch.sources) == 1:
        return sorted((r.topic, r.partition, r.until_offset) for r in batch.sources[0].ranges)
    # Two sources on one topic (a self-union) share the partition's position, and a restart hands
    # both the same startingOffsets: the lower end is the one from which neither skips a record.
    merged: dict[tuple[str, int], int] = {}
    for s in batch.sources:
        for r in s.ranges:
            key = (r.topic, r.partition)
            merged[key] = min(merged.get(key, r.until_offset), r.until_offset)
    return sorted((t, p, u) for (t, p), u in merged.items())


@dataclass
class _Pos:
    next_offset: int
    updated_at: datetime
    reset_id: int | None
    query_id: str | None
    batch_id: int | None
    reset_pending: bool = False


@dataclass(frozen=True)
class _Run:
    """What the position rules need of a run: when it started and which generation it is on."""

    started_at: datetime
    generation_id: int | None


@dataclass
class _Txn:
    """State of one transaction, folded into the recorder's caches only after COMMIT."""

    now: datetime
    findings: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[str, tuple[int, _Ends]] = field(default_factory=dict)
    runs: dict[str, _Run] = field(default_factory=dict)
    foreign_reported: set[tuple[str, int]] = field(default_factory=set)
    moved: list[MovedPosition] = field(default_factory=list)
    #: batches another run recorded first: not history again, but heard by the position rules
    other_runs: list[BatchRecord] = field(default_factory=list)
