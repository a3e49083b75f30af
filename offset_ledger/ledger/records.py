"""What the recorder writes, as values: the records a listener event becomes, what a transaction did,
and the pure helpers over a batch's offsets (ends, gaps, position ends, COPY rows) both write paths use.

Offsets follow Spark's convention (``offset_ledger.rules.model``): ``until_offset`` is an exclusive end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from operator import itemgetter
from typing import Any, NamedTuple, Union

from offset_ledger.rules.model import BatchOffsets, Finding, PartitionRange, SourceProgress

Ends = dict[tuple[int, str, int], int]


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
    #: The driver heartbeat's period (``capture.heartbeat``): the run is judged on its beat from its
    #: start. None: the recording process keeps no heartbeat (a sink, the watcher, a test).
    beat_every_ms: int | None = None


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


def csv_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[Any]:
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
STATEFUL_COLUMNS = ("watermark", "event_time_min", "event_time_max", "state_rows_total",
                     "state_rows_updated", "state_rows_dropped_by_watermark")


def stateful_values(batch: BatchOffsets) -> tuple[Any, ...]:
    """The batch's watermark, min / max event time (UTC) and state row counts; None where not reported."""
    return (*(None if t is None else utc(t)
              for t in (batch.watermark, batch.event_time_min, batch.event_time_max)),
            batch.state_rows_total, batch.state_rows_updated, batch.state_rows_dropped_by_watermark)


def batch_ends(batch: BatchOffsets) -> Ends:
    return {(s.source_index, r.topic, r.partition): r.until_offset for s in batch.sources for r in s.ranges}


def offset_rows(batch: BatchOffsets) -> list[tuple[int, str, int, int | None, int]]:
    return sorted((s.source_index, r.topic, r.partition, r.from_offset, r.until_offset)
                  for s in batch.sources for r in s.ranges)


def gaps(batch: BatchOffsets, prev_ends: Ends) -> Iterator[tuple[SourceProgress, PartitionRange, int, int]]:
    """(source, range, from_offset, previous end) of each range not starting where the previous batch ended."""
    for s in batch.sources:
        for r in s.ranges:
            expected = prev_ends.get((s.source_index, r.topic, r.partition))
            if r.from_offset is not None and expected is not None and expected != r.from_offset:
                yield s, r, r.from_offset, expected


def position_starts(batch: BatchOffsets) -> dict[tuple[str, int], int]:
    """(topic, partition) -> where the batch started reading it (the lower start of a self-union)."""
    out: dict[tuple[str, int], int] = {}
    for s in batch.sources:
        for r in s.ranges:
            if r.from_offset is not None:
                key = (r.topic, r.partition)
                out[key] = min(out.get(key, r.from_offset), r.from_offset)
    return out


def position_ends(batch: BatchOffsets) -> list[tuple[str, int, int]]:
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
class HeldPosition:
    """A position row as the general path read it under the pipeline lock (moved in place as batches apply)."""

    next_offset: int
    updated_at: datetime
    reset_id: int | None
    query_id: str | None
    batch_id: int | None
    reset_pending: bool = False


@dataclass(frozen=True)
class RunFacts:
    """What the position rules need of a run: when it started and which generation it is on."""

    started_at: datetime
    generation_id: int | None


@dataclass
class Transaction:
    """State of one transaction, folded into the recorder's caches only after COMMIT."""

    now: datetime
    findings: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[str, tuple[int, Ends]] = field(default_factory=dict)
    runs: dict[str, RunFacts] = field(default_factory=dict)
    foreign_reported: set[tuple[str, int]] = field(default_factory=set)
    moved: list[MovedPosition] = field(default_factory=list)
    #: batches another run recorded first: not history again, but heard by the position rules
    other_runs: list[BatchRecord] = field(default_factory=list)


@dataclass
class Known:
    """What the recorder learned from transactions it committed: saves a SELECT per transaction on the hot path.

    A ``Transaction`` collects what it learns; ``fold`` adds it here only after COMMIT, so a
    rolled-back transaction leaves nothing behind. A transaction the caller commits (a sink's) uses
    a fresh ``Known`` and never folds.
    """

    latest: dict[str, tuple[int, Ends]] = field(default_factory=dict)
    runs: dict[str, RunFacts] = field(default_factory=dict)
    foreign_reported: set[tuple[str, int]] = field(default_factory=set)
    #: generation id -> its resolved starting offsets, to give a fresh run's first batch its start
    generation_offsets: dict[int, dict[tuple[str, int], int]] = field(default_factory=dict)
    #: Runs a committed batch of which was recorded here: a run's first batch that read no row at all
    #: is the replay of a batch the job's own idempotence skipped (a transactional sink's "already
    #: committed"), not a read shortfall.
    runs_batched: set[str] = field(default_factory=set)

    def run(self, run_id: str, txn: Transaction) -> RunFacts:
        """The run's start and generation, as this transaction or an earlier one learned it."""
        return txn.runs.get(run_id) or self.runs[run_id]

    def fold(self, txn: Transaction, records: Sequence[Record]) -> None:
        """Keep what the committed ``txn`` learned."""
        self.latest.update(txn.latest)
        self.runs.update(txn.runs)
        self.foreign_reported |= txn.foreign_reported
        self.runs_batched.update(r.batch.run_id for r in records if isinstance(r, BatchRecord))


def finding_row(rec: BatchRecord, txn: Transaction, kind: str, message: str, topic: str | None,
                partition: int | None, expected: int | None, actual: int | None,
                details: dict[str, Any]) -> dict[str, Any]:
    """A ``findings`` row about batch ``rec``, stamped with the transaction's time."""
    return {"pipeline": rec.pipeline, "consumer_group": rec.consumer_group, "kind": kind,
            "topic": topic, "partition": partition, "query_id": rec.batch.query_id,
            "batch_id": rec.batch.batch_id, "expected_offset": expected, "actual_offset": actual,
            "message": message, "details": details, "created_at": txn.now, "run_id": rec.batch.run_id,
            "generation_id": None}


def pg_int_array(values: Sequence[int | None]) -> str:
    """A PostgreSQL array literal of integers (None as NULL), sent as one text parameter."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def pg_text_array(values: Sequence[str]) -> str:
    """A PostgreSQL array literal of strings: every element double-quoted, backslash and quote escaped."""
    quoted: dict[str, str] = {}
    out = []
    for v in values:
        q = quoted.get(v)
        if q is None:
            q = quoted[v] = '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        out.append(q)
    return "{" + ",".join(out) + "}"


def pg_time_array(values: Sequence[datetime | None]) -> str:
    """A PostgreSQL array literal of timestamps (ISO 8601, UTC; None as NULL)."""
    return "{" + ",".join("NULL" if v is None else '"' + utc(v).isoformat() + '"' for v in values) + "}"
