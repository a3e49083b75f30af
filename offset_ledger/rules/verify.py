"""Has this pipeline read every record exactly once, ever? The pure rule (no I/O).

Per topic-partition the ranges batches read (``[from_offset, until_offset)``: ``from`` is the first
offset read, ``until`` the next one, exclusive) must tile the log from the first recorded start to
the pipeline's current position: every offset read once, none skipped, none read twice. Where that
fails, the stretch is *explained* when something in the ledger says why:

- an ``Explanation`` with effect ``"skip"`` accounts for a gap, one with effect ``"reread"`` for one
  extra read of each offset it covers (a reset moved the position forward or back; a restart clamped
  to log-start after retention; a stateful restart rewound; a checkpoint import placed positions);
- a range row whose ``extra_read`` names a finding (a zombie, a run on a foreign checkpoint, a batch
  that ended behind a pending reset) accounts for the extra read it causes itself.

A read is *coverage* when its output landed. A flagged run's batch (its ``extra_read`` finding says its
reads are not the pipeline's own) that the pipeline's transactional sink refused (``SinkFenced``: no
sink committed it) wrote nothing: its row opens the history where it starts, as any read does, but
covers no offset, so what only it read is the gap it is (``Reason.landed`` False; the row source
decides from the sink's committed batches). A flagged batch a sink did commit (a zombie's late commit
the restart moved past) landed and counts.

A range whose start is unknown (Spark reported none and nothing recorded where it began) is swept
as if it continued the history, but the offsets from the previous known end to its end are an
``unknown`` stretch, never explained: whether they were read once, skipped or read twice nobody can
say, so the history is not verified there. A partition's first range with an unknown start opens its
history at its end (no previous end: nothing is claimed before it).

Beyond the current position (``positions``) nothing should have been read yet (the pipeline reads
it next): a range there is an overlap to come, explained only like any other (a pending reset
moving the position back explains it).

Topic identity: offsets are compared only within one incarnation of a topic (a re-created topic
starts again at 0 under a new Kafka topic id). The caller numbers incarnations; rows,
explanations and positions carry the number; each incarnation is swept on its own.

The input is a stream ordered by ``(topic, partition, sort_key)`` (``sort_key``: from_offset, or
until_offset for a range whose start was not reported, then until_offset); the sweep keeps only the
ranges that are open at the current offset, so memory does not grow with the history.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Effect = Literal["skip", "reread"]
StretchKind = Literal["gap", "overlap", "loss", "unknown"]

#: How many batches an overlap lists (the stretch says how many read it; the rest are elided).
MAX_BATCHES = 8


@dataclass(frozen=True)
class Reason:
    """Why a stretch is accounted for: a reset (``kind="reset"``) or a finding (its kind), with its id."""

    kind: str
    id: int | None
    detail: str = ""
    #: On a range row's ``extra_read``: False when the batch's output never landed (``NOT_COVERAGE``).
    landed: bool = True

    def key(self) -> tuple[str, int, str]:
        return (self.kind, -1 if self.id is None else self.id, self.detail)

    def label(self) -> str:
        head = f"{self.kind} {self.id}" if self.id is not None else self.kind
        return f"{head} ({self.detail})" if self.detail else head


class RangeRow(NamedTuple):
    """One recorded range of one batch on one partition (a ``batch_offsets`` row)."""

    topic: str
    partition: int
    from_offset: int | None  # None: Spark reported no start and nothing recorded where it began
    until_offset: int
    query_id: str
    batch_id: int
    incarnation: int = 0
    extra_read: Reason | None = None  # a finding that accounts for this batch reading records again


def sort_key(row: RangeRow) -> tuple[str, int, int, int]:
    """The order ``verify_ranges`` needs: topic, partition, start (until when unknown), end."""
    start = row.from_offset if row.from_offset is not None else row.until_offset
    return (row.topic, row.partition, start, row.until_offset)


@dataclass(frozen=True)
class Explanation:
    """A stretch of one partition that something in the ledger says was skipped or read again."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int
    effect: Effect
    reason: Reason
    incarnation: int = 0


@dataclass(frozen=True)
class BatchRef:
    """A batch bordering or reading a stretch."""

    query_id: str
    batch_id: int


@dataclass
class Stretch:
    """Offsets ``[from_offset, until_offset)`` of a partition read ``times`` times too few (gap) or too often
    (overlap), or (unknown) ended by a range whose start nobody knows: ``batches`` names that range."""

    topic: str
    partition: int
    incarnation: int
    from_offset: int
    until_offset: int
    kind: StretchKind
    times: int
    explained: bool
    reasons: tuple[Reason, ...]
    before: BatchRef | None = None  # gap: the batch that ended where it begins
    after: BatchRef | None = None   # gap: the batch that starts where it ends (None: the current position)
    batches: tuple[BatchRef, ...] = ()  # overlap: batches that read it (at most MAX_BATCHES)
    beyond_position: bool = False   # overlap at or after the current position: records to be read again
    #: loss: records of the batch's range it never read (``rules.read_shortfall``); the stretch is that range
    lost: int = 0

    @property
    def records(self) -> int:
        return self.lost if self.kind == "loss" else self.until_offset - self.from_offset


@dataclass
class PartitionResult:
    """What the sweep found on one incarnation of one partition."""

    topic: str
    partition: int
    incarnation: int
    first_offset: int | None  # where the recorded history starts
    end_offset: int | None    # the furthest offset read (exclusive)
    position: int | None      # the current position (or where an ended incarnation stood)
    ranges: int
    unknown_starts: int       # ranges whose start was not reported (an ``unknown`` stretch past a known end)
    stretches: list[Stretch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.explained for s in self.stretches)


def verify_ranges(
    rows: Iterable[RangeRow],
    explanations: Iterable[Explanation] = (),
    positions: Mapping[tuple[str, int, int], int] | None = None,
) -> Iterator[PartitionResult]:
    """Sweep ordered range rows; yield one result per (topic, partition, incarnation) that has rows.

    ``positions`` maps (topic, partition, incarnation) to the next offset: the current position of
    the latest incarnation, and where an earlier one stood when it ended (a re-created topic's
    restart records it). Without one, the history is expected to end where reading ended. Raises
    ValueError when rows are not in ``sort_key`` order.
    """
    by_tp: dict[tuple[str, int], list[Explanation]] = {}
    for e in explanations:
        if e.until_offset > e.from_offset:
            by_tp.setdefault((e.topic, e.partition), []).append(e)
    for found in by_tp.values():
        found.sort(key=lambda e: (e.incarnation, e.from_offset, e.until_offset))
    where = positions or {}
    tp: tuple[str, int] | None = None
    sweeps: dict[int, _Sweep] = {}
    for row in rows:
        key = (row[0], row[1])
        if key != tp:
            if tp is not None:
                if key < tp:
                    raise ValueError(f"range rows out of order: {key} after {tp}")
                yield from _finish(sweeps)
            tp, sweeps = key, {}
        inc = row[6]
        sweep = sweeps.get(inc)
        if sweep is None:
            sweep = sweeps[inc] = _Sweep(key[0], key[1], inc,
                                         [e for e in by_tp.get(key, ()) if e.incarnation == inc],
                                         where.get((key[0], key[1], inc)))
        sweep.add(row)
    if tp is not None:
        yield from _finish(sweeps)


def _finish(sweeps: Mapping[int, _Sweep]) -> Iterator[PartitionResult]:
    for inc in sorted(sweeps):
        yield sweeps[inc].finish()


class _Sweep:
    """The sweep over one incarnation of one partition: ranges open at ``cur`` in a heap by end."""

    __slots__ = ("topic", "partition", "inc", "exps", "exp_i", "active_exps", "position", "cur", "hi",
                 "hi_row", "heap", "seq", "first", "count", "unknown", "stretches", "open", "unknowns")

    def __init__(self, topic: str, partition: int, inc: int, exps: list[Explanation], position: int | None) -> None:
        self.topic, self.partition, self.inc = topic, partition, inc
        self.exps = exps
        self.exp_i = 0
        self.active_exps: list[tuple[int, int, Explanation]] = []
        self.position = position
        self.cur: int | None = None   # everything before it is classified
        self.hi: int | None = None    # the furthest end read so far
        self.hi_row: RangeRow | None = None
        self.heap: list[tuple[int, int, RangeRow]] = []  # (until, seq, row) of ranges open at cur
        self.seq = 0
        self.first: int | None = None
        self.count = 0
        self.unknown = 0
        self.stretches: list[Stretch] = []
        self.open: Stretch | None = None
        self.unknowns: list[Stretch] = []  # kept apart: they never merge with gaps or overlaps

    def add(self, row: RangeRow) -> None:
        self.count += 1
        flag = row[7]
        if flag is not None and not flag.landed:
            self._not_coverage(row)
            return
        f, u = row[2], row[3]
        if f is None:
            # No start reported: swept as continuing where the history stands, but what lies between
            # the previous known end and this end is unknown, not "read once".
            self.unknown += 1
            f = u if self.hi is None else max(min(self.hi, u), self.cur if self.cur is not None else u)
            if self.hi is not None and u > f:
                before = self.hi_row
                self.unknowns.append(Stretch(self.topic, self.partition, self.inc, f, u, "unknown", 1, False, (),
                                             before=_ref(before) if before is not None else None,
                                             batches=(_ref(row),)))
        if self.cur is None:
            self.cur = self.first = f
        elif f < self.cur:
            raise ValueError(f"range rows of {self.topic}-{self.partition} out of order: {f} after {self.cur}")
        heap = self.heap
        # Fast path: the range starts exactly where the single open one ends, below the position.
        if (len(heap) == 1 and f == self.hi and heap[0][0] == f and u > f
                and (self.position is None or f <= self.position)):
            if self.open is not None:
                self._close()
            self.seq += 1
            heap[0] = (u, self.seq, row)
            self.cur = f
            self.hi, self.hi_row = u, row
            return
        if f > self.cur:
            self._advance(f, row)
        if u > f:
            self.seq += 1
            heapq.heappush(heap, (u, self.seq, row))
            if self.hi is None or u > self.hi:
                self.hi, self.hi_row = u, row
        elif self.hi is None:
            self.hi, self.hi_row = f, row

    def _not_coverage(self, row: RangeRow) -> None:
        """A read whose output never landed: the history is open from its start, nothing of it is covered."""
        f = row[2]
        if f is None:
            return  # where it began nobody knows; it covers nothing anyway
        if self.cur is None:
            self.cur = self.first = f
        elif f < self.cur:
            raise ValueError(f"range rows of {self.topic}-{self.partition} out of order: {f} after {self.cur}")
        elif f > self.cur:
            self._advance(f, row)

    def finish(self) -> PartitionResult:
        end = self.hi if self.hi is not None else self.cur  # only reads that never landed: none ended
        if end is not None and self.cur is not None:
            target = end if self.position is None else max(end, self.position)
            if target > self.cur:
                self._advance(target, None)
        if self.open is not None:
            self._close()
        if self.unknowns:
            self.stretches = sorted(self.stretches + self.unknowns, key=lambda s: (s.from_offset, s.kind == "unknown"))
        return PartitionResult(self.topic, self.partition, self.inc, self.first, self.hi, self.position,
                               self.count, self.unknown, self.stretches)

    def _advance(self, target: int, after: RangeRow | None) -> None:
        """Classify ``[cur, target)`` piece by piece (pieces end where a range, an explanation or the position does)."""
        heap, exps, active = self.heap, self.exps, self.active_exps
        cur = self.cur
        assert cur is not None
        position = self.position
        while cur < target:
            while heap and heap[0][0] <= cur:
                heapq.heappop(heap)
            while self.exp_i < len(exps) and exps[self.exp_i].from_offset <= cur:
                e = exps[self.exp_i]
                self.exp_i += 1
                if e.until_offset > cur:
                    self.seq += 1
                    heapq.heappush(active, (e.until_offset, self.seq, e))
            while active and active[0][0] <= cur:
                heapq.heappop(active)
            nxt = target
            if heap and heap[0][0] < nxt:
                nxt = heap[0][0]
            if self.exp_i < len(exps) and exps[self.exp_i].from_offset < nxt:
                nxt = exps[self.exp_i].from_offset
            if active and active[0][0] < nxt:
                nxt = active[0][0]
            if position is not None and cur < position < nxt:
                nxt = position
            expected = 1 if position is None or cur < position else 0
            self._classify(cur, nxt, len(heap) - expected, after, position is not None and cur >= position)
            cur = nxt
        self.cur = cur

    def _classify(self, a: int, b: int, extra: int, after: RangeRow | None, beyond: bool) -> None:
        if extra == 0:
            if self.open is not None:
                self._close()
            return
        if extra < 0:
            reasons = sorted({e.reason for _, _, e in self.active_exps if e.effect == "skip"}, key=Reason.key)
            explained = bool(reasons)
            before = self.hi_row
            stretch = Stretch(self.topic, self.partition, self.inc, a, b, "gap", -extra, explained, tuple(reasons),
                              before=_ref(before) if before is not None and before[3] <= a else None,
                              after=_ref(after) if after is not None else None)
        else:
            own = [r[7] for _, _, r in self.heap if r[7] is not None]
            rereads = [e.reason for _, _, e in self.active_exps if e.effect == "reread"]
            explained = len(own) + len(rereads) >= extra
            reasons = sorted(set(own) | set(rereads), key=Reason.key)
            batches = sorted({_ref(r) for _, _, r in self.heap}, key=lambda x: (x.query_id, x.batch_id))
            stretch = Stretch(self.topic, self.partition, self.inc, a, b, "overlap", extra, explained,
                              tuple(reasons), batches=tuple(batches[:MAX_BATCHES]), beyond_position=beyond)
        o = self.open
        if (o is not None and o.until_offset == a and o.kind == stretch.kind and o.times == stretch.times
                and o.explained == stretch.explained and o.reasons == stretch.reasons
                and o.beyond_position == stretch.beyond_position):
            o.until_offset = b
            if stretch.kind == "gap":
                o.after = stretch.after
            else:
                merged = sorted(set(o.batches) | set(stretch.batches), key=lambda x: (x.query_id, x.batch_id))
                o.batches = tuple(merged[:MAX_BATCHES])
            return
        if o is not None:
            self._close()
        self.open = stretch

    def _close(self) -> None:
        assert self.open is not None
        self.stretches.append(self.open)
        self.open = None


def _ref(row: RangeRow) -> BatchRef:
    return BatchRef(row[4], row[5])


# -- what the ledger's resets and findings explain (pure rules over plain records) -----------------


def reset_explanations(reset_id: int, actor: str, reason: str | None, mode: str,
                       partitions: Iterable[tuple[str, int, int | None, int]],
                       incarnation_of: Mapping[tuple[str, int], int] | None = None) -> list[Explanation]:
    """An executed reset moved each partition from ``before`` to ``after``: forward skips ``[before, after)``,
    back re-reads ``[after, before)``. A partition without a position before (``before`` None) explains nothing."""
    why = f"{mode} by {actor}" + (f": {reason}" if reason else "")
    out = []
    for topic, partition, before, after in partitions:
        if before is None or before == after:
            continue
        inc = (incarnation_of or {}).get((topic, partition), 0)
        r = Reason("reset", reset_id, why)
        if after > before:
            out.append(Explanation(topic, partition, before, after, "skip", r, inc))
        else:
            out.append(Explanation(topic, partition, after, before, "reread", r, inc))
    return out


def move_explanation(topic: str, partition: int, before: int | None, after: int, reason: Reason,
                     incarnation: int = 0) -> Explanation | None:
    """A position a restart moved from ``before`` to ``after`` (clamp, rewind, import): skip or re-read."""
    if before is None or before == after:
        return None
    if after > before:
        return Explanation(topic, partition, before, after, "skip", reason, incarnation)
    return Explanation(topic, partition, after, before, "reread", reason, incarnation)


#: Findings that say the reads of one run (on one partition, or all of them) are extra reads:
#: a zombie or stale instance, a run on another checkpoint, a run that ignored a pending reset.
RUN_FINDINGS = frozenset({"foreign_run", "regression", "pending_reset", "shared_position", "reset_overtaken"})
#: data_loss kinds (``details.kind``) that end a topic's incarnation: its offsets start again.
NEW_INCARNATION = frozenset({"topic_recreated", "above_log_end"})


def summarize(results: Sequence[PartitionResult]) -> dict[str, int]:
    """Counts for the report's summary line."""
    stretches = [s for r in results for s in r.stretches]
    return {
        "partitions": len(results), "ranges": sum(r.ranges for r in results),
        "unexplained": sum(1 for s in stretches if not s.explained),
        "explained": sum(1 for s in stretches if s.explained),
        "unexplainedGaps": sum(1 for s in stretches if not s.explained and s.kind == "gap"),
        "unexplainedOverlaps": sum(1 for s in stretches if not s.explained and s.kind == "overlap"),
        "unexplainedLosses": sum(1 for s in stretches if not s.explained and s.kind == "loss"),
        "recordsLost": sum(s.lost for s in stretches if not s.explained and s.kind == "loss"),
        "unknown": sum(1 for s in stretches if s.kind == "unknown"),
    }
