"""Pure: where a windowed (append-mode) pipeline must restart so no window is lost or counted twice.

The rule. After the last committed batch the watermark is W. In append mode every window whose end
is <= W has been emitted; windows ending after W live only in the checkpoint's state, which an
upgrade throws away. Windows are ``[k*S, k*S + L)`` (epoch-aligned, slide S = L when tumbling); the
earliest window ending after W starts at ``T* = (floor((W - L) / S) + 1) * S``. A restarted
pipeline must read again every record with event time >= T* and drop every record (and, with
sliding windows, every window) that starts before T*, or it rebuilds already emitted windows.

Which W. Spark reports with batch N the watermark *in effect for* batch N; after it the watermark
moves to max(that, max event time seen - delay), which is what the next batch (a no-data batch
that emits the closed windows, or the next data batch) uses. So
``W = max(watermark(last), max(event_time_max over the checkpoint's batches) - delay)``. The delay
is the caller's ``withWatermark`` argument; without it it is read back from a batch whose
watermark moved: ``delay = max(event_time_max of the batches before it) - its watermark``.

Where to restart. Any record with event time >= T* was read in a batch whose ``event_time_max``
is >= T*: so from the start offsets of the earliest such batch every one of them is read again,
whatever column carries the event time. Partitions that batch did not read take their start from
the first later batch that read them; partitions no batch read keep their position.

No I/O here: ``offset_ledger.operate.restart`` feeds the batches read from the ledger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from offset_ledger.errors import InvalidDuration, InvalidRestartOptions, StatefulRestartRefused
from offset_ledger.rules.durations import parse_duration_ms as _parse_ms
from offset_ledger.rules.model import EARLIEST, Finding, TopicPartition

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_duration_ms(text: str | int | timedelta, *, option: str = "window") -> int:
    """A window, slide or watermark delay in milliseconds (> 0), in the one duration grammar
    (``offset_ledger.rules.durations``: ``10 seconds``, ``10m``, ``PT10M``, ``interval 1 minute``);
    an int is milliseconds. A bad one is InvalidRestartOptions naming ``option``."""
    try:
        return _parse_ms(text, option)
    except InvalidDuration as exc:
        raise InvalidRestartOptions(exc.message, option=option, value=str(text)[:60]) from None


@dataclass(frozen=True)
class WindowSpec:
    """A windowed pipeline's stateful options: epoch-aligned windows ``length_ms`` long, one every
    ``slide_ms`` (tumbling: equal), the ``withWatermark`` delay (None: read back from the recorded
    watermarks) and whether the event time is the Kafka record timestamp (a tighter rewind)."""

    length_ms: int
    slide_ms: int
    delay_ms: int | None = None
    kafka_timestamp: bool = False

    @classmethod
    def parse(cls, window: str | int | timedelta, slide: str | int | timedelta | None = None,
              watermark_delay: str | int | timedelta | None = None,
              event_time_is_kafka_timestamp: bool = False) -> WindowSpec:
        length = parse_duration_ms(window, option="window")
        step = length if slide is None else parse_duration_ms(slide, option="slide")
        if step > length:
            # Spark refuses it too: records between windows would belong to none.
            raise InvalidRestartOptions(f"slide ({slide}) must not be longer than the window ({window})",
                                        option="slide")
        delay = None if watermark_delay is None else parse_duration_ms(watermark_delay, option="watermark_delay")
        return cls(length, step, delay, bool(event_time_is_kafka_timestamp))

    @property
    def tumbling(self) -> bool:
        return self.length_ms == self.slide_ms

    def earliest_open_start_ms(self, watermark_ms: int) -> int:
        """T*: the start of the earliest window whose end is after ``watermark_ms`` (not yet emitted)."""
        return ((watermark_ms - self.length_ms) // self.slide_ms + 1) * self.slide_ms


@dataclass(frozen=True)
class BatchFigures:
    """What the rule needs of one recorded batch of the checkpoint (one query id)."""

    batch_id: int
    watermark: datetime | None
    event_time_max: datetime | None
    #: (topic, partition) -> (from_offset, until_offset); from None: Spark reported no start
    ranges: Mapping[TopicPartition, tuple[int | None, int]] = field(default_factory=dict)

    @property
    def event_time_known(self) -> bool:
        """Spark reported the batch's eventTime (a batch read back from a checkpoint has none)."""
        return self.watermark is not None or self.event_time_max is not None

    @property
    def read_records(self) -> bool:
        return any(since is None or until > since for since, until in self.ranges.values())


@dataclass(frozen=True)
class StateRewind:
    """The outcome: the event-time floor T*, the rewound offsets and what they cost."""

    watermark: datetime
    event_time_floor: datetime
    delay_ms: int
    delay_derived: bool
    window: WindowSpec
    offsets: Mapping[TopicPartition, int]
    first_batch_id: int | None        # None: no recorded batch saw event time >= T*; nothing to re-read
    last_batch_id: int
    batches_reread: int
    records_reread: int

    def finding(self, query_id: str | None = None) -> Finding:
        shape = (f"tumbling windows of {_human(self.window.length_ms)}" if self.window.tumbling else
                 f"sliding windows of {_human(self.window.length_ms)} every {_human(self.window.slide_ms)}")
        how = "derived from the recorded watermarks" if self.delay_derived else "as given"
        floor = self.event_time_floor.isoformat()
        if self.first_batch_id is None:
            reread = "no recorded batch saw an event that late, so nothing is read again"
        else:
            reread = (f"re-reading from the start of batch {self.first_batch_id}: {self.batches_reread} batch(es), "
                      f"{self.records_reread} record(s)")
        message = (f"stateful restart of {shape}: the watermark after batch {self.last_batch_id} is "
                   f"{self.watermark.isoformat()} (delay {_human(self.delay_ms)}, {how}); windows ending by then "
                   f"were emitted, the earliest open one starts at {floor}; {reread}; drop records with event time "
                   f"before {floor} (plan.event_time_floor) so emitted windows are not built again")
        return Finding("state_rewind", message, details={
            "watermark": self.watermark.isoformat(), "event_time_floor": floor,
            "watermark_delay_ms": self.delay_ms, "delay_derived": self.delay_derived,
            "window_ms": self.window.length_ms, "slide_ms": self.window.slide_ms,
            "query_id": query_id, "last_batch_id": self.last_batch_id, "first_batch_id": self.first_batch_id,
            "batches_reread": self.batches_reread, "records_reread": self.records_reread,
            "offsets": {f"{tp.topic}:{tp.partition}": o for tp, o in sorted(self.offsets.items())}})


def _human(ms: int) -> str:
    for unit, size in (("hours", 3_600_000), ("minutes", 60_000), ("seconds", 1_000)):
        if ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} milliseconds"


def to_ms(value: datetime) -> int:
    aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return (aware - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def derive_delay_ms(batches: Sequence[BatchFigures]) -> int | None:
    """The watermark delay read back from the latest batch whose watermark moved, or None."""
    ordered = sorted(batches, key=lambda b: b.batch_id)
    found: int | None = None
    seen_max: int | None = None
    previous_wm: int | None = None
    for b in ordered:
        wm = None if b.watermark is None else to_ms(b.watermark)
        if wm is not None and seen_max is not None and previous_wm is not None and wm > previous_wm:
            found = seen_max - wm
        if wm is not None:
            previous_wm = wm
        if b.event_time_max is not None:
            m = to_ms(b.event_time_max)
            seen_max = m if seen_max is None else max(seen_max, m)
    return found if found is not None and found >= 0 else None


def next_watermark_ms(batches: Sequence[BatchFigures], delay_ms: int) -> int:
    """The watermark the batch after the last recorded one uses (see the module text)."""
    marks = [to_ms(b.watermark) for b in batches if b.watermark is not None]
    maxes = [to_ms(b.event_time_max) for b in batches if b.event_time_max is not None]
    last = max(batches, key=lambda b: b.batch_id)
    current = to_ms(last.watermark) if last.watermark is not None else max(marks, default=0)
    return max(current, max(maxes) - delay_ms) if maxes else current


def plan_rewind(
    batches: Sequence[BatchFigures],
    positions: Mapping[TopicPartition, int],
    window: WindowSpec,
    *,
    delay_ms: int | None,
    offsets_for_floor: Mapping[TopicPartition, int | None] | None = None,
    pipeline: str = "",
    floor_at_least: datetime | None = None,
) -> StateRewind | None:
    """The rewind for the checkpoint whose ``batches`` are given; None when none carries a watermark.

    ``positions`` are the pipeline's current positions (next offset per partition). With
    ``offsets_for_floor`` (the event time is the Kafka record timestamp: the first offset at or after
    T* per partition, None when no record is that new) the rewind uses those instead of batch starts.
    ``floor_at_least``: a floor an earlier stateful restart already applied (stored with its
    generation); the floor never goes below it, whatever the batches since say.

    Refused (StatefulRestartRefused) when the batches cannot prove where the rewind must start: a
    batch id missing between the batches it depends on, or no batch below the floor before the first
    one it re-reads while the recorded history does not begin at the query's batch 0 (pruned, or
    recorded late). A batch whose event time is unknown (read back from a checkpoint) is assumed to
    hold records at or after the floor: reading more is safe under the floor filter, less is not.
    """
    with_marks = [b for b in batches if b.watermark is not None]
    if not with_marks:
        return None
    derived = delay_ms is None
    if delay_ms is None:
        delay_ms = derive_delay_ms(batches)
        if delay_ms is None:
            # A lower guess would rewind too far and emit windows twice: ask, never guess.
            raise StatefulRestartRefused(
                f"pipeline {pipeline!r}: the watermark delay cannot be read back from the recorded batches "
                f"(its watermark never moved); pass watermark_delay (--watermark-delay), the withWatermark "
                f"delay of the query", pipeline, option="watermark_delay")
    ordered = sorted(batches, key=lambda b: b.batch_id)
    w_ms = next_watermark_ms(ordered, delay_ms)
    floor_ms = window.earliest_open_start_ms(w_ms)
    if floor_at_least is not None:
        floor_ms = max(floor_ms, to_ms(floor_at_least))
    offsets: dict[TopicPartition, int] = dict(positions)
    first = next((b for b in ordered if b.event_time_max is not None and to_ms(b.event_time_max) >= floor_ms), None)
    if offsets_for_floor is None:
        first = _provable_first(ordered, first, pipeline)
    reread_batches = 0
    if offsets_for_floor is not None:
        for tp, offset in offsets_for_floor.items():
            if tp in offsets and offset is not None:
                offsets[tp] = min(offsets[tp], offset)
    elif first is not None:
        later = [b for b in ordered if b.batch_id >= first.batch_id]
        reread_batches = len(later)
        for b in reversed(later):  # the earliest batch that read a partition wins
            for tp, (since, _until) in b.ranges.items():
                start = EARLIEST if since is None else since
                if tp in offsets and start != EARLIEST:
                    offsets[tp] = min(offsets[tp], start)
                else:
                    offsets[tp] = start
    records = sum(positions[tp] - o for tp, o in offsets.items() if tp in positions and o >= 0)
    return StateRewind(from_ms(w_ms), from_ms(floor_ms), delay_ms, derived, window, offsets,
                       first.batch_id if first is not None and offsets_for_floor is None else None,
                       ordered[-1].batch_id, reread_batches, records)


def _provable_first(ordered: Sequence[BatchFigures], first: BatchFigures | None, pipeline: str) -> BatchFigures | None:
    """The earliest batch the rewind must re-read, extended over batches of unknown event time.

    Walks back from ``first`` (or from the newest batch when none reached the floor) to a batch
    known to hold only earlier records; refuses when a batch id is missing on the way or the
    history ends before such a batch without starting at batch 0.
    """
    index = len(ordered) if first is None else ordered.index(first)
    chosen = first
    i = index - 1
    expected = ordered[index].batch_id - 1 if index < len(ordered) else None
    while i >= 0:
        b = ordered[i]
        if expected is not None and b.batch_id != expected:
            raise StatefulRestartRefused(
                f"pipeline {pipeline!r}: the ledger lacks batch(es) {b.batch_id + 1}-{expected} of the checkpoint "
                f"the windowed restart rewinds, so it cannot tell where the open windows' records begin; restore "
                f"them (restart on the old checkpoint once, so they are reconciled) or restart without window=",
                pipeline, missing_batches=[b.batch_id + 1, expected])
        if b.event_time_known or not b.read_records:
            if b.event_time_known:
                return chosen  # known to end below the floor: nothing earlier is needed
        else:
            chosen = b  # records of unknown event time: re-read them too
        expected = b.batch_id - 1
        i -= 1
    start = ordered[0].batch_id if ordered else 0
    if chosen is not None and start > 0:
        raise StatefulRestartRefused(
            f"pipeline {pipeline!r}: the windowed restart would re-read from batch {chosen.batch_id}, the oldest the "
            f"ledger holds of its checkpoint, but batches 0-{start - 1} are not in the ledger (pruned, or recorded "
            f"before the listener was added): records of the open windows may lie in them. Restart without window=, "
            f"or with event_time_is_kafka_timestamp=True when the event time is the Kafka timestamp",
            pipeline, missing_batches=[0, start - 1])
    return chosen
