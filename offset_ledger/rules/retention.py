"""Pure: how long until retention may delete records a pipeline has not read (its *headroom*).

The danger is the distance between the pipeline's position (the next offset to read) and the
partition's log-start, and how fast retention moves the log-start. Kafka deletes whole segments,
never single records, and only at its retention check (``log.retention.check.interval.ms``):

- **by time** (``retention.ms``): a segment goes once its *newest* record is older than
  ``retention.ms``. The record at the position is in the segment the position's records are in, so
  that segment cannot go before ``timestamp(record at position) + retention.ms``: the classic bound.
  It is a lower bound (the safe side): the segment's newer records, up to ``segment.ms`` /
  ``segment.bytes`` later, keep it longer, and the broker deletes at its next check after that.
- **by size** (``retention.bytes``, per partition): the oldest segment goes while the rest of the log
  still holds ``retention.bytes``. The segment holding the position cannot go before the bytes *after
  the position* (the unread bytes) reach ``retention.bytes``. How fast they grow is an estimate: an
  observed append rate when one is given, else the average rate over the unread span (records since
  the position over the age of the record at the position); bytes per record is the partition's size
  over its retained records.

The headroom is the smaller of the two bounds (``basis`` says which); past it the broker *may*
delete the position's segment at its next check (status WARN with headroom 0: due, not yet gone).
A position below the log-start has already lost records (ERR, headroom 0). Nothing unread (position
at log-end), unlimited retention (``-1`` and ``-1``) and compacted topics (``cleanup.policy=compact``
alone deletes nothing by age or size; compaction may still drop superseded values of a key) have no
headroom figure. Also outside this estimate: DeleteRecords (an operator moving the log-start), a
retention setting changed later, and clock skew between this host and the broker (record timestamps
are compared with this host's clock, the broker compares them with its own).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

HeadroomStatus = Literal["OK", "WARN", "ERR"]
Basis = Literal["lost", "caught-up", "beyond-log-end", "compacted", "unlimited", "time", "size", "unknown"]
_SEVERITY = {"OK": 0, "WARN": 1, "ERR": 2}


@dataclass(frozen=True)
class RetentionSettings:
    """A topic's retention settings as the broker reports them (``-1``: unlimited; None: not reported)."""

    cleanup_policy: str = "delete"
    retention_ms: int | None = None
    retention_bytes: int | None = None
    segment_bytes: int | None = None
    segment_ms: int | None = None

    @property
    def deletes(self) -> bool:
        """Whether retention deletes anything (``delete`` or ``compact,delete``)."""
        return "delete" in {p.strip().lower() for p in self.cleanup_policy.split(",")}

    @property
    def time_limited(self) -> bool:
        return self.deletes and self.retention_ms is not None and self.retention_ms >= 0

    @property
    def size_limited(self) -> bool:
        return self.deletes and self.retention_bytes is not None and self.retention_bytes >= 0


@dataclass(frozen=True)
class PartitionRetention:
    """What the rule looks at for one partition (offsets as everywhere: the position is the next to read)."""

    position: int | None
    log_start: int | None
    log_end: int | None
    settings: RetentionSettings | None
    now_ms: int
    position_timestamp_ms: int | None = None  # timestamp of the record at the position (Kafka's)
    partition_bytes: int | None = None        # the partition's size on the broker (for retention.bytes)
    append_rate: float | None = None          # records per second appended, when observed


@dataclass(frozen=True)
class Headroom:
    """Seconds until retention may delete the position's segment, and what that means."""

    seconds: float | None   # None: no figure (see basis); 0: due now or records already lost
    status: HeadroomStatus | None  # None: unknown or not applicable (compacted)
    basis: Basis
    lost_records: int = 0   # records below the log-start the pipeline never read


def headroom(x: PartitionRetention, warn_seconds: float) -> Headroom:
    """The headroom of one partition (module docstring: the estimate); WARN below ``warn_seconds``."""
    if x.position is None or x.log_start is None or x.log_end is None:
        return Headroom(None, None, "unknown")
    if x.position < x.log_start:
        return Headroom(0.0, "ERR", "lost", x.log_start - x.position)
    if x.position > x.log_end:
        # A re-created or truncated topic: not a retention question (the restart's on_data_loss is).
        return Headroom(None, None, "beyond-log-end")
    if x.position == x.log_end:
        return Headroom(None, "OK", "caught-up")
    s = x.settings
    if s is None:
        return Headroom(None, None, "unknown")
    if not s.deletes:
        return Headroom(None, None, "compacted")
    if not s.time_limited and not s.size_limited:
        return Headroom(None, "OK", "unlimited")
    bounds: list[tuple[float, Basis]] = []
    age = None if x.position_timestamp_ms is None else max(0.0, (x.now_ms - x.position_timestamp_ms) / 1000)
    if s.time_limited and x.position_timestamp_ms is not None:
        assert s.retention_ms is not None
        bounds.append((max(0.0, (x.position_timestamp_ms + s.retention_ms - x.now_ms) / 1000), "time"))
    if s.size_limited:
        by_size = _size_bound(x, age)
        if by_size is not None:
            bounds.append((by_size, "size"))
    if not bounds:
        return Headroom(None, None, "unknown")
    seconds, basis = min(bounds)
    if seconds == float("inf"):  # only a size bound, and nothing is appended
        return Headroom(None, "OK", basis)
    return Headroom(seconds, "WARN" if seconds < warn_seconds else "OK", basis)


def _size_bound(x: PartitionRetention, age: float | None) -> float | None:
    """Seconds until the unread bytes reach ``retention.bytes`` at the append rate; None when unknown."""
    assert x.settings is not None and x.settings.retention_bytes is not None
    assert x.position is not None and x.log_start is not None and x.log_end is not None
    retained = x.log_end - x.log_start
    if not x.partition_bytes or retained <= 0:
        return None
    per_record = x.partition_bytes / retained
    unread = x.log_end - x.position
    room = x.settings.retention_bytes - unread * per_record
    if room <= 0:
        return 0.0
    rate = x.append_rate
    if rate is None and age is not None and age > 0:
        rate = unread / age  # the average over the unread span
    if rate is None:
        return None
    if rate <= 0:
        return float("inf")  # nothing appended: size never reaches the limit
    return room / (rate * per_record)


def worst(headrooms: Iterable[Headroom]) -> Headroom | None:
    """The pipeline's headroom: its most severe partition, and among equals the least seconds."""
    best: Headroom | None = None
    for h in headrooms:
        if h.status is None:
            continue
        if best is None or _rank(h) < _rank(best):
            best = h
    return best


def _rank(h: Headroom) -> tuple[int, float]:
    assert h.status is not None
    return (-_SEVERITY[h.status], float("inf") if h.seconds is None else h.seconds)


def human_duration(seconds: float | None) -> str:
    """``2d3h``, ``1h05m``, ``4m10s``, ``12s``; ``-`` for None (no figure), ``inf`` for infinity."""
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "inf"
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"
