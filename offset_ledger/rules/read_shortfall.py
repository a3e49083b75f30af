"""Pure: a batch that read fewer rows than its ranges span skipped records (issue 41).

Spark's Kafka source with ``failOnDataLoss=false`` jumps over offsets that retention deleted before
it fetched them, but the batch's range stays the *planned* one, so the recorded ranges still tile.
What tells the skip is the row count: on a topic that neither compacts nor carries transaction
markers every offset in ``[from_offset, until_offset)`` (``until`` exclusive) is one record, so the
rows a Kafka source read (Spark's ``numInputRows`` per source) equal the offsets it spanned. Fewer
rows: records the job never saw. ``verify`` later decides whether the topic explains them
(compaction, transaction markers: ``offset_ledger.operate.verify_loss``); here only the arithmetic.

Rows are trusted only where Spark counted them: a batch read back from a checkpoint or recorded by a
transactional sink (``recorded_by`` set) carries the offsets spanned as its rows, so it never has a
shortfall. Each Kafka source is judged on its own count (issue 47): a query that also reads a
non-Kafka source (``rate``, a file source, joined or unioned in) has that source's rows in the batch
total, so the total is never compared with a Kafka source's span while such a source is there. Where
Spark reported no count for a Kafka source (``numInputRows`` absent, which is not 0: an older or
partial report), the rest of the batch total is that source's count when every other source was
counted and none is a non-Kafka one; otherwise its count is *unknown*: a ``rows_unknown`` shortfall
(``rows`` None) that ``verify`` shows as an ``unknown`` stretch, never as fine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offset_ledger.rules.model import BatchOffsets, PartitionRange

#: ``details.kind`` of the ``data_loss`` finding a shortfall is recorded as.
READ_SHORTFALL = "read_shortfall"
#: ``details.kind`` of the ``data_loss`` finding of a Kafka source whose rows nobody counted: it may
#: have lost records or not; ``verify`` shows its ranges as ``unknown`` stretches.
ROWS_UNKNOWN = "rows_unknown"


@dataclass(frozen=True)
class Shortfall:
    """One source of one batch (``source_index`` None: several sources together) read ``rows`` of
    ``spanned`` offsets; ``rows`` None: how many it read is unknown."""

    source_index: int | None
    ranges: tuple[PartitionRange, ...]  # every range of the source with a start (from_offset set)
    spanned: int
    rows: int | None

    @property
    def unknown(self) -> bool:
        return self.rows is None

    @property
    def missing(self) -> int | None:
        return None if self.rows is None else self.spanned - self.rows

    @property
    def partition_range(self) -> PartitionRange | None:
        """The one range that spans offsets, when there is one: the shortfall is then exactly that partition's."""
        spanning = [r for r in self.ranges if r.from_offset is not None and r.until_offset > r.from_offset]
        return spanning[0] if len(spanning) == 1 else None

    def details(self) -> dict[str, Any]:
        """The finding's ``details`` (JSON)."""
        return {"kind": ROWS_UNKNOWN if self.unknown else READ_SHORTFALL, "source_index": self.source_index,
                "rows_read": self.rows, "offsets_spanned": self.spanned, "missing": self.missing,
                "per_partition": self.partition_range is not None,
                "ranges": [[r.topic, r.partition, r.from_offset, r.until_offset] for r in self.ranges]}

    def message(self, batch_id: int) -> str:
        where = ", ".join(f"{r.topic}-{r.partition} [{r.from_offset}, {r.until_offset})" for r in self.ranges
                          if r.from_offset is not None and r.until_offset > r.from_offset)
        whose = "" if self.source_index is None else f"source {self.source_index} of "
        if self.rows is None:
            return (f"{whose}batch {batch_id} spans {self.spanned:,} offsets ({where}) but Spark reported no row "
                    f"count for it, and the batch total holds another source's rows: whether records were "
                    f"skipped is unknown")
        return (f"{whose}batch {batch_id} read {self.rows:,} rows of {self.spanned:,} offsets ({where}): "
                f"{self.spanned - self.rows:,} records not read (deleted before they were fetched, unless "
                f"compaction or transaction markers explain them)")


def _span(ranges: tuple[PartitionRange, ...]) -> int:
    return sum(r.until_offset - r.from_offset for r in ranges if r.from_offset is not None)


def read_shortfalls(batch: BatchOffsets) -> list[Shortfall]:
    """The batch's shortfalls (unknown counts included); empty when every Kafka source read every
    offset it spanned, or the rows were not counted by Spark at all (``recorded_by``)."""
    if batch.recorded_by is not None or not batch.sources:
        return []  # rows not counted by Spark (the offsets spanned stand in for them)
    if any(r.from_offset is None for s in batch.sources for r in s.ranges):
        return []  # a span not known: nothing to compare the rows with
    out = []
    uncounted = []
    for s in batch.sources:
        if not s.rows_reported:
            uncounted.append(s)
            continue
        spanned = _span(s.ranges)
        if s.input_rows < spanned:
            out.append(Shortfall(s.source_index, s.ranges, spanned, s.input_rows))
    spanned = sum(_span(s.ranges) for s in uncounted)
    if spanned > 0:
        ranges = tuple(r for s in uncounted for r in s.ranges)
        index = uncounted[0].source_index if len(uncounted) == 1 else None
        if batch.non_kafka_sources:
            # The total holds a non-Kafka source's rows: no count of these sources can be had from it.
            out.append(Shortfall(index, ranges, spanned, None))
        else:
            # Kafka sources only: the total less the counted ones is what the uncounted ones read.
            rows = batch.input_rows - sum(s.input_rows for s in batch.sources if s.rows_reported)
            if rows < spanned:
                out.append(Shortfall(index, ranges, spanned, max(rows, 0)))
    return out
