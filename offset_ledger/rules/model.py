"""Frozen value types shared by the pure core and the adapters.

Offset convention: every ``*_next_offset`` / ``until_offset`` is an *exclusive end*, the next
offset to read, exactly Spark's ``endOffset`` and what ``startingOffsets`` takes. ``from_offset``
is the first offset a batch read (inclusive), which is the previous batch's ``until_offset``.
``EARLIEST`` (-2) and ``LATEST`` (-1) are Spark's sentinels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

EARLIEST = -2
LATEST = -1

OnDataLoss = Literal["fail", "earliest"]
FindingKind = Literal[
    "gap",                # a batch's from_offset differs from the previous batch's until_offset
    "regression",         # a batch ended behind the current position with no reset in between
    "pending_reset",      # a run older than a pending reset reported a batch; the reset's position kept
    "new_partition",      # restart: partition not in the ledger, read from earliest
    "removed_partition",  # restart: partition in the ledger but gone from Kafka
    "data_loss",          # restart: ledger offset below log-start (retention) or above log-end
    "reset_consumed",     # restart: a pending reset was applied through a fresh checkpoint
    "first_run",          # restart: no ledger entries, first_run policy applied
    "foreign_run",        # a run not on the current checkpoint generation reported batches; positions kept
    "shared_position",    # two active queries recorded the same partition of one pipeline; position kept
    "mirror_refused",     # the Kafka consumer group has active members: positions not mirrored into it
    "mirror_pending",     # the Kafka consumer group could not be reached yet: the mirror retries
    "state_rewind",       # restart: a windowed pipeline re-reads from before its open windows (event-time floor)
    "checkpoint_adopted", # a Spark checkpoint's last committed batch was imported as the positions
    "failover",           # the pipeline moved to a MirrorMaker 2 backup cluster (the translation gap)
    "other",
]


@dataclass(frozen=True, order=True)
class TopicPartition:
    """One partition of one topic."""

    topic: str
    partition: int


@dataclass(frozen=True)
class PartitionRange:
    """What one batch read from one partition: ``[from_offset, until_offset)``."""

    topic: str
    partition: int
    from_offset: int | None  # None: Spark reports no start on a fresh checkpoint's first batch
    until_offset: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class SourceProgress:
    """One Kafka source of one batch (a query may read several)."""

    source_index: int
    description: str
    ranges: tuple[PartitionRange, ...]
    input_rows: int
    #: False when Spark's report carried no ``numInputRows`` for the source (then ``input_rows`` is 0 and
    #: means nothing): an unknown count, never a count of 0 (``rules.read_shortfall``).
    rows_reported: bool = True


@dataclass(frozen=True)
class BatchOffsets:
    """A committed micro-batch with the Kafka offsets of each of its Kafka sources."""

    query_id: str
    run_id: str
    query_name: str | None
    batch_id: int
    batch_time: datetime
    input_rows: int
    sources: tuple[SourceProgress, ...]
    duration_ms: int | None = None  # Spark's durationMs.triggerExecution
    #: Spark's ``eventTime`` of the batch (only when the query defines a watermark): the watermark in
    #: effect for this batch and the earliest / latest event time it saw; aware UTC datetimes.
    watermark: datetime | None = None
    event_time_min: datetime | None = None
    event_time_max: datetime | None = None
    #: Spark's ``stateOperators`` figures summed over the query's stateful operators (None: no state).
    state_rows_total: int | None = None
    state_rows_updated: int | None = None
    state_rows_dropped_by_watermark: int | None = None
    #: Who recorded the batch: None for the listener, ``"checkpoint"`` when it was read back from
    #: Spark's commit log (reconciliation on restart, ``offset-ledger watch``).
    recorded_by: str | None = None
    #: How many of the progress report's sources are not Kafka sources (``rate``, a file source, ...):
    #: their rows are in ``input_rows`` too, so that total is no Kafka source's count while any is.
    non_kafka_sources: int = 0


@dataclass(frozen=True)
class Watermarks:
    """A partition's log-start offset (first offset still stored) and log-end offset (next to be written)."""

    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True)
class Position:
    """Where a pipeline stands on one partition: the next offset it will read."""

    topic: str
    partition: int
    next_offset: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True)
class Finding:
    """Something noteworthy found while recording or restarting."""

    kind: FindingKind
    message: str
    topic: str | None = None
    partition: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


StartingOffsets = dict[str, dict[str, int]]


def starting_offsets_json(offsets: Mapping[str, Mapping[str, int]]) -> str:
    """Render ``{"topic": {"0": 12}}`` as Spark's ``startingOffsets`` string, partitions sorted numerically."""
    ordered = {
        topic: {p: offsets[topic][p] for p in sorted(offsets[topic], key=int)}
        for topic in sorted(offsets)
    }
    return json.dumps(ordered, separators=(",", ":"))
