"""Pure: what moving a pipeline's positions costs — the records it re-reads or skips, about how
many bytes, and the stretch of time they cover.

A *move* takes one partition from the next offset it would read (``from_next``) to another
(``to_next``). Behind (``to_next < from_next``) it re-reads ``[to_next, from_next)``; ahead it skips
``[from_next, to_next)``. Only records still in the log count: offsets below the log-start are
gone already (retention took them, not the move) and offsets at or past the log-end do not exist
yet. Bytes are an estimate, the partition's size on the broker spread evenly over its records;
the time span runs from the first record's timestamp to the last one's (producer time or log-append
time, whichever the topic uses), so it is exact for the two ends and says nothing of the gaps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from offset_ledger.rules.model import TopicPartition, Watermarks

Direction = Literal["reread", "skip", "none"]


@dataclass(frozen=True)
class Move:
    """One partition's move, both ends as next offsets (the first offset read after the move is ``to_next``)."""

    tp: TopicPartition
    from_next: int
    to_next: int


@dataclass(frozen=True)
class PartitionCost:
    tp: TopicPartition
    from_next: int
    to_next: int
    direction: Direction
    records: int                   # records in the log between the two ends (0 when nothing moves)
    first_offset: int | None       # the records' offsets: [first_offset, last_offset]
    last_offset: int | None
    approx_bytes: int | None       # None when the broker's log size is unknown
    first_timestamp_ms: int | None  # None when the record could not be read in time
    last_timestamp_ms: int | None

    @property
    def span_ms(self) -> int | None:
        if self.first_timestamp_ms is None or self.last_timestamp_ms is None:
            return None
        return max(0, self.last_timestamp_ms - self.first_timestamp_ms)


@dataclass(frozen=True)
class MoveCost:
    """Per partition and in total; ``complete`` is False when a byte size or a timestamp is unknown."""

    partitions: tuple[PartitionCost, ...]

    def _total(self, direction: Direction, attr: str) -> int | None:
        values = [getattr(p, attr) for p in self.partitions if p.direction == direction]
        return None if any(v is None for v in values) else sum(values)

    @property
    def records_reread(self) -> int:
        return sum(p.records for p in self.partitions if p.direction == "reread")

    @property
    def records_skipped(self) -> int:
        return sum(p.records for p in self.partitions if p.direction == "skip")

    @property
    def bytes_reread(self) -> int | None:
        return self._total("reread", "approx_bytes")

    @property
    def bytes_skipped(self) -> int | None:
        return self._total("skip", "approx_bytes")

    def span(self, direction: Direction) -> tuple[int | None, int | None]:
        """The earliest first and the latest last record time (epoch ms) over the moving partitions."""
        moving = [p for p in self.partitions if p.direction == direction and p.records]
        firsts = [p.first_timestamp_ms for p in moving]
        lasts = [p.last_timestamp_ms for p in moving]
        if not moving or None in firsts or None in lasts:
            return None, None
        return min(f for f in firsts if f is not None), max(v for v in lasts if v is not None)

    @property
    def complete(self) -> bool:
        return all(p.records == 0 or (p.approx_bytes is not None and p.span_ms is not None)
                   for p in self.partitions)


def moved_range(move: Move, marks: Watermarks | None) -> tuple[Direction, int, int]:
    """(direction, first, end): the records in the log the move passes over, ``[first, end)``."""
    if move.to_next == move.from_next:
        return "none", move.from_next, move.from_next
    direction: Direction = "reread" if move.to_next < move.from_next else "skip"
    lo, hi = sorted((move.from_next, move.to_next))
    if marks is not None:
        lo, hi = max(lo, marks.log_start_offset), min(hi, marks.log_end_offset)
    return direction, lo, max(lo, hi)


def wanted_timestamps(moves: Iterable[Move], marks: Mapping[TopicPartition, Watermarks]) -> list[tuple[TopicPartition, int]]:
    """The (partition, offset) whose record timestamps the cost needs: each range's first and last record."""
    wanted: list[tuple[TopicPartition, int]] = []
    for move in moves:
        _direction, first, end = moved_range(move, marks.get(move.tp))
        if end > first:
            wanted += [(move.tp, first), (move.tp, end - 1)]
    return wanted


def move_cost(
    moves: Iterable[Move], marks: Mapping[TopicPartition, Watermarks],
    log_bytes: Mapping[TopicPartition, int] | None = None,
    timestamps: Mapping[tuple[TopicPartition, int], int] | None = None,
) -> MoveCost:
    """The cost of ``moves`` against the log as ``marks`` describe it (sizes and timestamps optional)."""
    sizes = log_bytes or {}
    times = timestamps or {}
    out = []
    for move in sorted(moves, key=lambda m: (m.tp.topic, m.tp.partition)):
        m = marks.get(move.tp)
        direction, first, end = moved_range(move, m)
        records = end - first
        approx: int | None = 0 if records == 0 else None
        if records and m is not None and move.tp in sizes:
            stored = m.log_end_offset - m.log_start_offset
            approx = round(sizes[move.tp] * records / stored) if stored > 0 else 0
        out.append(PartitionCost(
            move.tp, move.from_next, move.to_next, direction, records,
            first if records else None, end - 1 if records else None, approx,
            times.get((move.tp, first)) if records else None,
            times.get((move.tp, end - 1)) if records else None))
    return MoveCost(tuple(out))


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # unreachable


def human_span(ms: int | None) -> str:
    if ms is None:
        return "?"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
